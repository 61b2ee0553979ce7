/* two_d_parallel.c — 2-D parallelism in one layer: a dense layer out = x W with
 * x [128, 4096] split by rows over `data` (P('data', None)), W [4096, 2048]
 * split by columns over `tensor` (P(None, 'tensor')), so every rank multiplies
 * its own blocks with no communication and holds out as P('data', 'tensor').
 * Prints the three specs with the visualizer, then gathers out and checks it
 * against the product on one device.
 *
 *   build/examples/two_d_parallel                 8 thread ranks, mesh data=4,tensor=2
 *   mpirun -np 8 build/examples/two_d_parallel    one rank per process */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "shard/shard.h"

enum { BATCH = 128, IN = 4096, OUT = 2048 };

/* the larger difference, a NaN kept once seen (fmax would drop it and pass a broken run) */
static double worse(double worst, double d) { return isnan(worst) || d <= worst ? worst : d; }

static shard_status fill(shard_tensor *t, const char *name) {
    shard_init_normal(t->data, 0, t->shape[0] * t->shape[1], 1.0f, 4, name); /* the same on every rank */
    return SHARD_OK;
}

static shard_status run(shard_comm *world, void *arg) {
    (void)arg;
    int rank = shard_comm_rank(world);
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_blas_set_threads(1));
    SHARD_CHECK(shard_mesh_create(world, "data=4,tensor=2", &mesh));
    shard_mesh_layout layout;
    shard_mesh_layout_of(mesh, &layout);
    const char *texts[3] = {"P('data', None)", "P(None, 'tensor')", "P('data', 'tensor')"};
    const size_t shapes[3][2] = {{BATCH, IN}, {IN, OUT}, {BATCH, OUT}};
    const char *names[3] = {"x", "W", "out"};
    shard_spec specs[3];
    shard_dtensor *d[3] = {NULL, NULL, NULL};
    shard_tensor *full[3] = {NULL, NULL, NULL};
    shard_status s = SHARD_OK;
    for (int i = 0; s == SHARD_OK && i < 3; i++) {
        s = shard_spec_parse(texts[i], &layout, 2, &specs[i]);
        if (s == SHARD_OK)
            s = shard_dtensor_create(mesh, SHARD_F32, 2, shapes[i], &specs[i], SHARD_MEM_ACTIVATIONS, &d[i]);
        if (s == SHARD_OK) s = shard_tensor_create(SHARD_F32, 2, shapes[i], SHARD_MEM_OTHER, &full[i]);
        if (s == SHARD_OK && rank == 0) {
            printf("---- %s\n", names[i]);
            shard_spec_describe(&specs[i], &layout, SHARD_F32, shapes[i], stdout);
        }
    }
    /* x and W from one seed on every rank; each keeps its block (no traffic) */
    if (s == SHARD_OK) s = fill(full[0], "x");
    if (s == SHARD_OK) s = fill(full[1], "W");
    if (s == SHARD_OK) s = shard_dtensor_distribute(d[0], full[0], -1);
    if (s == SHARD_OK) s = shard_dtensor_distribute(d[1], full[1], -1);
    /* the local product: x rows of this data index times W columns of this tensor index */
    const shard_tensor *xl = s == SHARD_OK ? d[0]->local : NULL, *wl = s == SHARD_OK ? d[1]->local : NULL;
    if (s == SHARD_OK)
        s = shard_sgemm(0, 0, xl->shape[0], wl->shape[1], IN, 1.0f, xl->data, IN, wl->data, wl->shape[1], 0.0f,
                        d[2]->local->data, d[2]->local->shape[1]);
    if (s == SHARD_OK) s = shard_dtensor_gather(d[2], full[2], 0);
    if (s == SHARD_OK && rank == 0) { /* one device: the whole product */
        float *want = malloc((size_t)BATCH * OUT * sizeof *want);
        s = want ? shard_sgemm(0, 0, BATCH, OUT, IN, 1.0f, full[0]->data, IN, full[1]->data, OUT, 0.0f, want, OUT)
                 : SHARD_ERR_NO_MEMORY;
        double worst = 0, big = 0;
        const float *got = full[2]->data;
        for (size_t k = 0; s == SHARD_OK && k < (size_t)BATCH * OUT; k++)
            worst = worse(worst, fabs((double)got[k] - want[k])), big = fmax(big, fabs((double)want[k]));
        printf("local block on rank 0: x %zux%zu times W %zux%zu -> out %zux%zu, no communication\n", xl->shape[0],
               xl->shape[1], wl->shape[0], wl->shape[1], d[2]->local->shape[0], d[2]->local->shape[1]);
        printf("out gathered: largest difference from one device %.3g (largest element %.3g)\n", worst, big);
        if (s == SHARD_OK && !(worst <= 1e-5 * big))
            s = shard_error(SHARD_ERR_INTERNAL, "2-D product differs from one device by %g", worst);
        free(want);
    }
    for (int i = 0; i < 3; i++) shard_dtensor_destroy(d[i]), shard_tensor_destroy(full[i]);
    shard_mesh_destroy(mesh);
    return s;
}

int main(void) {
    int under_mpi = shard_launch_detect_mpi(NULL, 0, NULL, NULL);
    if (shard_launch(under_mpi ? 0 : 8, run, NULL) < 0) {
        fprintf(stderr, "shard: %s\n", shard_last_error());
        return 1;
    }
    return 0;
}
