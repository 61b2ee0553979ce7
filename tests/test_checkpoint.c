/* test_checkpoint.c — sharded checkpoints: save under one mesh and load
 * under others (other meshes, specs and world sizes) bitwise; a replicated
 * tensor written once; a crash at every point of the commit protocol leaves
 * the previous checkpoint loadable; a corrupt latest falls back to the one
 * before; clear errors for missing or mismatched tensors.
 *   test_checkpoint --ranks 4 [--case NAME]     (or under mpiexec -np 4) */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "shard/shard.h"

typedef struct tdef {
    const char *name;
    shard_dtype dtype;
    int ndim;
    size_t shape[2];
    const char *save_spec; /* over the saving mesh data=N */
    const char *load_spec; /* over data, tensor of the loading mesh */
} tdef;

static const tdef tensors[] = {
    {"w", SHARD_F32, 2, {10, 7}, "P('data', None)", "P('tensor', 'data')"},
    {"emb", SHARD_BF16, 2, {9, 5}, "P(None, 'data')", "P(('data','tensor'))"},
    {"bias", SHARD_F32, 1, {7, 0}, "P()", "P('tensor')"},
    {"grad", SHARD_F32, 2, {6, 4}, "P(None, None, partial='data')", "P(None, 'tensor', partial='data')"},
    {"ids", SHARD_I32, 2, {5, 3}, "P('data')", "P()"},
    {"scale", SHARD_F64, 0, {0, 0}, "P()", "P(partial='tensor', partial_op='max')"},
};
enum { NT = sizeof tensors / sizeof tensors[0] };

static double value(size_t t, size_t i, uint64_t step) {
    return (double)(i % 61) * 0.5 - 3.0 + (double)t + (double)step;
}

static shard_tensor *full_of(test_ctx *t, size_t k, uint64_t step) {
    shard_tensor *x = NULL;
    CHECK_OK(t, shard_tensor_create(tensors[k].dtype, tensors[k].ndim, tensors[k].shape, SHARD_MEM_OTHER, &x), "full");
    for (size_t i = 0; x && i < shard_tensor_numel(x); i++) shard_tensor_set(x, i, value(k, i, step));
    return x;
}

/* The tensors distributed on `mesh` under save specs (which == 0) or load specs (1). */
static void make_items(test_ctx *t, shard_mesh *mesh, int which, uint64_t step, int fill, shard_ckpt_item *items) {
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    for (size_t k = 0; k < NT; k++) {
        shard_spec spec;
        const char *text = which ? tensors[k].load_spec : tensors[k].save_spec;
        items[k].name = tensors[k].name;
        items[k].tensor = NULL;
        if (!CHECK_OK(t, shard_spec_parse(text, &layout, tensors[k].ndim, &spec), "spec %s", text)) continue;
        CHECK_OK(t,
                 shard_dtensor_create(mesh, tensors[k].dtype, tensors[k].ndim, tensors[k].shape, &spec,
                                      SHARD_MEM_PARAMS, &items[k].tensor),
                 "create %s", tensors[k].name);
        if (fill && items[k].tensor) {
            shard_tensor *x = full_of(t, k, step);
            CHECK_OK(t, shard_dtensor_distribute(items[k].tensor, x, -1), "distribute %s", tensors[k].name);
            shard_tensor_destroy(x);
        }
    }
}

static void free_items(shard_ckpt_item *items) {
    for (size_t k = 0; k < NT; k++) shard_dtensor_destroy(items[k].tensor);
}

/* Every loaded tensor gathers to the values of `step`. */
static void check_items(test_ctx *t, shard_ckpt_item *items, uint64_t step, const char *where) {
    for (size_t k = 0; k < NT; k++) {
        if (!items[k].tensor) continue;
        shard_tensor *want = full_of(t, k, step), *got = NULL;
        CHECK_OK(t, shard_tensor_create(tensors[k].dtype, tensors[k].ndim, tensors[k].shape, SHARD_MEM_OTHER, &got),
                 "got");
        CHECK_OK(t, shard_dtensor_gather(items[k].tensor, got, -1), "gather %s", tensors[k].name);
        CHECK(t, shard_tensor_equal_bits(got, want), "%s: tensor %s differs from step %llu", where, tensors[k].name,
              (unsigned long long)step);
        shard_tensor_destroy(want);
        shard_tensor_destroy(got);
    }
}

static void save_step(test_ctx *t, shard_mesh *mesh, const char *dir, uint64_t step) {
    shard_ckpt_item items[NT];
    make_items(t, mesh, 0, step, 1, items);
    CHECK_OK(t, shard_ckpt_save(dir, step, items, NT, "{\"model\": \"test\", \"lr\": 0.001}"), "save step %llu",
             (unsigned long long)step);
    free_items(items);
}

/* Load on `comm` under `mesh_text` with the load specs and compare with step. */
static void load_on(test_ctx *t, shard_comm *comm, const char *mesh_text, const char *where, uint64_t step) {
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(comm, mesh_text, &mesh), "mesh %s", mesh_text)) return;
    shard_ckpt_item items[NT];
    make_items(t, mesh, 1, 0, 0, items);
    uint64_t got = 0;
    CHECK_OK(t, shard_ckpt_load(where, items, NT, &got), "load on %s", mesh_text);
    CHECK_EQ_INT(t, (int64_t)got, (int64_t)step, "step loaded on %s", mesh_text);
    check_items(t, items, step, mesh_text); /* gathers over the items' own mesh */
    free_items(items);
    shard_mesh_destroy(mesh);
}

static void case_reshard(test_ctx *t) {
    char dir[256];
    test_shared_dir(t, "shard-ckpt", dir, sizeof dir);
    char text[32];
    snprintf(text, sizeof text, "data=%d", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    save_step(t, mesh, dir, 5);
    shard_mesh_destroy(mesh);
    /* what is on disk: one chunk per distinct block; a replicated tensor once */
    if (t->rank == 0) {
        char path[512];
        snprintf(path, sizeof path, "%s/latest", dir);
        FILE *f = fopen(path, "r");
        char line[64] = "";
        CHECK(t, f && fgets(line, sizeof line, f) && strcmp(line, "step_5\n") == 0, "latest is '%s'", line);
        if (f) fclose(f);
        snprintf(path, sizeof path, "%s/step_5/index.json", dir);
        char index[8192] = "", want[64];
        f = fopen(path, "r");
        if (f) index[fread(index, 1, sizeof index - 1, f)] = '\0', fclose(f);
        snprintf(want, sizeof want, "\"mesh\": \"data=%d\"", t->size);
        CHECK(t,
              strstr(index, want) && strstr(index, "\"step\": 5") && strstr(index, "\"lr\": 0.001") &&
                  strstr(index, "\"xxh3\": \"") && strstr(index, "\"spec\": \"P('data', None)\""),
              "index.json lacks the mesh, step, config, checksums or specs: %s", index);
        snprintf(path, sizeof path, "%s/step_5/rank_00000.safetensors", dir);
        shard_safetensors *st = NULL;
        if (CHECK_OK(t, shard_safetensors_open(path, &st), "open rank 0 file")) {
            CHECK(t, shard_safetensors_find(st, "bias") && shard_safetensors_find(st, "scale"), "rank 0 holds bias");
            shard_safetensors_close(st);
        }
        for (int r = 1; r < t->size; r++) {
            snprintf(path, sizeof path, "%s/step_5/rank_%05d.safetensors", dir, r);
            if (CHECK_OK(t, shard_safetensors_open(path, &st), "open rank %d file", r)) {
                CHECK(t, !shard_safetensors_find(st, "bias") && !shard_safetensors_find(st, "scale"),
                      "rank %d wrote a replicated tensor again", r);
                CHECK(t, shard_safetensors_find(st, "w") != NULL, "rank %d lacks its chunk of w", r);
                shard_safetensors_close(st);
            }
        }
    }
    /* load on 2x2 (or whatever factorisation this world has), on 3 ranks, on 1 rank */
    int a = t->size % 2 == 0 ? 2 : 1;
    snprintf(text, sizeof text, "data=%d,tensor=%d", a, t->size / a);
    load_on(t, t->comm, text, dir, 5);
    for (int n = 3; n >= 1; n -= 2) {
        if (n > t->size) continue;
        shard_comm *sub = NULL;
        CHECK_OK(t, shard_comm_split(t->comm, t->rank < n ? 0 : -1, t->rank, &sub), "split %d", n);
        if (sub) {
            snprintf(text, sizeof text, "data=1,tensor=%d", n);
            load_on(t, sub, text, dir, 5);
            snprintf(text, sizeof text, "data=%d,tensor=1", n);
            char step_dir[300];
            snprintf(step_dir, sizeof step_dir, "%s/step_5", dir);
            load_on(t, sub, text, step_dir, 5); /* a step directory given directly */
            shard_comm_destroy(sub);
        }
        CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    }
    test_remove_dir(t, dir);
}

static void case_crash_points(test_ctx *t) {
    static const char *const points[] = {"before_write", "after_write", "before_index", "before_rename",
                                         "before_latest"};
    char dir[256], text[32], load_text[32];
    test_shared_dir(t, "shard-ckpt", dir, sizeof dir);
    snprintf(text, sizeof text, "data=%d", t->size);
    snprintf(load_text, sizeof load_text, "data=%d,tensor=1", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    save_step(t, mesh, dir, 1);
    uint64_t step = 2;
    for (size_t p = 0; p < sizeof points / sizeof points[0]; p++)
        for (int variant = 0; variant < (p < 2 ? 2 : 1); variant++) { /* writes: every rank, or the last one alone */
            int crash_rank = variant == 0 ? -1 : t->size - 1;
            CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
            shard_ckpt_set_crash_point(points[p], crash_rank);
            shard_ckpt_item items[NT];
            make_items(t, mesh, 0, step, 1, items);
            shard_status s = shard_ckpt_save(dir, step, items, NT, NULL);
            CHECK(t, s == SHARD_ERR_IO && strstr(shard_last_error(), "crash"), "crash %s@%d: status %d: %s", points[p],
                  crash_rank, s, shard_last_error());
            free_items(items);
            shard_ckpt_set_crash_point(NULL, -1);
            CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
            load_on(t, t->comm, load_text, dir, 1); /* the previous checkpoint, whole */
            step++;
        }
    /* the step that crashed before `latest` left a whole step directory that no load picks: saving that step
     * again (training resumed from step 1 reaches it again) replaces it instead of refusing */
    save_step(t, mesh, dir, step - 1);
    load_on(t, t->comm, load_text, dir, step - 1);
    if (t->rank == 0) { /* moved aside whole, not deleted: an earlier run's step past `latest` looks the same */
        char prefix[64], index[700];
        snprintf(prefix, sizeof prefix, "step_%llu.replaced-", (unsigned long long)(step - 1));
        int aside = 0;
        DIR *d = opendir(dir);
        for (struct dirent *e; d && (e = readdir(d));)
            if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
                snprintf(index, sizeof index, "%s/%s/index.json", dir, e->d_name);
                aside += access(index, F_OK) == 0;
            }
        if (d) closedir(d);
        CHECK(t, aside == 1, "the superseded step_%llu moved aside whole: %d copies", (unsigned long long)(step - 1),
              aside);
    }
    save_step(t, mesh, dir, step); /* and the next save goes through, over the debris */
    load_on(t, t->comm, load_text, dir, step);
    { /* a root too long for its step directories' names is refused on every rank, before anything is made */
        static char longdir[PATH_MAX];
        memset(longdir, 'd', sizeof longdir - 1);
        memcpy(longdir, "/tmp/", 5);
        shard_ckpt_item items[NT];
        make_items(t, mesh, 0, 1, 1, items);
        shard_status s = shard_ckpt_save(longdir, 1, items, NT, NULL);
        CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "the directory name is"),
              "a %zu-byte directory: status %d, '%s'", strlen(longdir), (int)s, shard_last_error());
        free_items(items);
    }
    shard_mesh_destroy(mesh);
    test_remove_dir(t, dir);
}

static void corrupt(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, offset, SEEK_END);
    int c = fgetc(f);
    fseek(f, offset, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void case_fallback(test_ctx *t) {
    char dir[256], text[32], path[512], load_text[32];
    test_shared_dir(t, "shard-ckpt", dir, sizeof dir);
    snprintf(text, sizeof text, "data=%d", t->size);
    snprintf(load_text, sizeof load_text, "data=1,tensor=%d", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    save_step(t, mesh, dir, 1);
    save_step(t, mesh, dir, 2);
    save_step(t, mesh, dir, 3);
    load_on(t, t->comm, load_text, dir, 3);
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    if (t->rank == 0) { /* a flipped data byte in step 3, a broken index in step 2 */
        snprintf(path, sizeof path, "%s/step_3/rank_%05d.safetensors", dir, t->size - 1);
        corrupt(path, -1);
        snprintf(path, sizeof path, "%s/step_2/index.json", dir);
        corrupt(path, -3);
    }
    CHECK_OK(t, shard_comm_barrier(t->comm), "barrier");
    load_on(t, t->comm, load_text, dir, 1);
    /* a step directory given directly does not fall back: it fails, naming the file */
    shard_ckpt_item items[NT];
    make_items(t, mesh, 0, 0, 0, items);
    snprintf(path, sizeof path, "%s/step_3", dir);
    shard_status s = shard_ckpt_load(path, items, NT, NULL);
    CHECK(t, s == SHARD_ERR_IO && strstr(shard_last_error(), "checksum"), "corrupt step dir: %s", shard_last_error());
    /* names and types that do not match */
    shard_ckpt_item wrong = items[0];
    wrong.name = "nope";
    s = shard_ckpt_load(dir, &wrong, 1, NULL);
    CHECK(t, s < 0 && strstr(shard_last_error(), "has no tensor 'nope'"), "missing tensor: %s", shard_last_error());
    wrong = items[1];
    wrong.name = "w"; /* emb's tensor is bf16 [9,5]; w is f32 [10,7] */
    s = shard_ckpt_load(dir, &wrong, 1, NULL);
    CHECK(t, s < 0 && strstr(shard_last_error(), "tensor 'w' is F32[10,7] there, but bf16"), "mismatch: %s",
          shard_last_error());
    /* a name given twice, to load and to save (found by sorting the names, so not next to each other) */
    shard_ckpt_item twice[NT];
    memcpy(twice, items, sizeof twice);
    twice[NT - 1].name = twice[1].name;
    s = shard_ckpt_load(dir, twice, NT, NULL);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "the name 'emb' is given twice"), "twice: %s",
          shard_last_error());
    s = shard_ckpt_save(dir, 9, twice, NT, NULL);
    CHECK(t, s == SHARD_ERR_INVALID_ARG && strstr(shard_last_error(), "the name 'emb' is given twice"), "twice: %s",
          shard_last_error());
    free_items(items);
    s = shard_ckpt_load("/nonexistent/ckpt", items, 0, NULL);
    CHECK(t, s == SHARD_ERR_INVALID_ARG, "no items");
    shard_mesh_destroy(mesh);
    test_remove_dir(t, dir);
}

/* A tensor with fewer rows than ranks: the ranks without rows write no chunk (no zero-size entries in the
 * index or the files), and it loads back whole. */
static void case_few_rows(test_ctx *t) {
    char dir[256], text[32];
    test_shared_dir(t, "shard-ckpt", dir, sizeof dir);
    snprintf(text, sizeof text, "data=%d", t->size);
    shard_mesh *mesh = NULL;
    if (!CHECK_OK(t, shard_mesh_create(t->comm, text, &mesh), "mesh")) return;
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    size_t shape[2] = {2, 3};
    shard_spec rows;
    shard_dtensor *d = NULL, *back = NULL;
    shard_tensor *whole = NULL, *got = NULL;
    CHECK_OK(t, shard_spec_parse("P('data', None)", &layout, 2, &rows), "spec");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &whole), "whole");
    CHECK_OK(t, shard_tensor_create(SHARD_F32, 2, shape, SHARD_MEM_OTHER, &got), "got");
    for (size_t i = 0; whole && i < 6; i++) shard_tensor_set(whole, i, (double)i + 0.5);
    if (CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &rows, SHARD_MEM_PARAMS, &d), "create") &&
        CHECK_OK(t, shard_dtensor_distribute(d, whole, -1), "distribute")) {
        shard_ckpt_item item = {"few", d};
        CHECK_OK(t, shard_ckpt_save(dir, 1, &item, 1, NULL), "save");
        if (t->rank == 0) {
            char path[512], index[8192] = "";
            snprintf(path, sizeof path, "%s/step_1/index.json", dir);
            FILE *f = fopen(path, "r");
            if (f) index[fread(index, 1, sizeof index - 1, f)] = '\0', fclose(f);
            int chunks = 0;
            for (const char *at = index; (at = strstr(at, "\"sizes\"")); at++) chunks++;
            CHECK(t, chunks == (t->size < 2 ? t->size : 2) && !strstr(index, "[0,"),
                  "%d ranks: %d chunks, or a zero-size one: %s", t->size, chunks, index);
        }
        shard_spec whole_spec = shard_spec_replicated(2);
        if (CHECK_OK(t, shard_dtensor_create(mesh, SHARD_F32, 2, shape, &whole_spec, SHARD_MEM_PARAMS, &back),
                     "back")) {
            shard_ckpt_item in = {"few", back};
            CHECK_OK(t, shard_ckpt_load(dir, &in, 1, NULL), "load");
            CHECK_OK(t, shard_dtensor_gather(back, got, -1), "gather");
            CHECK(t, got && whole && shard_tensor_equal_bits(got, whole), "loaded back differently");
        }
    }
    shard_dtensor_destroy(d), shard_dtensor_destroy(back);
    shard_tensor_destroy(whole), shard_tensor_destroy(got);
    shard_mesh_destroy(mesh);
    test_remove_dir(t, dir);
}

static const test_case cases[] = {
    {"reshard", case_reshard},
    {"crash_points", case_crash_points},
    {"fallback", case_fallback},
    {"few_rows", case_few_rows},
};

int main(int argc, char **argv) {
    return test_main(argc, argv, "test_checkpoint", cases, sizeof cases / sizeof cases[0]);
}
