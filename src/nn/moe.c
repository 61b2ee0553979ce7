/* moe.c — see moe.h: the mixture-of-experts layer's math, in the pieces a model calls through
 * shard_moe_forward / shard_moe_backward: the router (logits, softmax, top-k, gates, random routing,
 * capacity by position), its losses (aux, z) and their gradients, the gather of rows for the experts /
 * scatter of their results back (one pair of calls on the expert exchange), the experts' MLPs, and the
 * gate-weighted combine.
 *
 * The tokens travel through the expert exchange (expert.h: route create / dispatch / combine, one
 * all_to_allv each way over the expert axis; on one rank a stable regrouping by expert), so the
 * layer computes only the experts this rank holds.  Over a tensor axis the experts' rows are the same
 * on every tensor rank, so one all_reduce of them over `tensor` makes the row-parallel c_proj's output
 * (and, backward, the column-parallel c_fc's input gradient) whole. */
#include "shard/moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vec.h"
#include "shard/blas.h"
#include "shard/expert.h"
#include "shard/layers.h"
#include "shard/memory.h"
#include "shard/tp.h"

/* ---------------------------------------------------------------- the layer */

enum { CHOICE_DROPPED = 0, CHOICE_KEPT = 1, CHOICE_UNROUTED = 2 }; /* capacity; kept; random routing */

struct shard_moe {
    shard_moe_options o;
    size_t E, K, C, F, cap_tokens;
    /* the forward's routing, kept for the backward */
    size_t N, rows, T, n;
    const float *x;
    shard_moe_keys keys;
    double row_den;
    float *xr;             /* [N, C] the router's input (x with jitter), or NULL: x itself */
    float *logits, *probs; /* [N, E]; logits become d(logits) in the backward */
    double *lse;           /* [N] logsumexp of each token's logits */
    int32_t *choice;       /* [N, K] the top-k experts */
    float *gate;           /* [N, K] their gates */
    unsigned char *state;  /* [N, K] CHOICE_* */
    float *frac;           /* [rows, E] f_e of each row */
    int32_t *a_expert;     /* [n] the kept assignments' experts, token-major */
    size_t *a_slot;        /* [n] their token * K + choice */
    float *xa, *ya;        /* [n, C] gathered inputs / combined outputs, in assignment order */
    shard_expert_route *route;
    size_t total, total_cap;      /* rows the held experts received; the buffers' size */
    float *xe, *slope, *hid, *ye; /* [total, C], [total, F] x2, [total, C] */
    float *dh, *dxe;              /* the backward's scratch, [total, F] and [total, C] */
    float *dgate;                 /* [N, K] the gates' gradient */
    double *dp, *load;            /* [E] a token's d(probs); assignments per expert */
    size_t *taken;                /* [E] a row's assignments admitted per expert */
    double aux, z, assigned, dropped;
};

size_t shard_moe_capacity(float factor, size_t T, size_t top_k, size_t experts) {
    if (!(factor > 0)) return SIZE_MAX;
    return (size_t)ceil((double)factor * (double)T * (double)top_k / (double)experts);
}

/* A uniform draw in [0, 1) at (seed, index): the counters of the dropout masks (vec.h). */
static double uniform_at(uint64_t seed, uint64_t index) {
    return (double)(shard__dropout_mix(seed * 0x9e3779b97f4a7c15ULL + index + 1) >> 11) * 0x1.0p-53;
}

void shard_moe_destroy(shard_moe *m) {
    if (!m) return;
    shard_expert_route_destroy(m->route);
    float *f[] = {m->xr, m->logits, m->probs, m->gate, m->frac, m->xa,  m->ya,
                  m->xe, m->slope,  m->hid,   m->ye,   m->dh,   m->dxe, m->dgate};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) shard_free(f[i]);
    free(m->lse), free(m->choice), free(m->state), free(m->a_expert), free(m->a_slot), free(m->dp), free(m->load),
        free(m->taken);
    free(m);
}

static float *acts(size_t floats) { return shard_alloc((floats ? floats : 1) * sizeof(float), SHARD_MEM_ACTIVATIONS); }

shard_status shard_moe_create(const shard_moe_options *o, shard_moe **out) {
    *out = NULL;
    if (!o || o->struct_size < sizeof *o)
        return shard_error(SHARD_ERR_INVALID_ARG, "moe: options of an older layout (struct_size %zu, need %zu)",
                           o ? o->struct_size : 0, sizeof *o);
    if (!o->experts || !o->top_k || o->top_k > o->experts || !o->width || !o->hidden || !o->max_tokens)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "moe: %zu experts, top-%zu, width %zu, hidden %zu, %zu tokens: every size must be "
                           "positive and top-k at most the experts",
                           o->experts, o->top_k, o->width, o->hidden, o->max_tokens);
    size_t first = o->first_expert, held = o->held_experts ? o->held_experts : o->experts, want_first, want_held;
    int ranks = o->comm ? shard_comm_size(o->comm) : 1, rank = o->comm ? shard_comm_rank(o->comm) : 0;
    shard_expert_range(o->experts, ranks, rank, &want_first, &want_held);
    if (first != want_first || held != want_held)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "moe: experts %zu..%zu of %zu held, but rank %d of an expert axis of %d holds "
                           "%zu..%zu (shard_expert_range)",
                           first, first + held, o->experts, rank, ranks, want_first, want_first + want_held);
    shard_moe *m = calloc(1, sizeof *m);
    if (!m) return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory");
    m->o = *o, m->o.held_experts = held;
    m->E = o->experts, m->K = o->top_k, m->C = o->width, m->F = o->hidden;
    size_t N = o->max_tokens, E = m->E, K = m->K, C = m->C;
    m->logits = acts(N * E), m->probs = acts(N * E), m->gate = acts(N * K), m->frac = acts(N * E);
    m->xa = acts(N * K * C), m->ya = acts(N * K * C), m->dgate = acts(N * K);
    if (o->jitter > 0) m->xr = acts(N * C);
    m->lse = malloc(N * sizeof *m->lse), m->choice = malloc(N * K * sizeof *m->choice);
    m->state = malloc(N * K), m->a_expert = malloc(N * K * sizeof *m->a_expert);
    m->a_slot = malloc(N * K * sizeof *m->a_slot), m->load = calloc(E, sizeof *m->load);
    m->dp = malloc(E * sizeof *m->dp), m->taken = malloc(E * sizeof *m->taken);
    if (!m->logits || !m->probs || !m->gate || !m->frac || !m->xa || !m->ya || !m->dgate || !m->dp || !m->taken ||
        (o->jitter > 0 && !m->xr) || !m->lse || !m->choice || !m->state || !m->a_expert || !m->a_slot || !m->load) {
        shard_moe_destroy(m);
        return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for %zu tokens", N);
    }
    *out = m;
    return SHARD_OK;
}

void shard_moe_stats_reset(shard_moe *m) {
    m->aux = m->z = m->assigned = m->dropped = 0;
    memset(m->load, 0, m->E * sizeof *m->load);
}

void shard_moe_stats_read(const shard_moe *m, shard_moe_stats *out) {
    *out = (shard_moe_stats){.aux = m->aux, .z = m->z, .assigned = m->assigned, .dropped = m->dropped, .load = m->load};
}

/* ---- the router ---- */

/* Token t's jitter on input element c: uniform in [1 - eps, 1 + eps], keyed by its global position. */
static float jitter_at(const shard_moe *m, size_t t, size_t c) {
    uint64_t token = (uint64_t)(m->keys.first_row + t / m->T) * m->T + t % m->T;
    return 1.0f - m->o.jitter + 2.0f * m->o.jitter * (float)uniform_at(m->keys.jitter_seed, token * m->C + c);
}

/* Logits, probabilities and logsumexp of every token; the top-k choices (ties: the lower index) and gates. */
static shard_status router_forward(shard_moe *m, const float *gate_w) {
    size_t N = m->N, E = m->E, K = m->K, C = m->C;
    const float *xr = m->x;
    if (m->xr && m->keys.training) {
        for (size_t t = 0; t < N; t++)
            for (size_t c = 0; c < C; c++) m->xr[t * C + c] = m->x[t * C + c] * jitter_at(m, t, c);
        xr = m->xr;
    }
    SHARD_CHECK(shard_sgemm(0, 1, N, E, C, 1.0f, xr, C, gate_w, C, 0.0f, m->logits, E));
    shard_softmax_forward(m->logits, m->probs, N, E);
    for (size_t t = 0; t < N; t++) {
        const float *l = m->logits + t * E, *p = m->probs + t * E;
        float mx = l[0];
        for (size_t e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double s = 0;
        for (size_t e = 0; e < E; e++) s += exp((double)l[e] - (double)mx);
        m->lse[t] = (double)mx + log(s);
        int32_t *ch = m->choice + t * K;
        float *g = m->gate + t * K, sum = 0;
        for (size_t j = 0; j < K; j++) {
            int32_t best = -1;
            for (size_t e = 0; e < E; e++) {
                int taken = 0;
                for (size_t i = 0; i < j; i++) taken |= ch[i] == (int32_t)e;
                if (!taken && (best < 0 || p[e] > p[best])) best = (int32_t)e;
            }
            ch[j] = best, g[j] = p[best], sum += p[best];
        }
        if (K > 1 && m->o.norm_topk_prob)
            for (size_t j = 0; j < K; j++) g[j] /= sum;
    }
    return SHARD_OK;
}

/* Which choices are kept: random routing of the second (training), then each row's capacity per expert
 * in position order; the row's f_e, and the losses and counts. */
static void router_assign(shard_moe *m) {
    size_t E = m->E, K = m->K, T = m->T, cap = shard_moe_capacity(m->o.capacity_factor, T, K, E);
    size_t *taken = m->taken;
    m->n = 0;
    for (size_t r = 0; r < m->rows; r++) {
        memset(taken, 0, E * sizeof *taken);
        float *f = m->frac + r * E;
        memset(f, 0, E * sizeof *f);
        double aux = 0, z = 0;
        for (size_t pos = 0; pos < T; pos++) {
            size_t t = r * T + pos;
            for (size_t j = 0; j < K; j++) {
                size_t slot = t * K + j;
                int32_t e = m->choice[slot];
                f[e] += 1.0f;
                unsigned char st = CHOICE_KEPT;
                if (j == 1 && m->o.random_routing && m->keys.training) {
                    uint64_t token = (uint64_t)(m->keys.first_row + r) * T + pos;
                    if (!(uniform_at(m->keys.routing_seed, token) < 2.0 * (double)m->gate[slot])) st = CHOICE_UNROUTED;
                }
                if (st == CHOICE_KEPT) {
                    m->assigned += 1, m->load[e] += 1;
                    if (taken[e] >= cap)
                        st = CHOICE_DROPPED, m->dropped += 1;
                    else
                        taken[e]++;
                }
                m->state[slot] = st;
                if (st == CHOICE_KEPT) m->a_expert[m->n] = e, m->a_slot[m->n] = slot, m->n++;
            }
            z += m->lse[t] * m->lse[t];
        }
        for (size_t e = 0; e < E; e++) {
            double P = 0;
            for (size_t pos = 0; pos < T; pos++) P += m->probs[(r * T + pos) * E + e];
            f[e] /= (float)(T * K);
            aux += (double)f[e] * (P / (double)T);
        }
        m->aux += (double)E * aux / m->row_den, m->z += z / (double)T / m->row_den;
    }
}

/* d(logits) (over m->logits) from the gates' gradient dgate[N, K] and the losses' terms. */
static void router_backward(shard_moe *m, const float *dgate) {
    size_t E = m->E, K = m->K, T = m->T;
    double aux_k = (double)m->o.aux_coef / m->row_den * (double)E / (double)T,
           z_k = (double)m->o.z_coef / m->row_den * 2.0 / (double)T;
    for (size_t t = 0; t < m->N; t++) {
        const float *p = m->probs + t * E, *f = m->frac + (t / T) * E, *g = m->gate + t * K, *dg = dgate + t * K;
        const int32_t *ch = m->choice + t * K;
        double *dpv = m->dp;
        for (size_t e = 0; e < E; e++) dpv[e] = aux_k * (double)f[e];
        if (K > 1 && m->o.norm_topk_prob) { /* g_j = p_j / S: dp_j = (dg_j - sum_i dg_i g_i) / S */
            double S = 0, dot = 0;
            for (size_t j = 0; j < K; j++) S += p[ch[j]], dot += (double)dg[j] * (double)g[j];
            for (size_t j = 0; j < K; j++) dpv[ch[j]] += ((double)dg[j] - dot) / S;
        } else {
            for (size_t j = 0; j < K; j++) dpv[ch[j]] += dg[j];
        }
        double dot = 0;
        for (size_t e = 0; e < E; e++) dot += (double)p[e] * dpv[e];
        float *dl = m->logits + t * E;
        for (size_t e = 0; e < E; e++) dl[e] = (float)((double)p[e] * (dpv[e] - dot) + z_k * m->lse[t] * (double)p[e]);
    }
}

/* ---- the experts ---- */

static shard_status grow_experts(shard_moe *m, size_t total) {
    if (total <= m->total_cap && m->xe) return SHARD_OK;
    float **bufs[] = {&m->xe, &m->ye, &m->dxe, &m->slope, &m->hid, &m->dh};
    for (size_t i = 0; i < 6; i++) {
        shard_free(*bufs[i]);
        *bufs[i] = acts(total * (i < 3 ? m->C : m->F));
        if (!*bufs[i]) return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for %zu expert rows", total);
    }
    m->total_cap = total;
    return SHARD_OK;
}

/* Rows for the experts: the kept assignments' inputs in assignment order, then the exchange. */
static shard_status gather_rows(shard_moe *m) {
    size_t C = m->C;
    for (size_t i = 0; i < m->n; i++) memcpy(m->xa + i * C, m->x + (m->a_slot[i] / m->K) * C, C * sizeof(float));
    shard_expert_route_destroy(m->route), m->route = NULL;
    SHARD_CHECK(shard_expert_route_create(m->o.comm, m->E, m->a_expert, m->n, &m->route));
    m->total = shard_expert_route_total(m->route);
    SHARD_CHECK(grow_experts(m, m->total));
    return shard_expert_dispatch(m->route, m->xa, m->xe, C);
}

/* The results back in assignment order, and y[token] += gate x result. */
static shard_status scatter_rows(shard_moe *m, float *y) {
    size_t C = m->C;
    SHARD_CHECK(shard_expert_combine(m->route, m->ye, m->ya, C));
    memset(y, 0, m->N * C * sizeof *y);
    for (size_t i = 0; i < m->n; i++) {
        float g = m->gate[m->a_slot[i]], *yt = y + (m->a_slot[i] / m->K) * C;
        const float *r = m->ya + i * C;
        for (size_t c = 0; c < C; c++) yt[c] += g * r[c];
    }
    return SHARD_OK;
}

static shard_status experts_forward(shard_moe *m, const shard_moe_weights *w) {
    size_t C = m->C, F = m->F, at = 0;
    int bias = shard_tp_rank(m->o.tensor) == 0; /* the row-parallel bias rule: added once before the sum */
    for (size_t e = 0; e < m->o.held_experts; e++) {
        size_t rows = shard_expert_route_rows(m->route, e);
        if (!rows) continue;
        SHARD_CHECK(
            shard_linear_forward(m->xe + at * C, w->fc_w + e * C * F, w->fc_b + e * F, m->slope + at * F, rows, C, F));
        shard_gelu_forward_slope(m->slope + at * F, m->hid + at * F, rows * F); /* slope: GELU' from here on */
        SHARD_CHECK(shard_linear_forward(m->hid + at * F, w->proj_w + e * F * C, bias ? w->proj_b + e * C : NULL,
                                         m->ye + at * C, rows, F, C));
        at += rows;
    }
    return shard_tp_sum(m->o.tensor, m->ye, m->total * C);
}

/* From d(ye) (in m->ye): d(xe) into m->dxe, the experts' gradients added. */
static shard_status experts_backward(shard_moe *m, const shard_moe_weights *w, const shard_moe_grads *g) {
    size_t C = m->C, F = m->F, at = 0;
    for (size_t e = 0; e < m->o.held_experts; e++) {
        size_t rows = shard_expert_route_rows(m->route, e);
        if (!rows) continue;
        SHARD_CHECK(shard_linear_backward(m->hid + at * F, w->proj_w + e * F * C, m->ye + at * C, m->dh + at * F,
                                          g->proj_w + e * F * C, g->proj_b + e * C, rows, F, C));
        shard_mul(m->dh + at * F, m->slope + at * F, m->dh + at * F, rows * F);
        SHARD_CHECK(shard_linear_backward(m->xe + at * C, w->fc_w + e * C * F, m->dh + at * F, m->dxe + at * C,
                                          g->fc_w + e * C * F, g->fc_b + e * F, rows, C, F));
        at += rows;
    }
    return shard_tp_sum(m->o.tensor, m->dxe, m->total * C);
}

/* ---- the layer ---- */

shard_status shard_moe_forward(shard_moe *m, const shard_moe_weights *w, const float *x, size_t rows, size_t T,
                               const shard_moe_keys *keys, double row_denominator, float *y) {
    size_t N = rows * T;
    if (!rows || !T || N > m->o.max_tokens || !(row_denominator > 0))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "moe forward: %zu rows x %zu tokens over %g rows; the layer was made for up to %zu "
                           "tokens and the denominator must be positive",
                           rows, T, row_denominator, m->o.max_tokens);
    m->N = N, m->rows = rows, m->T = T, m->x = x, m->row_den = row_denominator;
    m->keys = keys ? *keys : (shard_moe_keys){0};
    SHARD_CHECK(router_forward(m, w->gate));
    router_assign(m);
    SHARD_CHECK(gather_rows(m));
    SHARD_CHECK(experts_forward(m, w));
    return scatter_rows(m, y);
}

shard_status shard_moe_backward(shard_moe *m, const shard_moe_weights *w, const float *dy, float *dx,
                                const shard_moe_grads *g) {
    size_t C = m->C, E = m->E, N = m->N, K = m->K;
    if (!m->route) return shard_error(SHARD_ERR_INVALID_ARG, "moe backward: no forward before it");
    /* the combine's backward: d(gate) = dy . result; d(result) = gate x dy, back to the experts */
    float *dgate = m->dgate;
    memset(dgate, 0, N * K * sizeof *dgate);
    for (size_t i = 0; i < m->n; i++) {
        size_t slot = m->a_slot[i];
        const float *dyt = dy + (slot / K) * C, *r = m->ya + i * C;
        float gt = m->gate[slot], *d = m->xa + i * C; /* xa's rows are free now: d(result) */
        double s = 0;
        for (size_t c = 0; c < C; c++) s += (double)dyt[c] * (double)r[c], d[c] = gt * dyt[c];
        dgate[slot] = (float)s;
    }
    SHARD_CHECK(shard_expert_dispatch(m->route, m->xa, m->ye, C)); /* ye's rows become d(ye) */
    SHARD_CHECK(experts_backward(m, w, g));
    SHARD_CHECK(shard_expert_combine(m->route, m->dxe, m->ya, C)); /* ya's rows: d(input) per assignment */
    router_backward(m, dgate);
    const float *xr = m->xr && m->keys.training ? m->xr : m->x;
    SHARD_CHECK(shard_sgemm(1, 0, E, C, N, 1.0f, m->logits, E, xr, C, 1.0f, g->gate, C));
    /* the router's input gradient (through the jitter), then the experts' */
    SHARD_CHECK(shard_sgemm(0, 0, N, C, E, 1.0f, m->logits, E, w->gate, C, 0.0f, dx, C));
    if (m->xr && m->keys.training)
        for (size_t t = 0; t < N; t++)
            for (size_t c = 0; c < C; c++) dx[t * C + c] *= jitter_at(m, t, c);
    for (size_t i = 0; i < m->n; i++)
        shard_add(dx + (m->a_slot[i] / K) * C, m->ya + i * C, dx + (m->a_slot[i] / K) * C, C);
    return SHARD_OK;
}
