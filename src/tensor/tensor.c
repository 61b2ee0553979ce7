/* tensor.c — n-d tensors: creation, views, strided copy, fill, cast and the
 * comparison helpers tests use.
 *
 * Every element-wise routine walks the logical shape with an odometer over the
 * outer dims and handles the innermost dim as one run, so views (non-unit
 * outer strides) cost nothing extra when their last dim is contiguous. */
#include "shard/tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static shard_status check_tensor(const shard_tensor *t, const char *what) {
    if (!t) return shard_error(SHARD_ERR_INVALID_ARG, "%s: tensor is NULL", what);
    return SHARD_OK;
}

size_t shard_tensor_numel(const shard_tensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

size_t shard_tensor_nbytes(const shard_tensor *t) { return shard_tensor_numel(t) * shard_dtype_size(t->dtype); }

int shard_tensor_is_contiguous(const shard_tensor *t) {
    size_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->strides[d] != expect) return 0;
        expect *= t->shape[d];
    }
    return 1;
}

void shard_tensor_type_string(const shard_tensor *t, char *out, size_t out_bytes) {
    size_t used = (size_t)snprintf(out, out_bytes, "%s[", shard_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && used < out_bytes; d++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%zu", d ? "," : "", t->shape[d]);
    if (used < out_bytes) snprintf(out + used, out_bytes - used, "]");
}

shard_status shard_tensor_create(shard_dtype dtype, int ndim, const size_t *shape, shard_mem_category category,
                                 shard_tensor **out) {
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_create: out is NULL");
    *out = NULL;
    if (shard_dtype_size(dtype) == 0)
        return shard_error(
            SHARD_ERR_INVALID_ARG,
            "shard_tensor_create: dtype %d is invalid: valid dtypes are f32, f64, bf16, f16, i8, i32, i64, u8",
            (int)dtype);
    if (ndim < 0 || ndim > SHARD_MAX_DIMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_create: %d dims; a tensor has 0..%d", ndim,
                           SHARD_MAX_DIMS);
    if (ndim > 0 && !shape) return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_create: shape is NULL");
    size_t numel = 1, es = shard_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] && numel > SIZE_MAX / es / shape[d])
            return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_create: shape overflows at dim %d (%zu)", d,
                               shape[d]);
        numel *= shape[d];
    }
    shard_tensor *t = calloc(1, sizeof *t);
    if (!t) return shard_error(SHARD_ERR_NO_MEMORY, "shard_tensor_create: out of memory");
    t->storage = shard_alloc_zeroed(numel * es, category);
    if (!t->storage) {
        free(t);
        return SHARD_ERR_NO_MEMORY;
    }
    t->dtype = dtype;
    t->ndim = ndim;
    t->category = category;
    t->data = t->storage;
    size_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = stride;
        stride *= shape[d];
    }
    *out = t;
    return SHARD_OK;
}

void shard_tensor_destroy(shard_tensor *t) {
    if (!t) return;
    shard_free(t->storage);
    free(t);
}

shard_status shard_tensor_narrow(const shard_tensor *t, int dim, size_t start, size_t length, shard_tensor **out) {
    SHARD_CHECK(check_tensor(t, "shard_tensor_narrow"));
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_narrow: out is NULL");
    *out = NULL;
    if (dim < 0 || dim >= t->ndim)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_narrow: dim %d of a %d-dim tensor; valid 0..%d", dim,
                           t->ndim, t->ndim - 1);
    if (start > t->shape[dim] || length > t->shape[dim] - start)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_narrow: [%zu, %zu) is outside dim %d of size %zu",
                           start, start + length, dim, t->shape[dim]);
    shard_tensor *v = malloc(sizeof *v);
    if (!v) return shard_error(SHARD_ERR_NO_MEMORY, "shard_tensor_narrow: out of memory");
    *v = *t;
    v->storage = NULL;
    v->shape[dim] = length;
    v->data = (char *)t->data + start * t->strides[dim] * shard_dtype_size(t->dtype);
    *out = v;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- element access */

static double load(shard_dtype d, const void *p) {
    switch (d) {
    case SHARD_F32: return *(const float *)p;
    case SHARD_F64: return *(const double *)p;
    case SHARD_BF16: return shard_f32_from_bf16(*(const uint16_t *)p);
    case SHARD_F16: return shard_f32_from_f16(*(const uint16_t *)p);
    case SHARD_I8: return *(const int8_t *)p;
    case SHARD_I32: return *(const int32_t *)p;
    case SHARD_I64: return (double)*(const int64_t *)p;
    case SHARD_U8: return *(const uint8_t *)p;
    default: return NAN;
    }
}

/* v as a float rounded toward zero, its last bit set when that was inexact ("round to odd"): rounding
 * that float again to bf16 or f16 gives v rounded once to nearest even (a float keeps more than two
 * bits beyond theirs), where (float)v would round twice (1 + 2^-8 + 2^-30 became bf16 1.0). */
static float odd_float(double v) {
    float f = (float)v;
    if (isnan(v) || (double)f == v) return f;
    if (fabs((double)f) > fabs(v)) f = nextafterf(f, 0.0f);
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= 1;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void store(shard_dtype d, void *p, double v) {
    if (isnan(v) && !shard_dtype_is_float(d)) v = 0; /* an integer has no NaN (the cast would be undefined) */
    switch (d) {
    case SHARD_F32: *(float *)p = (float)v; break;
    case SHARD_F64: *(double *)p = v; break;
    case SHARD_BF16: *(uint16_t *)p = shard_bf16_from_f32(odd_float(v)); break;
    case SHARD_F16: *(uint16_t *)p = shard_f16_from_f32(odd_float(v)); break;
    case SHARD_I8: *(int8_t *)p = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); break;
    case SHARD_I32:
        *(int32_t *)p = (int32_t)(v < -2147483648.0 ? -2147483648.0 : v > 2147483647.0 ? 2147483647.0 : v);
        break;
    case SHARD_I64: *(int64_t *)p = v < -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v; break;
    case SHARD_U8: *(uint8_t *)p = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    default: break;
    }
}

/* Address of the element at a flat row-major index of the logical shape. */
static char *element(const shard_tensor *t, size_t flat) {
    size_t offset = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        size_t i = t->shape[d] ? flat % t->shape[d] : 0;
        flat = t->shape[d] ? flat / t->shape[d] : 0;
        offset += i * t->strides[d];
    }
    return (char *)t->data + offset * shard_dtype_size(t->dtype);
}

double shard_tensor_get(const shard_tensor *t, size_t flat_index) {
    if (!t || flat_index >= shard_tensor_numel(t)) return NAN;
    return load(t->dtype, element(t, flat_index));
}

shard_status shard_tensor_set(shard_tensor *t, size_t flat_index, double value) {
    SHARD_CHECK(check_tensor(t, "shard_tensor_set"));
    if (flat_index >= shard_tensor_numel(t))
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_set: index %zu of %zu elements", flat_index,
                           shard_tensor_numel(t));
    store(t->dtype, element(t, flat_index), value);
    return SHARD_OK;
}

/* ---------------------------------------------------------------- walking rows */

/* Calls fn once per innermost row (the last dim) of the shape shared by up to
 * two tensors, with pointers to the row's first elements. */
typedef void (*row_fn)(void *ctx, char *a, const char *b, size_t row_start, size_t n);

static void for_each_row(const shard_tensor *a, const shard_tensor *b, row_fn fn, void *ctx) {
    size_t numel = shard_tensor_numel(a);
    if (numel == 0) return;
    int nd = a->ndim;
    size_t row = nd ? a->shape[nd - 1] : 1;
    size_t esa = shard_dtype_size(a->dtype), esb = b ? shard_dtype_size(b->dtype) : 0;
    size_t idx[SHARD_MAX_DIMS] = {0};
    for (size_t start = 0; start < numel; start += row) {
        size_t oa = 0, ob = 0;
        for (int d = 0; d < nd - 1; d++) {
            oa += idx[d] * a->strides[d];
            if (b) ob += idx[d] * b->strides[d];
        }
        fn(ctx, (char *)a->data + oa * esa, b ? (const char *)b->data + ob * esb : NULL, start, row);
        for (int d = nd - 2; d >= 0; d--) { /* odometer over the outer dims */
            if (++idx[d] < a->shape[d]) break;
            idx[d] = 0;
        }
    }
}

static shard_status check_same_shape(const shard_tensor *a, const shard_tensor *b, const char *what) {
    SHARD_CHECK(check_tensor(a, what));
    SHARD_CHECK(check_tensor(b, what));
    char ta[160], tb[160];
    int same = a->ndim == b->ndim;
    for (int d = 0; same && d < a->ndim; d++) same = a->shape[d] == b->shape[d];
    if (same) return SHARD_OK;
    shard_tensor_type_string(a, ta, sizeof ta);
    shard_tensor_type_string(b, tb, sizeof tb);
    return shard_error(SHARD_ERR_INVALID_ARG, "%s: shapes differ: %s and %s", what, ta, tb);
}

typedef struct copy_ctx {
    const shard_tensor *dst, *src;
} copy_ctx;

static void copy_row(void *ctx, char *a, const char *b, size_t start, size_t n) {
    copy_ctx *c = ctx;
    (void)start;
    size_t es = shard_dtype_size(c->dst->dtype);
    size_t sa = c->dst->ndim ? c->dst->strides[c->dst->ndim - 1] : 1;
    size_t sb = c->src->ndim ? c->src->strides[c->src->ndim - 1] : 1;
    if (sa == 1 && sb == 1) {
        memmove(a, b, n * es);
        return;
    }
    for (size_t i = 0; i < n; i++) memmove(a + i * sa * es, b + i * sb * es, es);
}

shard_status shard_tensor_copy(shard_tensor *dst, const shard_tensor *src) {
    SHARD_CHECK(check_same_shape(dst, src, "shard_tensor_copy"));
    if (dst->dtype != src->dtype)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_copy: dtypes differ (%s <- %s); use shard_tensor_cast",
                           shard_dtype_name(dst->dtype), shard_dtype_name(src->dtype));
    if (shard_tensor_is_contiguous(dst) && shard_tensor_is_contiguous(src)) {
        memmove(dst->data, src->data, shard_tensor_nbytes(src));
        return SHARD_OK;
    }
    copy_ctx c = {dst, src};
    for_each_row(dst, src, copy_row, &c);
    return SHARD_OK;
}

typedef struct cast_ctx {
    const shard_tensor *dst, *src;
} cast_ctx;

static void cast_row(void *ctx, char *a, const char *b, size_t start, size_t n) {
    cast_ctx *c = ctx;
    (void)start;
    size_t ea = shard_dtype_size(c->dst->dtype), eb = shard_dtype_size(c->src->dtype);
    size_t sa = c->dst->ndim ? c->dst->strides[c->dst->ndim - 1] : 1;
    size_t sb = c->src->ndim ? c->src->strides[c->src->ndim - 1] : 1;
    for (size_t i = 0; i < n; i++) store(c->dst->dtype, a + i * sa * ea, load(c->src->dtype, b + i * sb * eb));
}

shard_status shard_tensor_cast(shard_tensor *dst, const shard_tensor *src) {
    SHARD_CHECK(check_same_shape(dst, src, "shard_tensor_cast"));
    if (!shard_dtype_is_float(dst->dtype) || !shard_dtype_is_float(src->dtype))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "shard_tensor_cast: %s -> %s: casts are between f32, f64, bf16 and f16",
                           shard_dtype_name(src->dtype), shard_dtype_name(dst->dtype));
    if (dst->dtype == src->dtype) return shard_tensor_copy(dst, src);
    cast_ctx c = {dst, src};
    for_each_row(dst, src, cast_row, &c);
    return SHARD_OK;
}

typedef struct fill_ctx {
    const shard_tensor *t;
    unsigned char pattern[8];
} fill_ctx;

static void fill_row(void *ctx, char *a, const char *b, size_t start, size_t n) {
    fill_ctx *c = ctx;
    (void)b, (void)start;
    size_t es = shard_dtype_size(c->t->dtype), s = c->t->ndim ? c->t->strides[c->t->ndim - 1] : 1;
    for (size_t i = 0; i < n; i++) memcpy(a + i * s * es, c->pattern, es);
}

shard_status shard_tensor_fill(shard_tensor *t, double value) {
    SHARD_CHECK(check_tensor(t, "shard_tensor_fill"));
    fill_ctx c = {t, {0}};
    store(t->dtype, c.pattern, value);
    for_each_row(t, NULL, fill_row, &c);
    return SHARD_OK;
}

/* ---------------------------------------------------------------- comparison */

typedef struct compare_ctx {
    const shard_tensor *a, *b;
    shard_tensor_diff *diff;
} compare_ctx;

static void compare_row(void *ctx, char *pa, const char *pb, size_t start, size_t n) {
    compare_ctx *c = ctx;
    size_t ea = shard_dtype_size(c->a->dtype), eb = shard_dtype_size(c->b->dtype);
    size_t sa = c->a->ndim ? c->a->strides[c->a->ndim - 1] : 1;
    size_t sb = c->b->ndim ? c->b->strides[c->b->ndim - 1] : 1;
    for (size_t i = 0; i < n; i++) {
        const char *xa = pa + i * sa * ea, *xb = pb + i * sb * eb;
        if (ea != eb || memcmp(xa, xb, ea) != 0) c->diff->mismatched_bits++;
        double va = load(c->a->dtype, xa), vb = load(c->b->dtype, xb);
        double abs_diff = fabs(va - vb);
        if (isnan(va) != isnan(vb))
            abs_diff = INFINITY;
        else if (isnan(va))
            abs_diff = 0;
        double rel = abs_diff / fmax(fabs(vb), 1e-30);
        if (abs_diff > c->diff->max_abs) {
            c->diff->max_abs = abs_diff;
            c->diff->worst_index = start + i;
            c->diff->worst_a = va;
            c->diff->worst_b = vb;
        }
        if (rel > c->diff->max_rel) c->diff->max_rel = rel;
    }
}

shard_status shard_tensor_compare(const shard_tensor *a, const shard_tensor *b, shard_tensor_diff *out) {
    SHARD_CHECK(check_same_shape(a, b, "shard_tensor_compare"));
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_tensor_compare: out is NULL");
    memset(out, 0, sizeof *out);
    compare_ctx c = {a, b, out};
    for_each_row((shard_tensor *)a, b, compare_row, &c);
    return SHARD_OK;
}

int shard_tensor_equal_bits(const shard_tensor *a, const shard_tensor *b) {
    if (!a || !b || a->dtype != b->dtype) return 0;
    shard_tensor_diff d;
    if (shard_tensor_compare(a, b, &d) < 0) return 0;
    return d.mismatched_bits == 0;
}
