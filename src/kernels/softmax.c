/* softmax.c — softmax over the last dim, the row pieces softmax, cross-entropy and attention share
 * (vec.h: the row maximum, exp of a row with its sum, scaling a row), and softmax's plain reference.
 *
 * exp runs on vectors with its own polynomial (no libm calls, so it vectorises); sums run in 16 lanes
 * added in a fixed order.  The reference at the end is the definition in double (see reference.h). */
#include "shard/layers.h"

#include <math.h>
#include <string.h>

#include "core/simd.h"
#include "kernels/reference.h"
#include "kernels/vec.h"

/* exp(x) for x <= 0 (softmax after subtracting the row maximum): 2^k e^r with
 * |r| <= ln2/2 and Cephes' polynomial, within 2 ulp of expf.  Written with
 * GCC/Clang vector types (the rounding and the 2^k come from bit tricks a
 * plain loop would not vectorise), 8 lanes wide: 64-byte generic vectors with
 * a comparison were split into scalar code on AVX2 cores (a cross-entropy over
 * 1,024 x 8,192 took 28 ms on a Zen 3 core that way, 13 ms now).
 * Below -87 it returns ~1e-38, not 0. */
#define DEFINE_EXP_NONPOSITIVE(name, vf, vi)                                                                           \
    static inline void name(vf *xp) {                                                                                  \
        vf x = *xp;                                                                                                    \
        const vf lo = (vf){0} - 87.0f;                                                                                 \
        vi below = x < lo; /* all ones where x < -87 */                                                                \
        x = (vf)(((vi)x & ~below) | ((vi)lo & below));                                                                 \
        const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */                              \
        vf kf = x * 1.44269504088896341f + magic;                                                                      \
        vi ki = (vi)kf - (vi)((vf){0} + magic);                                                                        \
        vf k = kf - magic;                                                                                             \
        vf r = x - k * 0.693359375f + k * 2.12194440e-4f;                                                              \
        vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                                                \
        p = p * r + 8.3334519073e-3f;                                                                                  \
        p = p * r + 4.1665795894e-2f;                                                                                  \
        p = p * r + 1.6666665459e-1f;                                                                                  \
        p = p * r + 5.0000001201e-1f;                                                                                  \
        p = p * r * r + r + 1.0f;                                                                                      \
        *xp = p * (vf)((ki + 127) << 23);                                                                              \
    }
DEFINE_EXP_NONPOSITIVE(exp8_nonpositive, v8f, v8i)

/* out[0..15] = exp(in[0..15] - m); sum[0] += lanes 0..7, sum[1] += lanes 8..15 (pointers, not vector
 * values, cross the call) */
static inline void exp16_nonpositive(const float *in, float m, float *out, v8f sum[2]) {
    for (int h = 0; h < 2; h++) {
        v8f x;
        load8(&x, in + HALF * h);
        x -= m;
        exp8_nonpositive(&x);
        memcpy(out + HALF * h, &x, sizeof x);
        sum[h] += x;
    }
}

/* The row's largest element (NaNs passed over), in 16 lanes of two 8-lane vectors: a loop over a float
 * array of 16 partial maxima compiled to scalar code (its AVX-512 clone used vmaxss), the max being
 * written as a comparison.  Exact, so the lanes' order does not matter. */
SHARD_VECTOR_CLONES
float shard__row_max(const float *x, size_t C) {
    v8f part[2] = {(v8f){0} - INFINITY, (v8f){0} - INFINITY}, v;
    size_t c = 0;
    for (; c + LANES <= C; c += LANES)
        for (int h = 0; h < 2; h++) {
            load8(&v, x + c + HALF * h);
            v8i more = v > part[h];
            select8(&part[h], &more, &v, &part[h]);
        }
    float m = -INFINITY, lane[LANES];
    memcpy(lane, &part[0], sizeof part[0]);
    memcpy(lane + HALF, &part[1], sizeof part[1]);
    for (int k = 0; k < LANES; k++) m = lane[k] > m ? lane[k] : m;
    for (; c < C; c++) m = x[c] > m ? x[c] : m;
    return m;
}

/* The same exp on 16 lanes as one 64-byte vector: the same operations lane by lane, so the same bits.
 * Only where the CPU has AVX-512 (wide_vectors): there exp_row's AVX-512 clone runs it in zmm registers,
 * and the cross-entropy over 1,024 x 8,192 logits took 2.6 ms on two threads instead of 3.6 (Emerald
 * Rapids); GCC would turn the comparison into scalar code for AVX2. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline int wide_vectors(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

DEFINE_EXP_NONPOSITIVE(exp16_one_vector, v16f, v16i)

static inline void exp16_wide(const float *in, float m, float *out, v16f *sum) {
    v16f x;
    memcpy(&x, in, sizeof x);
    x -= m;
    exp16_one_vector(&x);
    memcpy(out, &x, sizeof x);
    *sum += x;
}

/* y[c] = exp(x[c] - m) (y may be x); returns the sum, added in a fixed order (lane 0 to 15). */
SHARD_VECTOR_CLONES
double shard__exp_row(const float *x, float *y, size_t C, float m) {
    v8f acc[2] = {{0}, {0}};
    float tail[LANES] = {0};
    size_t c = 0;
    if (wide_vectors()) { /* the same lanes, 0-7 and 8-15, as the halves below */
        v16f wide = {0};
        for (; c + LANES <= C; c += LANES) exp16_wide(x + c, m, y + c, &wide);
        memcpy(&acc[0], &wide, sizeof acc[0]);
        memcpy(&acc[1], (float *)&wide + HALF, sizeof acc[1]);
    }
    for (; c + LANES <= C; c += LANES) exp16_nonpositive(x + c, m, y + c, acc);
    size_t rest = C - c;
    if (rest) {
        float in[LANES] = {0}, out[LANES];
        v8f unused[2] = {{0}, {0}};
        memcpy(in, x + c, rest * sizeof(float));
        for (size_t k = rest; k < LANES; k++) in[k] = m - 100.0f; /* lanes past the end: exp ~ 1e-38, dropped below */
        exp16_nonpositive(in, m, out, unused);
        memcpy(y + c, out, rest * sizeof(float));
        for (size_t k = 0; k < rest; k++) tail[k] = out[k];
    }
    double sum = 0;
    for (int k = 0; k < LANES; k++) sum += (double)acc[k / HALF][k % HALF] + (double)tail[k];
    return sum;
}

SHARD_VECTOR_CLONES
void shard__scale_row(float *y, size_t C, float k) {
    for (size_t c = 0; c < C; c++) y[c] *= k;
}

void shard_softmax_forward(const float *x, float *y, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C;
        float *o = y + n * C;
        double sum = shard__exp_row(r, o, C, shard__row_max(r, C));
        shard__scale_row(o, C, (float)(1.0 / sum));
    }
}

/* ---------------------------------------------------------------- reference */

void shard__ref_softmax_forward(const float *x, float *y, size_t N, size_t C) {
    for (size_t n = 0; n < N; n++) {
        const float *r = x + n * C;
        double m = -INFINITY, sum = 0;
        for (size_t c = 0; c < C; c++) m = r[c] > m ? r[c] : m;
        for (size_t c = 0; c < C; c++) sum += exp(r[c] - m);
        for (size_t c = 0; c < C; c++) y[n * C + c] = (float)(exp(r[c] - m) / sum);
    }
}
