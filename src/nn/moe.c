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

#include "core/alloc_impl.h"
#include "kernels/vec.h"
#include "plan/expert_bound.h"
#include "shard/blas.h"
#include "shard/expert.h"
#include "shard/layers.h"
#include "shard/memory.h"
#include "shard/tp.h"

/* ---------------------------------------------------------------- the layer */

enum { CHOICE_DROPPED = 0, CHOICE_KEPT = 1, CHOICE_UNROUTED = 2 }; /* capacity; kept; random routing */

/* One forward's routing and activations, kept for its backward: a context (shard_moe_select). */
typedef struct moe_state {
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
    size_t bound_cap;             /* the analyzer's dry run: the most rows the held experts could receive */
    float *xe, *slope, *hid, *ye; /* [total, C], [total, F] x2, [total, C] */
    float *dh, *dxe;              /* the backward's scratch, [total, F] and [total, C] */
    float *dgate;                 /* [N, K] the gates' gradient */
} moe_state;

struct shard_moe {
    shard_moe_options o;
    size_t E, K, C, F;
    moe_state **ctx; /* [contexts], made at their first selection */
    size_t contexts;
    moe_state *s;      /* the selected one */
    double *dp, *load; /* [E] a token's d(probs); assignments per expert */
    size_t *taken;     /* [E] a row's assignments admitted per expert */
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

static void state_destroy(moe_state *s) {
    if (!s) return;
    shard_expert_route_destroy(s->route);
    float *f[] = {s->xr, s->logits, s->probs, s->gate, s->frac, s->xa,  s->ya,
                  s->xe, s->slope,  s->hid,   s->ye,   s->dh,   s->dxe, s->dgate};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) shard_free(f[i]);
    free(s->lse), free(s->choice), free(s->state), free(s->a_expert), free(s->a_slot);
    free(s);
}

void shard_moe_destroy(shard_moe *m) {
    if (!m) return;
    for (size_t i = 0; i < m->contexts; i++) state_destroy(m->ctx[i]);
    free(m->ctx), free(m->dp), free(m->load), free(m->taken);
    free(m);
}

static float *acts(size_t floats) { return shard_alloc((floats ? floats : 1) * sizeof(float), SHARD_MEM_ACTIVATIONS); }

/* A context's buffers for the most tokens a forward routes (the experts' rows grow with each route). */
static moe_state *state_create(const shard_moe *m) {
    moe_state *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    size_t N = m->o.max_tokens, E = m->E, K = m->K, C = m->C;
    s->logits = acts(N * E), s->probs = acts(N * E), s->gate = acts(N * K), s->frac = acts(N * E);
    s->xa = acts(N * K * C), s->ya = acts(N * K * C), s->dgate = acts(N * K);
    if (m->o.jitter > 0) s->xr = acts(N * C);
    s->lse = malloc(N * sizeof *s->lse), s->choice = malloc(N * K * sizeof *s->choice);
    s->state = malloc(N * K), s->a_expert = malloc(N * K * sizeof *s->a_expert);
    s->a_slot = malloc(N * K * sizeof *s->a_slot);
    if (!s->logits || !s->probs || !s->gate || !s->frac || !s->xa || !s->ya || !s->dgate ||
        (m->o.jitter > 0 && !s->xr) || !s->lse || !s->choice || !s->state || !s->a_expert || !s->a_slot) {
        state_destroy(s);
        return NULL;
    }
    return s;
}

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
    size_t E = m->E;
    m->load = calloc(E, sizeof *m->load), m->dp = malloc(E * sizeof *m->dp), m->taken = malloc(E * sizeof *m->taken);
    shard_status st = m->load && m->dp && m->taken ? shard_moe_select(m, 0) : SHARD_ERR_NO_MEMORY;
    if (st < 0) {
        shard_moe_destroy(m);
        return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for %zu tokens", o->max_tokens);
    }
    *out = m;
    return SHARD_OK;
}

shard_status shard_moe_select(shard_moe *m, size_t context) {
    if (context >= m->contexts) {
        moe_state **more = realloc(m->ctx, (context + 1) * sizeof *more);
        if (!more) return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for context %zu", context);
        m->ctx = more;
        for (size_t i = m->contexts; i <= context; i++) m->ctx[i] = NULL;
        m->contexts = context + 1;
    }
    if (!m->ctx[context] && !(m->ctx[context] = state_create(m)))
        return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for context %zu of %zu tokens", context,
                           m->o.max_tokens);
    m->s = m->ctx[context];
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
    const moe_state *s = m->s;
    uint64_t token = (uint64_t)(s->keys.first_row + t / s->T) * s->T + t % s->T;
    return 1.0f - m->o.jitter + 2.0f * m->o.jitter * (float)uniform_at(s->keys.jitter_seed, token * m->C + c);
}

/* Logits, probabilities and logsumexp of every token; the top-k choices (ties: the lower index) and gates. */
static shard_status router_forward(shard_moe *m, const float *gate_w) {
    moe_state *s = m->s;
    size_t N = s->N, E = m->E, K = m->K, C = m->C;
    const float *xr = s->x;
    if (s->xr && s->keys.training) {
        for (size_t t = 0; t < N; t++)
            for (size_t c = 0; c < C; c++) s->xr[t * C + c] = s->x[t * C + c] * jitter_at(m, t, c);
        xr = s->xr;
    }
    SHARD_CHECK(shard_sgemm(0, 1, N, E, C, 1.0f, xr, C, gate_w, C, 0.0f, s->logits, E));
    shard_softmax_forward(s->logits, s->probs, N, E);
    int planning = shard__mem_planning();
    for (size_t t = 0; t < N; t++) {
        const float *l = s->logits + t * E, *p = s->probs + t * E;
        float mx = l[0];
        for (size_t e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        double exps = 0;
        for (size_t e = 0; e < E; e++) exps += exp((double)l[e] - (double)mx);
        s->lse[t] = (double)mx + log(exps);
        int32_t *ch = s->choice + t * K;
        float *g = s->gate + t * K, sum = 0;
        /* the analyzer's dry run routes rows of zeros, whose logits tie: it spreads the tokens over the
         * experts in turn instead (by global position: every split spreads alike), a balanced router's
         * load, where ties would send every token to the first k experts */
        uint64_t token = (uint64_t)(s->keys.first_row + t / s->T) * s->T + t % s->T;
        for (size_t j = 0; j < K && planning; j++) {
            ch[j] = (int32_t)((token * K + j) % E), g[j] = p[ch[j]], sum += g[j];
        }
        for (size_t j = 0; j < K && !planning; j++) {
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
    moe_state *s = m->s;
    size_t E = m->E, K = m->K, T = s->T, cap = shard_moe_capacity(m->o.capacity_factor, T, K, E);
    size_t *taken = m->taken;
    double counted = s->keys.uncounted ? 0 : 1; /* a recomputed forward was counted the first time */
    s->n = 0;
    for (size_t r = 0; r < s->rows; r++) {
        memset(taken, 0, E * sizeof *taken);
        float *f = s->frac + r * E;
        memset(f, 0, E * sizeof *f);
        double aux = 0, z = 0;
        for (size_t pos = 0; pos < T; pos++) {
            size_t t = r * T + pos;
            for (size_t j = 0; j < K; j++) {
                size_t slot = t * K + j;
                int32_t e = s->choice[slot];
                f[e] += 1.0f;
                unsigned char st = CHOICE_KEPT;
                if (j == 1 && m->o.random_routing && s->keys.training) {
                    uint64_t token = (uint64_t)(s->keys.first_row + r) * T + pos;
                    if (!(uniform_at(s->keys.routing_seed, token) < 2.0 * (double)s->gate[slot])) st = CHOICE_UNROUTED;
                }
                if (st == CHOICE_KEPT) {
                    m->assigned += counted, m->load[e] += counted;
                    if (taken[e] >= cap)
                        st = CHOICE_DROPPED, m->dropped += counted;
                    else
                        taken[e]++;
                }
                s->state[slot] = st;
                if (st == CHOICE_KEPT) s->a_expert[s->n] = e, s->a_slot[s->n] = slot, s->n++;
            }
            z += s->lse[t] * s->lse[t];
        }
        for (size_t e = 0; e < E; e++) {
            double P = 0;
            for (size_t pos = 0; pos < T; pos++) P += s->probs[(r * T + pos) * E + e];
            f[e] /= (float)(T * K);
            aux += (double)f[e] * (P / (double)T);
        }
        m->aux += counted * (double)E * aux / s->row_den, m->z += counted * z / (double)T / s->row_den;
    }
}

/* d(logits) (over s->logits) from the gates' gradient dgate[N, K] and the losses' terms. */
static void router_backward(shard_moe *m, const float *dgate) {
    moe_state *s = m->s;
    size_t E = m->E, K = m->K, T = s->T;
    double aux_k = (double)m->o.aux_coef / s->row_den * (double)E / (double)T,
           z_k = (double)m->o.z_coef / s->row_den * 2.0 / (double)T;
    for (size_t t = 0; t < s->N; t++) {
        const float *p = s->probs + t * E, *f = s->frac + (t / T) * E, *g = s->gate + t * K, *dg = dgate + t * K;
        const int32_t *ch = s->choice + t * K;
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
        float *dl = s->logits + t * E;
        for (size_t e = 0; e < E; e++) dl[e] = (float)((double)p[e] * (dpv[e] - dot) + z_k * s->lse[t] * (double)p[e]);
    }
}

/* ---- the experts ---- */

/* The layer's shapes as the analyzer's bound takes them (expert_bound.h). */
static shard__expert_shape bound_shape(const shard_moe *m) {
    const moe_state *s = m->s;
    return (shard__expert_shape){.experts = m->E,
                                 .top_k = m->K,
                                 .held = m->o.held_experts,
                                 .width = m->C,
                                 .hidden = m->F,
                                 .rows = s->rows,
                                 .tokens = s->T,
                                 .capacity = shard_moe_capacity(m->o.capacity_factor, s->T, m->K, m->E),
                                 .ranks = m->o.comm ? shard_comm_size(m->o.comm) : 1};
}

/* The analyzer's dry run (a tally set): this forward's or backward's exchange bytes at capacity, and the
 * expert rows the context would hold then, beside those the dry run's routing holds. */
static void bound_tally(shard_moe *m, int forward) {
    shard__expert_plan *p = shard__expert_plan_current;
    if (!p) return;
    moe_state *s = m->s;
    shard__expert_shape shape = bound_shape(m);
    p->bound_bytes += shard__expert_bytes_bound(&shape, p->peer_rows, forward);
    size_t held = shard__expert_held_bound(&shape, p->peer_rows);
    if (forward && held > s->bound_cap) {
        p->activation_bound_bytes += shard__expert_activation_bytes(&shape, held - s->bound_cap);
        s->bound_cap = held;
    }
}

static shard_status grow_experts(shard_moe *m, size_t total) {
    moe_state *s = m->s;
    if (total <= s->total_cap && s->xe) return SHARD_OK;
    if (shard__expert_plan_current && total > s->total_cap) {
        shard__expert_shape shape = bound_shape(m);
        shard__expert_plan_current->activation_bytes += shard__expert_activation_bytes(&shape, total - s->total_cap);
    }
    float **bufs[] = {&s->xe, &s->ye, &s->dxe, &s->slope, &s->hid, &s->dh};
    for (size_t i = 0; i < 6; i++) {
        shard_free(*bufs[i]);
        *bufs[i] = acts(total * (i < 3 ? m->C : m->F));
        if (!*bufs[i]) return shard_error(SHARD_ERR_NO_MEMORY, "moe: out of memory for %zu expert rows", total);
    }
    s->total_cap = total;
    return SHARD_OK;
}

/* Rows for the experts: the kept assignments' inputs in assignment order, then the exchange. */
static shard_status gather_rows(shard_moe *m) {
    moe_state *s = m->s;
    size_t C = m->C;
    for (size_t i = 0; i < s->n; i++) memcpy(s->xa + i * C, s->x + (s->a_slot[i] / m->K) * C, C * sizeof(float));
    SHARD_CHECK(shard_expert_route_renew(&s->route, m->o.comm, m->E, s->a_expert, s->n));
    s->total = shard_expert_route_total(s->route);
    SHARD_CHECK(grow_experts(m, s->total));
    return shard_expert_dispatch(s->route, s->xa, s->xe, C);
}

/* The results back in assignment order, and y[token] += gate x result. */
static shard_status scatter_rows(shard_moe *m, float *y) {
    moe_state *s = m->s;
    size_t C = m->C;
    SHARD_CHECK(shard_expert_combine(s->route, s->ye, s->ya, C));
    memset(y, 0, s->N * C * sizeof *y);
    for (size_t i = 0; i < s->n; i++) {
        float g = s->gate[s->a_slot[i]], *yt = y + (s->a_slot[i] / m->K) * C;
        const float *r = s->ya + i * C;
        for (size_t c = 0; c < C; c++) yt[c] += g * r[c];
    }
    return SHARD_OK;
}

static shard_status experts_forward(shard_moe *m, const shard_moe_weights *w) {
    moe_state *s = m->s;
    size_t C = m->C, F = m->F, at = 0;
    int bias = shard_tp_rank(m->o.tensor) == 0; /* the row-parallel bias rule: added once before the sum */
    for (size_t e = 0; e < m->o.held_experts; e++) {
        size_t rows = shard_expert_route_rows(s->route, e);
        if (!rows) continue;
        SHARD_CHECK(
            shard_linear_forward(s->xe + at * C, w->fc_w + e * C * F, w->fc_b + e * F, s->slope + at * F, rows, C, F));
        shard_gelu_forward_slope(s->slope + at * F, s->hid + at * F, rows * F); /* slope: GELU' from here on */
        SHARD_CHECK(shard_linear_forward(s->hid + at * F, w->proj_w + e * F * C, bias ? w->proj_b + e * C : NULL,
                                         s->ye + at * C, rows, F, C));
        at += rows;
    }
    return shard_tp_sum(m->o.tensor, s->ye, s->total * C);
}

/* From d(ye) (in s->ye): d(xe) into s->dxe, the experts' gradients added. */
static shard_status experts_backward(shard_moe *m, const shard_moe_weights *w, const shard_moe_grads *g) {
    moe_state *s = m->s;
    size_t C = m->C, F = m->F, at = 0;
    for (size_t e = 0; e < m->o.held_experts; e++) {
        size_t rows = shard_expert_route_rows(s->route, e);
        if (!rows) continue;
        SHARD_CHECK(shard_linear_backward(s->hid + at * F, w->proj_w + e * F * C, s->ye + at * C, s->dh + at * F,
                                          g->proj_w + e * F * C, g->proj_b + e * C, rows, F, C));
        shard_mul(s->dh + at * F, s->slope + at * F, s->dh + at * F, rows * F);
        SHARD_CHECK(shard_linear_backward(s->xe + at * C, w->fc_w + e * C * F, s->dh + at * F, s->dxe + at * C,
                                          g->fc_w + e * C * F, g->fc_b + e * F, rows, C, F));
        at += rows;
    }
    return shard_tp_sum(m->o.tensor, s->dxe, s->total * C);
}

/* ---- the layer ---- */

shard_status shard_moe_forward(shard_moe *m, const shard_moe_weights *w, const float *x, size_t rows, size_t T,
                               const shard_moe_keys *keys, double row_denominator, float *y) {
    moe_state *s = m->s;
    size_t N = rows * T;
    if (!rows || !T || N > m->o.max_tokens || !(row_denominator > 0))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "moe forward: %zu rows x %zu tokens over %g rows; the layer was made for up to %zu "
                           "tokens and the denominator must be positive",
                           rows, T, row_denominator, m->o.max_tokens);
    s->N = N, s->rows = rows, s->T = T, s->x = x, s->row_den = row_denominator;
    s->keys = keys ? *keys : (shard_moe_keys){0};
    SHARD_CHECK(router_forward(m, w->gate));
    router_assign(m);
    SHARD_CHECK(gather_rows(m));
    bound_tally(m, 1);
    SHARD_CHECK(experts_forward(m, w));
    return scatter_rows(m, y);
}

shard_status shard_moe_backward(shard_moe *m, const shard_moe_weights *w, const float *dy, float *dx,
                                const shard_moe_grads *g) {
    moe_state *s = m->s;
    size_t C = m->C, E = m->E, N = s->N, K = m->K;
    if (!s->route) return shard_error(SHARD_ERR_INVALID_ARG, "moe backward: no forward before it");
    /* the combine's backward: d(gate) = dy . result; d(result) = gate x dy, back to the experts */
    float *dgate = s->dgate;
    memset(dgate, 0, N * K * sizeof *dgate);
    for (size_t i = 0; i < s->n; i++) {
        size_t slot = s->a_slot[i];
        const float *dyt = dy + (slot / K) * C, *r = s->ya + i * C;
        float gt = s->gate[slot], *d = s->xa + i * C; /* xa's rows are free now: d(result) */
        double dot = 0;
        for (size_t c = 0; c < C; c++) dot += (double)dyt[c] * (double)r[c], d[c] = gt * dyt[c];
        dgate[slot] = (float)dot;
    }
    bound_tally(m, 0);
    SHARD_CHECK(shard_expert_dispatch(s->route, s->xa, s->ye, C)); /* ye's rows become d(ye) */
    SHARD_CHECK(experts_backward(m, w, g));
    SHARD_CHECK(shard_expert_combine(s->route, s->dxe, s->ya, C)); /* ya's rows: d(input) per assignment */
    router_backward(m, dgate);
    const float *xr = s->xr && s->keys.training ? s->xr : s->x;
    SHARD_CHECK(shard_sgemm(1, 0, E, C, N, 1.0f, s->logits, E, xr, C, 1.0f, g->gate, C));
    /* the router's input gradient (through the jitter), then the experts' */
    SHARD_CHECK(shard_sgemm(0, 0, N, C, E, 1.0f, s->logits, E, w->gate, C, 0.0f, dx, C));
    if (s->xr && s->keys.training)
        for (size_t t = 0; t < N; t++)
            for (size_t c = 0; c < C; c++) dx[t * C + c] *= jitter_at(m, t, c);
    for (size_t i = 0; i < s->n; i++)
        shard_add(dx + (s->a_slot[i] / K) * C, s->ya + i * C, dx + (s->a_slot[i] / K) * C, C);
    return SHARD_OK;
}
