/* sample.c — shard/sample.h: temperature and top-k sampling over logits.  The probabilities are formed
 * in double from the logits less the largest (exp never overflows), unnormalised: the draw is scaled by
 * their sum instead, so no division touches each one. */
#include "shard/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint64_t shard_random_next(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* The K-th largest of x[0..n-1] (1 <= K < n) by partial selection: K is small next to a vocabulary. */
static shard_status kth_largest(const float *x, size_t n, size_t K, float *out) {
    float *sorted = malloc(n * sizeof *sorted);
    if (!sorted) return shard_error(SHARD_ERR_NO_MEMORY, "sampling: out of memory for %zu logits", n);
    memcpy(sorted, x, n * sizeof *sorted);
    for (size_t k = 0; k < K; k++) {
        size_t m = k;
        for (size_t v = k + 1; v < n; v++)
            if (sorted[v] > sorted[m]) m = v;
        float t = sorted[k];
        sorted[k] = sorted[m], sorted[m] = t;
    }
    *out = sorted[K - 1];
    free(sorted);
    return SHARD_OK;
}

shard_status shard_sample_token(const float *logits, size_t vocab, double temperature, size_t top_k, uint64_t *rng,
                                int *token) {
    if (!logits || !vocab || !rng || !token)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "sampling: give logits, a vocabulary of at least one token, a "
                           "generator state and a place for the token");
    size_t best = 0;
    for (size_t v = 0; v < vocab; v++) {
        if (!isfinite(logits[v]))
            return shard_error(SHARD_ERR_INVALID_ARG, "sampling: logit %zu is NaN or infinite", v);
        if (logits[v] > logits[best]) best = v;
    }
    *token = (int)best;
    if (temperature <= 0) return SHARD_OK;
    float cut = -INFINITY;
    if (top_k > 0 && top_k < vocab) SHARD_CHECK(kth_largest(logits, vocab, top_k, &cut));
    double *p = malloc(vocab * sizeof *p), sum = 0;
    if (!p) return shard_error(SHARD_ERR_NO_MEMORY, "sampling: out of memory for %zu logits", vocab);
    for (size_t v = 0; v < vocab; v++) {
        p[v] = logits[v] >= cut ? exp(((double)logits[v] - logits[best]) / temperature) : 0;
        sum += p[v];
    }
    double u = (double)(shard_random_next(rng) >> 11) * 0x1.0p-53 * sum;
    for (size_t v = 0; v < vocab; v++) {
        if (u < p[v]) {
            *token = (int)v;
            break;
        }
        u -= p[v];
    }
    free(p);
    return SHARD_OK;
}
