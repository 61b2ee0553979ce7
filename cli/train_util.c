/* train_util.c — see train_util.h. */
#include "train_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
