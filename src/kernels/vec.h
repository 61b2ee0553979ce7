/* vec.h — internal to src/kernels/: what the kernel files share.
 *
 * The grain above which an element-wise loop is cut into chunks for the process's threads
 * (core/parallel.h); 8-lane vector types and the helpers built on them; the row softmax pieces that
 * softmax, cross-entropy and attention all run (defined in softmax.c); and the dropout mask, derived
 * here once for the fast dropout and for attention's reference. */
#ifndef SHARD_KERNELS_VEC_H
#define SHARD_KERNELS_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Element-wise loops over more than this many elements are cut into chunks for the process's threads. */
enum { GRAIN = 32768 };

/* Row sums in 16 running lanes (GCC/Clang vector types), added in a fixed order at the end: a single
 * running float sum would not vectorise (addition is not associative), and the result is the same bits
 * every run.  The 16 lanes are two 8-lane (32-byte) vectors, lanes 0-7 and 8-15: GCC compiles 64-byte
 * generic vectors for AVX2 into stack spills and scalar moves (a LayerNorm of 1,024 x 256 took 548 us on
 * a Zen 3 core that way). */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
enum { LANES = 16, HALF = 8 };

/* (pointers, not vector values, cross these calls: the baseline ABI has no 32-byte vectors) */
static inline void load8(v8f *v, const float *p) { memcpy(v, p, sizeof *v); }

static inline float lanes_total(const v8f lane[2]) {
    float s = 0;
    for (int k = 0; k < LANES; k++) s += lane[k / HALF][k % HALF];
    return s;
}

/* lane by lane: *out = keep ? yes : no (keep's lanes all ones or all zeros) */
static inline void select8(v8f *out, const v8i *keep, const v8f *yes, const v8f *no) {
    *out = (v8f)((*keep & (v8i)*yes) | (~*keep & (v8i)*no));
}

/* ---- a softmax's row pieces (softmax.c): softmax, cross-entropy and attention's causal rows ---- */

/* The row's largest element (NaNs passed over). */
float shard__row_max(const float *x, size_t C);
/* y[c] = exp(x[c] - m) (y may be x); returns the sum, added in a fixed order (lane 0 to 15). */
double shard__exp_row(const float *x, float *y, size_t C, float m);
/* y[c] *= k */
void shard__scale_row(float *y, size_t C, float k);

/* ---- the dropout mask: element `index` of a mask keyed by `seed` is kept with probability 1 - p ---- */

static inline uint64_t shard__dropout_mix(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline int shard__dropout_keeps(uint64_t seed, uint64_t index, float p) {
    uint64_t r = shard__dropout_mix(seed * 0x9e3779b97f4a7c15ULL + index + 1);
    return (float)((double)(r >> 11) * 0x1.0p-53) >= p;
}

#endif
