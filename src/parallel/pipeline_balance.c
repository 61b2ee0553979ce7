/* pipeline_balance.c — `--layers-per-stage balanced`: cut the layers into
 * stages by measured cost.  One rank times a few forward + backward passes of
 * the whole model through its unit hooks: a layer's time is the time between
 * acquiring and releasing its unit (forward and backward); units that are not
 * layers (the GPT's embeddings, ln_f and head) count where they run — on the
 * first stage when used before the first layer in forward (after the last in
 * backward), else on the last.  The cut minimises the slowest stage's time;
 * among equal times, the largest stage's model-state bytes (16 per parameter:
 * values, gradients, two AdamW moments). */
#include "parallel/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"

enum { REPS = 5 };

typedef struct timing {
    size_t units, first_layer_unit;
    double *t0, *unit_s; /* per unit: the running span's start, this pass's seconds */
    double pro, epi;     /* seconds of the non-layer units before the first / after the last layer */
    int backward, seen_layer;
} timing;

static shard_status time_acquire(void *ctx, shard_model *m, size_t u, int backward) {
    (void)m;
    timing *tm = ctx;
    if (backward != tm->backward) tm->backward = backward, tm->seen_layer = 0; /* a new pass */
    if (u >= tm->first_layer_unit) tm->seen_layer = 1;
    tm->t0[u] = shard__now();
    return SHARD_OK;
}

static shard_status time_release(void *ctx, shard_model *m, size_t u, int backward) {
    (void)m;
    timing *tm = ctx;
    double d = shard__now() - tm->t0[u];
    if (u >= tm->first_layer_unit)
        tm->unit_s[u] += d;
    else if (tm->seen_layer == !backward)
        tm->epi += d; /* forward: after the layers; backward: before them */
    else
        tm->pro += d;
    return SHARD_OK;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per-layer seconds (median of REPS passes) and the prologue / epilogue's. */
static shard_status measure(shard_model *m, shard_batch_source *src, size_t layers, uint64_t seed, size_t rows,
                            double *layer_s, double *pro, double *epi) {
    timing tm = {.units = m->units, .first_layer_unit = m->units - layers, .backward = -1};
    tm.t0 = calloc(m->units, sizeof *tm.t0), tm.unit_s = calloc(m->units, sizeof *tm.unit_s);
    double *rep = calloc((layers + 2) * REPS, sizeof *rep);
    float *grads = calloc(m->params->total + 1, sizeof *grads);
    shard_status s =
        tm.t0 && tm.unit_s && rep && grads ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "balance: out of memory");
    if (s == SHARD_OK) {
        shard_model_bind_grad_slab(m, grads);
        m->hooks = (shard_model_hooks){&tm, time_acquire, time_release, NULL};
    }
    for (int r = -1; s == SHARD_OK && r < REPS; r++) { /* one pass to warm up */
        memset(tm.unit_s, 0, m->units * sizeof *tm.unit_s);
        tm.pro = tm.epi = 0, tm.backward = -1;
        double loss = 0;
        shard_batch b;
        s = shard_batch_source_load(src, seed, 1, 0, rows, &b);
        if (s == SHARD_OK) s = m->ops->set_batch(m, &b);
        if (s == SHARD_OK) s = m->ops->forward(m, (double)(m->ops->batch_items(m) ? m->ops->batch_items(m) : 1), &loss);
        if (s == SHARD_OK) s = m->ops->backward(m);
        for (size_t l = 0; r >= 0 && l < layers; l++) rep[l * REPS + (size_t)r] = tm.unit_s[tm.first_layer_unit + l];
        if (r >= 0) rep[layers * REPS + (size_t)r] = tm.pro, rep[(layers + 1) * REPS + (size_t)r] = tm.epi;
    }
    for (size_t l = 0; s == SHARD_OK && l < layers + 2; l++) {
        qsort(rep + l * REPS, REPS, sizeof *rep, cmp_double);
        double med = rep[l * REPS + REPS / 2];
        if (l < layers)
            layer_s[l] = med;
        else
            *(l == layers ? pro : epi) = med;
    }
    m->hooks = (shard_model_hooks){0};
    shard_model_bind_grad_slab(m, NULL);
    free(tm.t0), free(tm.unit_s), free(rep), free(grads);
    return s;
}

shard_status shard__pipe_balance(shard_model *whole, shard_batch_source *src, size_t layers, int k, uint64_t seed,
                                 size_t rows, size_t *first, char *report, size_t report_bytes) {
    if (layers < (size_t)k || whole->units < layers)
        return shard_error(SHARD_ERR_INVALID_ARG, "--layers-per-stage balanced: %zu layers cannot fill %d stages",
                           layers, k);
    size_t L = layers, K = (size_t)k;
    double *t = calloc(L, sizeof *t), *mem = calloc(L, sizeof *mem), pro = 0, epi = 0;
    double *best = malloc((K + 1) * (L + 1) * sizeof *best), *best_mem = malloc((K + 1) * (L + 1) * sizeof *best_mem);
    size_t *cut = calloc((K + 1) * (L + 1), sizeof *cut);
    shard_status s =
        t && mem && best && best_mem && cut ? SHARD_OK : shard_error(SHARD_ERR_NO_MEMORY, "balance: out of memory");
    if (s == SHARD_OK) s = measure(whole, src, L, seed, rows, t, &pro, &epi);
    for (size_t l = 0; s == SHARD_OK && l < L; l++)
        mem[l] = 16.0 * (double)shard_model_unit_elems(whole, whole->units - L + l);
        /* best[j][i]: the slowest stage's seconds when the first i layers fill j stages */
#define AT(a, j, i) a[(j) * (L + 1) + (i)]
    for (size_t j = 0; s == SHARD_OK && j <= K; j++)
        for (size_t i = 0; i <= L; i++) AT(best, j, i) = AT(best_mem, j, i) = 1e300;
    if (s == SHARD_OK) AT(best, 0, 0) = AT(best_mem, 0, 0) = 0;
    for (size_t j = 1; s == SHARD_OK && j <= K; j++)
        for (size_t i = j; i <= L - (K - j); i++)
            for (size_t a = j - 1; a < i; a++) { /* stage j - 1 holds layers a .. i-1 */
                double cost = (a == 0 ? pro : 0) + (i == L ? epi : 0), bytes = 0;
                for (size_t l = a; l < i; l++) cost += t[l], bytes += mem[l];
                double worst = AT(best, j - 1, a) > cost ? AT(best, j - 1, a) : cost;
                double worst_mem = AT(best_mem, j - 1, a) > bytes ? AT(best_mem, j - 1, a) : bytes;
                if (worst < AT(best, j, i) * (1 - 1e-9) ||
                    (worst <= AT(best, j, i) * (1 + 1e-9) && worst_mem < AT(best_mem, j, i)))
                    AT(best, j, i) = worst, AT(best_mem, j, i) = worst_mem, AT(cut, j, i) = a;
            }
    if (s == SHARD_OK) {
        first[K] = L;
        for (size_t j = K; j > 0; j--) first[j - 1] = AT(cut, j, first[j]);
        int at = snprintf(report, report_bytes,
                          "balanced on measured ms per stage (outside the layers: first +%.2f, "
                          "last +%.2f):",
                          pro * 1e3, epi * 1e3);
        for (size_t j = 0; j < K && at > 0 && (size_t)at < report_bytes; j++) {
            double cost = (j == 0 ? pro : 0) + (j + 1 == K ? epi : 0);
            for (size_t l = first[j]; l < first[j + 1]; l++) cost += t[l];
            at += snprintf(report + at, report_bytes - (size_t)at, " %s%.2f", j ? "| " : "", cost * 1e3);
        }
    }
#undef AT
    free(t), free(mem), free(best), free(best_mem), free(cut);
    return s;
}
