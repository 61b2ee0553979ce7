/* train_mlp.c — the trainer in one page: the teacher MLP
 * (configs/mlp-teacher.json: its rows are generated, no data files) trained
 * with AdamW under ZeRO-3 on a `data` mesh of every rank, the same function
 * on each; then, when a directory is given, a checkpoint that
 * `shard inspect ckpt` reads and any mesh resumes.
 *
 *   build/examples/train_mlp configs/mlp-teacher.json [CKPT_DIR]     2 thread ranks
 *   mpirun -np 2 build/examples/train_mlp configs/mlp-teacher.json   one rank per process
 * Exit 1 when the loss does not fall below half its first value. */
#include <stdio.h>

#include "shard/shard.h"

typedef struct run_args {
    const char *config, *save;
} run_args;

static shard_status train(shard_comm *world, void *arg) {
    const run_args *a = arg;
    char axes[32];
    snprintf(axes, sizeof axes, "data=%d", shard_comm_size(world));
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(world, axes, &mesh));
    shard_trainer_config c = {.config_path = a->config,
                              .batch = 16,
                              .seed = 1,
                              .zero = 3,
                              .adamw = shard_adamw_defaults(),
                              .lr = {3e-3f, 3e-4f, 10, 200},
                              .clip = 1.0f};
    shard_trainer *t = NULL;
    shard_status s = shard_trainer_create(mesh, &c, &t);
    double first = 0, last = 0;
    for (uint64_t step = 1; s == SHARD_OK && step <= 200; step++) {
        shard_step_result r; /* forward, backward, ZeRO-3's gathers and reduce-scatters, clipping, AdamW */
        s = shard_trainer_step(t, step, &r);
        if (s == SHARD_OK) first = step == 1 ? r.loss : first, last = r.loss;
        if (s == SHARD_OK && shard_comm_rank(world) == 0 && step % 50 == 0)
            printf("step %3llu  loss %.4f\n", (unsigned long long)step, r.loss);
    }
    if (s == SHARD_OK && a->save) s = shard_trainer_save(t, a->save, 200, NULL);
    if (s == SHARD_OK && !(last < first / 2))
        s = shard_error(SHARD_ERR_INTERNAL, "the loss went from %g to %g: not learning", first, last);
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    return s;
}

int main(int argc, char **argv) {
    run_args a = {argc > 1 ? argv[1] : "configs/mlp-teacher.json", argc > 2 ? argv[2] : NULL};
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    if (shard_launch(under_mpi ? 0 : 2, train, &a) < 0) { /* under mpirun: one rank per process */
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
