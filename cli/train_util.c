/* train_util.c — see train_util.h. */
#include "train_util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

/* ---------------------------------------------------------------- the layout flags */

typedef enum { FLAG_TEXT, FLAG_INT, FLAG_REAL, FLAG_SWITCH, FLAG_SPECS } flag_kind;

typedef struct layout_flag {
    const char *name;
    flag_kind kind;
    size_t offset; /* of the field in cli_layout */
    long lo, hi;   /* FLAG_INT's range */
    int proper;    /* part of the layout proper: a plan fixes it whether or not its flags name it */
} layout_flag;

#define TEXT(n, f, p)                                                                                                  \
    { .name = n, .kind = FLAG_TEXT, .offset = offsetof(cli_layout, f), .proper = p }
#define INT(n, f, l, h, p)                                                                                             \
    { .name = n, .kind = FLAG_INT, .offset = offsetof(cli_layout, f), .lo = l, .hi = h, .proper = p }
#define SWITCH(n, f)                                                                                                   \
    { .name = n, .kind = FLAG_SWITCH, .offset = offsetof(cli_layout, f), .proper = 1 }

static const layout_flag FLAGS[] = {
    TEXT("--mesh", mesh, 1),
    TEXT("--schedule", schedule, 1),
    TEXT("--layers-per-stage", layers_per_stage, 1),
    TEXT("--batch-shares", batch_shares, 1),
    TEXT("--grad-dtype", grad_dtype, 0),
    TEXT("--compute-dtype", compute_dtype, 0),
    TEXT("--optimizer", optimizer, 0),
    INT("--batch", batch, 1, 1 << 20, 0),
    INT("--micro-batch", micro_batch, 1, 1 << 20, 0),
    INT("--accum", accum, 1, 1 << 20, 0),
    INT("--seq", seq, 1, 1 << 20, 0),
    INT("--zero", zero, 0, 3, 1),
    INT("--micro-batches", micro_batches, 1, 1 << 16, 1),
    INT("--virtual-stages", virtual_stages, 1, 64, 1),
    {.name = "--bucket-mb", .kind = FLAG_REAL, .offset = offsetof(cli_layout, bucket_mb)},
    SWITCH("--recompute", recompute),
    SWITCH("--sequence-parallel", sequence_parallel),
    {.name = "--spec", .kind = FLAG_SPECS, .offset = offsetof(cli_layout, specs)},
};
enum { FLAG_COUNT = sizeof FLAGS / sizeof FLAGS[0] };

#define FIELD(l, f, type) ((type *)((char *)(l) + (f)->offset))

/* --spec's value added to the joined list: refused when it is not one NAME=SPEC or the list is full. */
static int add_spec(cli_layout *l, const char *val) {
    size_t used = strlen(l->specs);
    if (used + strlen(val) + 2 > sizeof l->specs) {
        cli_error("--spec '%s': the --spec options add up to more than %zu characters; place groups with a "
                  "pattern instead, e.g. --spec 'h.*.mlp.*=P()'",
                  val, sizeof l->specs - 1);
        return -1;
    }
    if (!strchr(val, '=') || strchr(val, ';')) {
        cli_error("--spec '%s' is invalid: give NAME=SPEC, one per --spec, e.g. --spec 'h.*.mlp.*=P()'", val);
        return -1;
    }
    snprintf(l->specs + used, sizeof l->specs - used, "%s%s", used ? ";" : "", val);
    return 0;
}

int cli_layout_option(cli_layout *l, int argc, char **argv, int *i) {
    const char *a = argv[*i], *val = NULL;
    for (int k = 0; k < FLAG_COUNT; k++) {
        const layout_flag *f = &FLAGS[k];
        if (strcmp(a, f->name) != 0) continue;
        if (f->kind != FLAG_SWITCH && !(val = cli_value(argc, argv, i))) return -1;
        switch (f->kind) {
        case FLAG_TEXT: *FIELD(l, f, const char *) = val; break;
        case FLAG_INT:
            if (cli_parse_int(a, val, f->lo, f->hi, FIELD(l, f, long))) return -1;
            break;
        case FLAG_REAL: /* --bucket-mb */
            if (!cli_number(val, FIELD(l, f, double)) || !(*FIELD(l, f, double) > 0) || *FIELD(l, f, double) > 1e6) {
                cli_error("%s '%s' is invalid: give a number in (0, 1e6] (MiB), e.g. 25", a, val);
                return -1;
            }
            break;
        case FLAG_SWITCH: *FIELD(l, f, int) = 1; break;
        case FLAG_SPECS:
            if (add_spec(l, val)) return -1;
            break;
        }
        l->given |= 1ul << k;
        return 1;
    }
    return 0;
}

void cli_layout_flag_names(char *out, size_t bytes) {
    size_t at = 0;
    out[0] = '\0';
    for (int k = 0; k < FLAG_COUNT && at < bytes; k++)
        at += (size_t)snprintf(out + at, bytes - at, "%s%s", k ? ", " : "", FLAGS[k].name);
}

shard_status cli_layout_check_names(const cli_layout *l) {
    const char *dtypes[2] = {l->grad_dtype, l->compute_dtype}, *dtype_names[2] = {"--grad-dtype", "--compute-dtype"};
    for (int k = 0; k < 2; k++)
        if (dtypes[k] && strcmp(dtypes[k], "f32") != 0 && strcmp(dtypes[k], "bf16") != 0)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s '%s' is invalid: give f32 or bf16", dtype_names[k],
                               dtypes[k]);
    shard_optimizer_kind kind = SHARD_OPTIMIZER_ADAMW;
    if (l->optimizer && shard_optimizer_find(l->optimizer, &kind) < 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "--optimizer '%s' is invalid: give adamw or sgd", l->optimizer);
    if (l->schedule && strcmp(l->schedule, "gpipe") != 0 && strcmp(l->schedule, "1f1b") != 0 &&
        strcmp(l->schedule, "interleaved") != 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "--schedule '%s': use gpipe, 1f1b or interleaved", l->schedule);
    return SHARD_OK;
}

shard_trainer_config cli_layout_trainer_config(const cli_layout *l, const char *config_path) {
    shard_trainer_config tc = {
        .config_path = config_path,
        .batch = (size_t)l->batch,
        .micro_batch = (size_t)l->micro_batch,
        .accum = (size_t)l->accum,
        .seq = (size_t)l->seq,
        .seed = 1,
        .zero = (int)l->zero,
        .bucket_mb = l->bucket_mb,
        .grad_dtype = l->grad_dtype && strcmp(l->grad_dtype, "bf16") == 0 ? SHARD_BF16 : SHARD_F32,
        .compute_dtype = l->compute_dtype && strcmp(l->compute_dtype, "bf16") == 0 ? SHARD_BF16 : SHARD_F32,
        .optimizer = l->optimizer,
        .adamw = shard_adamw_defaults(),
        .clip = 1.0f,
        .sequence_parallel = l->sequence_parallel,
        .param_specs = l->specs[0] ? l->specs : NULL,
        .schedule = l->schedule,
        .micro_batches = (size_t)l->micro_batches,
        .virtual_stages = (int)l->virtual_stages,
        .recompute = l->recompute,
        .layers_per_stage = l->layers_per_stage,
        .batch_shares = l->batch_shares};
    tc.lr = (shard_lr_schedule){1e-3f, 1e-4f, 0, 1};
    return tc;
}

/* Flag f of l as the command line would give it ("--zero 1", "--recompute"), or "no --recompute" /
 * "no --schedule" when it is off or unset. */
static void flag_text(const cli_layout *l, const layout_flag *f, char *out, size_t bytes) {
    const void *v = (const char *)l + f->offset;
    const char *text = f->kind == FLAG_TEXT ? *(const char *const *)v : f->kind == FLAG_SPECS ? (const char *)v : NULL;
    if (f->kind == FLAG_INT && *(const long *)v >= f->lo) /* below its range: not given (0, derived) */
        snprintf(out, bytes, "%s %ld", f->name, *(const long *)v);
    else if (f->kind == FLAG_REAL)
        snprintf(out, bytes, "%s %g", f->name, *(const double *)v);
    else if (f->kind == FLAG_SWITCH)
        snprintf(out, bytes, "%s%s", *(const int *)v ? "" : "no ", f->name);
    else if (text && *text)
        snprintf(out, bytes, "%s %s", f->name, text);
    else
        snprintf(out, bytes, "no %s", f->name);
}

int cli_layout_merge(cli_layout *into, const cli_layout *from, int whole, char *mine, char *theirs, size_t bytes) {
    for (int k = 0; k < FLAG_COUNT; k++) {
        const layout_flag *f = &FLAGS[k];
        unsigned long bit = 1ul << k;
        if (!(from->given & bit) && !(whole && f->proper)) continue;
        char a[4200], b[4200];
        flag_text(into, f, a, sizeof a);
        flag_text(from, f, b, sizeof b);
        if ((into->given & bit) && strcmp(a, b) != 0) {
            snprintf(mine, bytes, "%s", a), snprintf(theirs, bytes, "%s", b);
            return 0;
        }
        if (f->kind == FLAG_SPECS)
            memcpy(into->specs, from->specs, sizeof into->specs);
        else
            memcpy((char *)into + f->offset, (const char *)from + f->offset,
                   f->kind == FLAG_TEXT       ? sizeof(const char *)
                       : f->kind == FLAG_INT  ? sizeof(long)
                       : f->kind == FLAG_REAL ? sizeof(double)
                                              : sizeof(int));
        into->given |= from->given & bit;
    }
    return 1;
}

int cli_progress_due(long step, long steps) {
    return step == 1 || step == steps || step % (steps >= 20 ? steps / 20 : 1) == 0;
}

void cli_progress(int tty, long step, long steps, float loss, float lr, double tps, double ms) {
    if (tty) {
        int width = 30, filled = (int)((double)width * (double)step / (double)steps);
        printf("\r  [%.*s%*s] %ld/%ld  loss %.4f  lr %.2e  %.0f tok/s  %.1f ms/step ", filled,
               "##############################", width - filled, "", step, steps, loss, lr, tps, ms);
        fflush(stdout);
    } else if (cli_progress_due(step, steps)) {
        printf("  step %ld/%ld  loss %.4f  lr %.2e  %.0f tok/s  %.1f ms/step\n", step, steps, loss, lr, tps, ms);
        fflush(stdout);
    }
}

/* One replicated dtensor per stored tensor on a one-rank mesh. */
static shard_status make_items(shard_comm *comm, const shard_params *params, shard_mesh **mesh,
                               shard_ckpt_item **items) {
    SHARD_CHECK(shard_mesh_create(comm, "data=1", mesh));
    *items = calloc(params->count + 1, sizeof **items);
    if (!*items) return shard_error(SHARD_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t i = 0; i < params->count; i++) {
        shard_spec spec = shard_spec_replicated(params->info[i].ndim);
        (*items)[i].name = params->info[i].name;
        SHARD_CHECK(shard_dtensor_create(*mesh, SHARD_F32, params->info[i].ndim, params->info[i].shape, &spec,
                                         SHARD_MEM_COMM, &(*items)[i].tensor));
    }
    return SHARD_OK;
}

static void free_items(shard_mesh *mesh, shard_ckpt_item *items, size_t n) {
    for (size_t i = 0; items && i < n; i++) shard_dtensor_destroy(items[i].tensor);
    free(items);
    shard_mesh_destroy(mesh);
}

shard_status train_load_checkpoint(shard_comm *comm, const char *where, shard_model *model, uint64_t *step) {
    shard_mesh *mesh = NULL;
    shard_ckpt_item *items = NULL;
    shard_params *stored = NULL; /* the tensors as the checkpoint names them (an expert stack's members) */
    shard_status s = shard_model_stored_params(model, &stored);
    size_t n = stored ? stored->count : 0;
    if (s == SHARD_OK) s = make_items(comm, stored, &mesh, &items);
    if (s == SHARD_OK) s = shard_ckpt_load(where, items, n, step);
    for (size_t i = 0; s == SHARD_OK && i < n; i++)
        memcpy(stored->data + stored->info[i].offset, items[i].tensor->local->data,
               stored->info[i].numel * sizeof(float));
    if (s == SHARD_OK) shard_model_take_stored(model, stored);
    free_items(mesh, items, n);
    shard_params_destroy(stored);
    return s;
}

shard_status train_load_weights(const char *path, shard_model *model) {
    shard_params *stored = NULL;
    shard_status s = shard_model_stored_params(model, &stored);
    if (s == SHARD_OK) s = shard_params_load(stored, path, 1, NULL);
    if (s == SHARD_OK) shard_model_take_stored(model, stored);
    shard_params_destroy(stored);
    return s;
}
