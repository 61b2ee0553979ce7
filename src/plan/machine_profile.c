/* machine_profile.c — see cost_model.h: the machine profile's JSON (read, checked, written atomically)
 * and its look-ups (a GEMM shape's throughput, a collective's alpha and beta). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/atomic_file.h"
#include "shard/cost_model.h"

#define PROFILE_FORMAT "shard-machine-profile"

/* A positive number at `key` of `obj` (where: for the message). */
static shard_status take_number(const char *path, const char *where, json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: %s\"%s\" must be a number > 0", path, where,
                           key);
    *out = json_number_value(v);
    return SHARD_OK;
}

static shard_status take_string(const char *path, json_t *obj, const char *key, char *out, size_t bytes) {
    json_t *v = json_object_get(obj, key);
    if (!json_is_string(v))
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: \"%s\" must be a string", path, key);
    snprintf(out, bytes, "%s", json_string_value(v));
    return SHARD_OK;
}

/* An optional number >= 0 at `key` of `obj` (absent in older files: *out stays). */
static shard_status take_optional(const char *path, const char *where, json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v) return SHARD_OK;
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || !isfinite(json_number_value(v)))
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: %s\"%s\" must be a number >= 0", path, where,
                           key);
    *out = json_number_value(v);
    return SHARD_OK;
}

static shard_status take_gemms(const char *path, json_t *arr, shard_machine_profile *p) {
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > SHARD_PROFILE_MAX_GEMMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: \"gemm\" must be a list of 1 to %d shapes", path,
                           SHARD_PROFILE_MAX_GEMMS);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        char where[64];
        snprintf(where, sizeof where, "gemm[%zu] ", i);
        double m = 0, n = 0, k = 0, t = 0, g = 0, spread = 0;
        SHARD_CHECK(take_number(path, where, e, "m", &m));
        SHARD_CHECK(take_number(path, where, e, "n", &n));
        SHARD_CHECK(take_number(path, where, e, "k", &k));
        SHARD_CHECK(take_number(path, where, e, "threads", &t));
        SHARD_CHECK(take_number(path, where, e, "gflops", &g));
        SHARD_CHECK(take_optional(path, where, e, "gflops_spread", &spread));
        p->gemm[p->gemms++] = (shard_profile_gemm){(size_t)m, (size_t)n, (size_t)k, (int)t, g, spread};
    }
    return SHARD_OK;
}

static shard_status take_comms(const char *path, json_t *arr, shard_machine_profile *p) {
    if (!json_is_array(arr) || json_array_size(arr) > SHARD_PROFILE_MAX_COMMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: \"comm\" must be a list of at most %d fits",
                           path, SHARD_PROFILE_MAX_COMMS);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        char where[64];
        snprintf(where, sizeof where, "comm[%zu] ", i);
        shard_profile_comm *c = &p->comm[p->comms];
        double ranks = 0;
        SHARD_CHECK(take_string(path, e, "backend", c->backend, sizeof c->backend));
        SHARD_CHECK(take_string(path, e, "op", c->op, sizeof c->op));
        SHARD_CHECK(take_number(path, where, e, "ranks", &ranks));
        json_t *alpha = json_object_get(e, "alpha_us");
        if (!json_is_number(alpha) || json_number_value(alpha) < 0)
            return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: %s\"alpha_us\" must be a number >= 0", path,
                               where);
        c->alpha_us = json_number_value(alpha);
        SHARD_CHECK(take_number(path, where, e, "beta_gbps", &c->beta_gbps));
        c->ranks = (int)ranks;
        p->comms++;
    }
    return SHARD_OK;
}

shard_status shard_machine_profile_load(const char *path, shard_machine_profile *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: %s (line %d): give a file `shard profile` wrote",
                           path, err.text, err.line);
    shard_status s = SHARD_OK;
    json_t *format = json_object_get(root, "format");
    if (!json_is_object(root) || !json_is_string(format) || strcmp(json_string_value(format), PROFILE_FORMAT) != 0)
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "machine profile %s: no \"format\": \"%s\": give a file `shard profile` "
                        "wrote",
                        path, PROFILE_FORMAT);
    double cores = 0, frac = 0, loaded = -1;
    json_t *mem = json_object_get(root, "memory"), *compute = json_object_get(root, "compute");
    if (s == SHARD_OK) s = take_string(path, root, "machine", out->machine, sizeof out->machine);
    if (s == SHARD_OK) s = take_string(path, root, "date", out->date, sizeof out->date);
    if (s == SHARD_OK) s = take_string(path, root, "blas", out->blas, sizeof out->blas);
    if (s == SHARD_OK) s = take_number(path, "", root, "cores", &cores);
    if (s == SHARD_OK) s = take_number(path, "memory ", mem, "copy_gbps", &out->copy_gbps);
    if (s == SHARD_OK) s = take_number(path, "memory ", mem, "add_gbps", &out->add_gbps);
    json_t *f = json_object_get(compute, "nongemm_fraction");
    if (s == SHARD_OK && (!json_is_number(f) || (frac = json_number_value(f)) < 0 || !isfinite(frac)))
        s = shard_error(SHARD_ERR_INVALID_ARG, "machine profile %s: compute \"nongemm_fraction\" must be a number >= 0",
                        path);
    json_t *fl = json_object_get(compute, "nongemm_fraction_loaded"); /* optional: absent in older files */
    if (s == SHARD_OK && fl && (!json_is_number(fl) || (loaded = json_number_value(fl)) < 0 || !isfinite(loaded)))
        s = shard_error(SHARD_ERR_INVALID_ARG,
                        "machine profile %s: compute \"nongemm_fraction_loaded\" must be a number >= 0", path);
    if (s == SHARD_OK)
        s = take_optional(path, "compute ", compute, "nongemm_fraction_spread", &out->nongemm_fraction_spread);
    if (s == SHARD_OK)
        s = take_optional(path, "compute ", compute, "nongemm_fraction_loaded_spread",
                          &out->nongemm_fraction_loaded_spread);
    if (s == SHARD_OK) s = take_gemms(path, json_object_get(root, "gemm"), out);
    if (s == SHARD_OK) s = take_comms(path, json_object_get(root, "comm"), out);
    out->cores = (int)cores, out->nongemm_fraction = frac, out->nongemm_fraction_loaded = loaded >= 0 ? loaded : frac;
    json_decref(root);
    return s;
}

shard_status shard_machine_profile_save(const shard_machine_profile *p, const char *path) {
    json_t *root = json_object(), *mem = json_object(), *compute = json_object(), *gemm = json_array(),
           *comm = json_array();
    json_object_set_new(root, "format", json_string(PROFILE_FORMAT));
    json_object_set_new(root, "machine", json_string(p->machine));
    json_object_set_new(root, "date", json_string(p->date));
    json_object_set_new(root, "blas", json_string(p->blas));
    json_object_set_new(root, "cores", json_integer(p->cores));
    json_object_set_new(mem, "copy_gbps", json_real(p->copy_gbps));
    json_object_set_new(mem, "add_gbps", json_real(p->add_gbps));
    json_object_set_new(root, "memory", mem);
    json_object_set_new(compute, "nongemm_fraction", json_real(p->nongemm_fraction));
    json_object_set_new(compute, "nongemm_fraction_loaded", json_real(p->nongemm_fraction_loaded));
    json_object_set_new(compute, "nongemm_fraction_spread", json_real(p->nongemm_fraction_spread));
    json_object_set_new(compute, "nongemm_fraction_loaded_spread", json_real(p->nongemm_fraction_loaded_spread));
    json_object_set_new(root, "compute", compute);
    for (size_t i = 0; i < p->gemms; i++) {
        const shard_profile_gemm *g = &p->gemm[i];
        json_array_append_new(gemm,
                              json_pack("{s:I,s:I,s:I,s:i,s:f,s:f}", "m", (json_int_t)g->m, "n", (json_int_t)g->n, "k",
                                        (json_int_t)g->k, "threads", g->threads, "gflops", g->gflops, "gflops_spread",
                                        g->gflops_spread));
    }
    json_object_set_new(root, "gemm", gemm);
    for (size_t i = 0; i < p->comms; i++) {
        const shard_profile_comm *c = &p->comm[i];
        json_array_append_new(comm,
                              json_pack("{s:s,s:s,s:i,s:f,s:f}", "backend", c->backend, "op", c->op, "ranks", c->ranks,
                                        "alpha_us", c->alpha_us, "beta_gbps", c->beta_gbps));
    }
    json_object_set_new(root, "comm", comm);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(root);
    if (!text) return shard_error(SHARD_ERR_NO_MEMORY, "machine profile %s: out of memory", path);
    size_t len = strlen(text);
    text[len] = '\n'; /* the terminator becomes the final newline */
    shard_status s = shard__atomic_write_file(path, text, len + 1);
    free(text);
    return s;
}

double shard_profile_gemm_gflops(const shard_machine_profile *p, size_t m, size_t n, size_t k, int threads) {
    /* the nearest measured shape, then its rates at one thread and at all cores */
    double best = INFINITY;
    size_t bm = 0, bn = 0, bk = 0;
    for (size_t i = 0; i < p->gemms; i++) {
        const shard_profile_gemm *g = &p->gemm[i];
        double d = fabs(log((double)g->m / (double)m)) + fabs(log((double)g->n / (double)n)) +
            fabs(log((double)g->k / (double)k));
        if (d < best) best = d, bm = g->m, bn = g->n, bk = g->k;
    }
    double one = 0, all = 0;
    int all_threads = 1;
    for (size_t i = 0; i < p->gemms; i++) {
        const shard_profile_gemm *g = &p->gemm[i];
        if (g->m != bm || g->n != bn || g->k != bk) continue;
        if (g->threads == 1) one = g->gflops;
        if (g->threads >= all_threads && g->threads > 1) all = g->gflops, all_threads = g->threads;
    }
    if (threads <= 1 || all <= 0) return one > 0 ? one : all;
    if (threads >= all_threads || one <= 0) return all;
    return one + (all - one) * (double)(threads - 1) / (double)(all_threads - 1);
}

shard_status shard_profile_comm_find(const shard_machine_profile *p, const char *backend, const char *op, int ranks,
                                     double *alpha_us, double *beta_gbps) {
    for (int pass = 0; pass < 2; pass++) { /* the op itself, then all_reduce's fit */
        const shard_profile_comm *best = NULL;
        for (size_t i = 0; i < p->comms; i++) {
            const shard_profile_comm *c = &p->comm[i];
            if (strcmp(c->backend, backend) != 0 || strcmp(c->op, pass ? "all_reduce" : op) != 0) continue;
            if (!best || abs(c->ranks - ranks) < abs(best->ranks - ranks) ||
                (abs(c->ranks - ranks) == abs(best->ranks - ranks) && c->ranks > best->ranks))
                best = c;
        }
        if (best) {
            *alpha_us = best->alpha_us, *beta_gbps = best->beta_gbps;
            return SHARD_OK;
        }
    }
    return shard_error(SHARD_ERR_UNSUPPORTED,
                       "machine profile: no %s fit for the %s backend: profile with that backend (shard profile)", op,
                       backend);
}
