/* moe_mlp.c — a mixture-of-experts model defined outside the library, through
 * the public headers only, registered as a model kind that splits its experts
 * over the mesh's `expert` axis (expert.h's dispatch and combine):
 *
 *   h = x P                         a dense projection [d, d]
 *   p = softmax(h G^T)              the router, G [E, d]
 *   c = argmax p, g = p[c]          top-1; the gate is the softmax probability
 *   y = h + g * (h W_c)             expert c's linear, W [E, d, d] stacked
 *
 * fitted by mean squared error to generated teacher rows (batch.h's teacher
 * source).  The experts' stack is one unit, split over `expert` (each expert
 * rank holds shard_expert_range of the E experts; the model marks it in
 * expert_split); P and G are the dense unit.  Each rank routes its rows:
 * the route counts them per expert, dispatch sends each row to its expert's
 * rank, combine brings the outputs back; in backward the gradient of the
 * experts' outputs goes out by dispatch and that of their inputs comes back
 * by combine.
 *
 * It checks, and exits 1 when one fails:
 *   - the backward against central differences of the forward (one rank);
 *   - the loss falls below half its first value;
 *   - one rank against expert=2, data=2 x expert=2, expert=4 (E = 6: experts
 *     2, 2, 1, 1), and data=2 x expert=2 under ZeRO-1 and ZeRO-3: the same
 *     losses and gradient norms within 1e-5 relative for 10 steps;
 *   - a checkpoint saved at step 5 under data=2 x expert=2 (ZeRO-3) holds
 *     the experts whole ([E, d, d]) and resumes on expert=4 with the same
 *     losses as the uninterrupted run.
 *
 *   build/examples/moe_mlp        thread ranks (1, 2 and 4) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shard/shard.h"

#define KIND "moe_mlp"
#define STEPS 10
#define BATCH 16
#define DIM 8
#define EXPERTS 6
#define CONFIG "{\"model_type\": \"" KIND "\", \"dim\": 8, \"experts\": 6}"

/* ---------------------------------------------------------------- the model */

typedef struct moe_mlp {
    shard_model model; /* first: the table's shard_model is this struct */
    size_t d, experts, first, local, max_rows;
    shard_comm *expert; /* the expert axis (NULL: every expert here) */
    shard_params *params;
    unsigned char split[3]; /* the model's expert_split: the experts' stack only */
    shard_expert_route *route;
    int32_t *choice;
    /* per row (max_rows): inputs, activations and their gradients; per expert row (cap): the exchanged */
    float *x, *target, *h, *p, *gate, *yc, *dy, *dyc, *dh;
    float *xe, *ye, *dye, *dxe;
    size_t cap;
} moe_mlp;

enum { PROJ = 0, ROUTER = 1, EXPERT_STACK = 2 }; /* the parameters; units: {P, G}, {W} */

static moe_mlp *impl(const shard_model *m) { return (moe_mlp *)m->impl; }

static shard_status set_batch(shard_model *m, const shard_batch *b) {
    moe_mlp *p = impl(m);
    SHARD_CHECK(shard_model_check_batch(m, b, p->max_rows, SHARD_F32, p->d, SHARD_F32, p->d));
    memcpy(p->x, b->inputs, b->rows * p->d * sizeof *p->x);
    memcpy(p->target, b->targets, b->rows * p->d * sizeof *p->target);
    return SHARD_OK;
}

static size_t batch_items(const shard_model *m) { return m->rows; }

/* Room for `rows` exchanged rows in each of the four expert-side buffers. */
static shard_status expert_room(moe_mlp *p, size_t rows) {
    if (rows <= p->cap) return SHARD_OK;
    shard_free(p->xe);
    size_t n = rows * p->d;
    if (!(p->xe = shard_alloc(4 * n * sizeof(float), SHARD_MEM_ACTIVATIONS))) {
        p->cap = 0;
        return shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory for %zu expert rows", rows);
    }
    p->ye = p->xe + n, p->dye = p->ye + n, p->dxe = p->dye + n, p->cap = rows;
    return SHARD_OK;
}

/* Each local expert's linear over its rows, forward or backward (the gradients of the experts' stack). */
static shard_status experts_run(shard_model *m, int backward) {
    moe_mlp *p = impl(m);
    size_t d = p->d, at = 0;
    SHARD_CHECK(shard_model_acquire(m, 1, backward));
    for (size_t e = 0; e < p->local; e++) {
        size_t rows = shard_expert_route_rows(p->route, e);
        const float *w = m->value[EXPERT_STACK] + e * d * d;
        shard_status s = SHARD_OK;
        if (rows && !backward) s = shard_linear_forward(p->xe + at * d, w, NULL, p->ye + at * d, rows, d, d);
        if (rows && backward)
            s = shard_linear_backward(p->xe + at * d, w, p->dye + at * d, p->dxe + at * d,
                                      m->grad[EXPERT_STACK] + e * d * d, NULL, rows, d, d);
        if (s < 0) return s;
        at += rows;
    }
    SHARD_CHECK(shard_model_release(m, 1, backward));
    return backward ? shard_model_grads_ready(m, 1) : SHARD_OK;
}

/* Every rank runs the whole forward, rows or none: the route and the exchanges are collective. */
static shard_status forward(shard_model *m, double denominator, double *loss) {
    moe_mlp *p = impl(m);
    size_t n = m->rows, d = p->d, E = p->experts;
    *loss = 0;
    SHARD_CHECK(shard_model_acquire(m, 0, 0));
    if (n) SHARD_CHECK(shard_linear_forward(p->x, m->value[PROJ], NULL, p->h, n, d, d));
    if (n) SHARD_CHECK(shard_sgemm(0, 1, n, E, d, 1.0f, p->h, d, m->value[ROUTER], d, 0.0f, p->p, E));
    SHARD_CHECK(shard_model_release(m, 0, 0));
    if (n) shard_softmax_forward(p->p, p->p, n, E);
    for (size_t i = 0; i < n; i++) { /* top-1: the first of the largest */
        size_t c = 0;
        for (size_t e = 1; e < E; e++) c = p->p[i * E + e] > p->p[i * E + c] ? e : c;
        p->choice[i] = (int32_t)c, p->gate[i] = p->p[i * E + c];
    }
    shard_expert_route_destroy(p->route);
    p->route = NULL;
    SHARD_CHECK(shard_expert_route_create(p->expert, E, p->choice, n, &p->route));
    SHARD_CHECK(expert_room(p, shard_expert_route_total(p->route)));
    SHARD_CHECK(shard_expert_dispatch(p->route, p->h, p->xe, d));
    SHARD_CHECK(experts_run(m, 0));
    SHARD_CHECK(shard_expert_combine(p->route, p->ye, p->yc, d));
    double total = 0, k = denominator > 0 ? 2.0 / ((double)d * denominator) : 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < d; j++) {
            double e = (double)p->h[i * d + j] + (double)p->gate[i] * p->yc[i * d + j] - p->target[i * d + j];
            total += e * e;
            p->dy[i * d + j] = (float)(k * e);
        }
    *loss = denominator > 0 ? total / (double)d / denominator : 0;
    return SHARD_OK;
}

static shard_status backward(shard_model *m) {
    moe_mlp *p = impl(m);
    size_t n = m->rows, d = p->d, E = p->experts;
    for (size_t i = 0; i < n * d; i++) p->dyc[i] = p->gate[i / d] * p->dy[i];
    SHARD_CHECK(shard_expert_dispatch(p->route, p->dyc, p->dye, d)); /* combine's backward */
    SHARD_CHECK(experts_run(m, 1));
    SHARD_CHECK(shard_expert_combine(p->route, p->dxe, p->dh, d)); /* dispatch's backward */
    /* the router: d loss / d gate, through the softmax into the logits (kept in p, now their gradient) */
    for (size_t i = 0; i < n; i++) {
        double dg = 0;
        for (size_t j = 0; j < d; j++) dg += (double)p->dy[i * d + j] * p->yc[i * d + j];
        size_t c = (size_t)p->choice[i];
        float pc = p->p[i * E + c];
        for (size_t e = 0; e < E; e++) p->p[i * E + e] = (float)(dg * pc * ((e == c) - p->p[i * E + e]));
    }
    for (size_t i = 0; i < n * d; i++) p->dh[i] += p->dy[i]; /* the residual */
    SHARD_CHECK(shard_model_acquire(m, 0, 1));
    if (n) {
        SHARD_CHECK(shard_sgemm(1, 0, E, d, n, 1.0f, p->p, E, p->h, d, 1.0f, m->grad[ROUTER], d));
        SHARD_CHECK(shard_sgemm(0, 0, n, d, E, 1.0f, p->p, E, m->value[ROUTER], d, 1.0f, p->dh, d));
        SHARD_CHECK(shard_linear_backward(p->x, m->value[PROJ], p->dh, NULL, m->grad[PROJ], NULL, n, d, d));
    }
    SHARD_CHECK(shard_model_release(m, 0, 1));
    return shard_model_grads_ready(m, 0);
}

/* Element `first` on of each tensor as one rank holding all of it draws them: the experts' stack from
 * this rank's first expert. */
static void init(shard_model *m, uint64_t seed) {
    moe_mlp *p = impl(m);
    size_t d = p->d;
    shard_init_normal(m->value[PROJ], 0, d * d, 0.3f / sqrtf((float)d), seed, "proj.weight");
    shard_init_normal(m->value[ROUTER], 0, p->experts * d, 1.0f, seed, "gate.weight");
    shard_init_normal(m->value[EXPERT_STACK], p->first * d * d, p->local * d * d, 0.5f / sqrtf((float)d), seed,
                      "experts.weight");
}

static void describe(const shard_model *m, char *out, size_t bytes) {
    const moe_mlp *p = impl(m);
    snprintf(out, bytes, "MoE MLP h = x P, y = h + g h W_c (top-1 of %zu experts, %zu here), dim %zu", p->experts,
             p->local, p->d);
}

static void destroy(shard_model *m) {
    moe_mlp *p = impl(m);
    shard_model_free_units(m);
    shard_params_destroy(p->params);
    shard_expert_route_destroy(p->route);
    shard_free(p->x), shard_free(p->xe);
    free(p->choice), free(p);
}

static const shard_model_ops moe_mlp_ops = {.struct_size = sizeof(shard_model_ops),
                                            .kind = KIND,
                                            .set_batch = set_batch,
                                            .batch_items = batch_items,
                                            .forward = forward,
                                            .backward = backward,
                                            .init = init,
                                            .describe = describe,
                                            .destroy = destroy};

/* A positive integer key of the config text ("dim": 8); 0 when absent or not one. */
static size_t config_size(const char *text, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    const char *at = text ? strstr(text, quoted) : NULL;
    if (!at || !(at = strchr(at + strlen(quoted), ':'))) return 0;
    char *end;
    long v = strtol(at + 1, &end, 10);
    return end != at + 1 && v > 0 && v <= 4096 ? (size_t)v : 0;
}

/* The kind's create function: this expert rank's experts of the config's, buffers for o->max_rows rows. */
static shard_status moe_mlp_create(const shard_model_create_options *o, shard_model **out) {
    size_t d = config_size(o->config_text, "dim"), E = config_size(o->config_text, "experts");
    if (!d || !E)
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: key '%s' is missing or not an integer in 1..4096 (" KIND " keys: dim, experts)",
                           o->config_path, d ? "experts" : "dim");
    moe_mlp *p = calloc(1, sizeof *p);
    if (!p) return shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    p->d = d, p->experts = E, p->max_rows = o->max_rows ? o->max_rows : 1, p->expert = o->expert;
    int ranks = o->expert ? shard_comm_size(o->expert) : 1, rank = o->expert ? shard_comm_rank(o->expert) : 0;
    shard_expert_range(E, ranks, rank, &p->first, &p->local);
    p->model.impl = p, p->model.ops = &moe_mlp_ops;
    shard_param_info t[3] = {{.name = "proj.weight", .ndim = 2, .shape = {d, d}},
                             {.name = "gate.weight", .ndim = 2, .shape = {E, d}},
                             {.name = "experts.weight", .ndim = 3, .shape = {p->local, d, d}}};
    static const size_t unit_first[3] = {0, 2, 3}; /* the dense unit, the experts' unit */
    size_t R = p->max_rows;
    shard_status s = shard_params_create(t, 3, SHARD_MEM_PARAMS, &p->params);
    if (s == SHARD_OK) s = shard_model_setup_units(&p->model, p->params, unit_first, 2);
    if (s == SHARD_OK) {
        p->x = shard_alloc(R * (7 * d + E + 1) * sizeof(float), SHARD_MEM_ACTIVATIONS);
        p->choice = calloc(R, sizeof *p->choice);
        if (!p->x || !p->choice) s = shard_error(SHARD_ERR_NO_MEMORY, KIND ": out of memory");
    }
    if (s < 0) {
        destroy(&p->model);
        return s;
    }
    float **rows_d[] = {&p->target, &p->h, &p->yc, &p->dy, &p->dyc, &p->dh}, *at = p->x + R * d;
    for (size_t i = 0; i < 6; i++) *rows_d[i] = at, at += R * d;
    p->p = at, p->gate = at + R * E;
    p->split[EXPERT_STACK] = 1, p->model.expert_split = p->split;
    *out = &p->model;
    return SHARD_OK;
}

/* Its rows: the library's generated teacher rows of the model's width. */
static shard_status teacher_rows(const shard_model_create_options *o, const shard_model *m, shard_batch_source **out) {
    if (o->data_dir)
        return shard_error(SHARD_ERR_INVALID_ARG, "--data %s: " KIND " generates its rows; drop --data", o->data_dir);
    shard_batch_teacher_options t = {.struct_size = sizeof t,
                                     .name = KIND,
                                     .dim = impl(m)->d,
                                     .max_rows = o->max_rows ? o->max_rows : 1,
                                     .teacher_seed = 17};
    return shard_batch_source_teacher(&t, out);
}

/* ---------------------------------------------------------------- the checks */

/* The backward against central differences of the forward, one rank, one batch (a wrong gradient would
 * train every split alike).  Steps small enough to keep every row's expert. */
static shard_status check_gradient(void) {
    shard_model *m = NULL;
    shard_model_create_options o = {.struct_size = sizeof o, .config_text = CONFIG, .max_rows = BATCH};
    SHARD_CHECK(shard_model_create_with(&o, &m));
    shard_params *grads = NULL;
    shard_batch_source *src = NULL;
    shard_batch b;
    double loss = 0, worst = 0;
    shard_status s = shard_params_like(m->params, SHARD_MEM_GRADS, &grads);
    if (s == SHARD_OK) s = shard_model_batch_source(&o, m, &src);
    if (s == SHARD_OK) {
        m->ops->init(m, 3);
        shard_model_bind_grad_slab(m, grads->data);
        s = shard_batch_source_load(src, 3, 1, 0, BATCH, &b);
    }
    if (s == SHARD_OK) s = m->ops->set_batch(m, &b);
    if (s == SHARD_OK) s = m->ops->forward(m, BATCH, &loss);
    if (s == SHARD_OK) s = m->ops->backward(m);
    for (size_t i = 0; s == SHARD_OK && i < m->params->count; i++)
        for (size_t e = 0; s == SHARD_OK && e < m->params->info[i].numel; e += 5) {
            float *w = m->value[i] + e, keep = *w;
            double analytic = m->grad[i][e], up = 0, down = 0, step = 1e-3;
            *w = keep + (float)step;
            s = m->ops->forward(m, BATCH, &up);
            *w = keep - (float)step;
            if (s == SHARD_OK) s = m->ops->forward(m, BATCH, &down);
            *w = keep;
            double fd = (up - down) / (2 * step), off = fabs(fd - analytic) / (1e-3 + fabs(fd));
            worst = off > worst ? off : worst;
            if (s == SHARD_OK && off > 2e-2)
                s = shard_error(SHARD_ERR_INTERNAL, "%s[%zu]: backward gives %.6g, central differences %.6g",
                                m->params->info[i].name, e, analytic, fd);
        }
    if (s == SHARD_OK) printf("gradient: the backward within %.2g relative of central differences\n", worst);
    shard_params_destroy(grads);
    shard_batch_source_destroy(src);
    shard_model_destroy(m);
    return s;
}

typedef struct run {
    const char *mesh; /* NULL: one rank */
    int zero;
    const char *config_path;
    const char *save;                /* a checkpoint root: save at step 5 */
    const char *resume;              /* resume from it, then train to STEPS */
    double loss[STEPS], norm[STEPS]; /* the gradient norm too: AdamW's steps hardly show a wrong one */
} run;

static shard_status train(shard_comm *world, void *arg) {
    run *r = arg;
    shard_mesh *mesh = NULL;
    SHARD_CHECK(shard_mesh_create(world, r->mesh ? r->mesh : "data=1", &mesh));
    shard_trainer_config c = {.config_path = r->config_path,
                              .batch = BATCH,
                              .seed = 1,
                              .zero = r->zero,
                              .bucket_mb = 0.001 /* a bucket per unit */,
                              .adamw = shard_adamw_defaults(),
                              .lr = {3e-2f, 3e-3f, 2, STEPS},
                              .clip = 1.0f};
    shard_trainer *t = NULL;
    shard_status s = shard_trainer_create(mesh, &c, &t);
    uint64_t step = 1;
    if (s == SHARD_OK && r->resume) s = shard_trainer_resume(t, r->resume, &step), step++;
    for (; s == SHARD_OK && step <= STEPS; step++) {
        shard_step_result res;
        s = shard_trainer_step(t, step, &res);
        if (s == SHARD_OK && shard_comm_rank(world) == 0)
            r->loss[step - 1] = res.loss, r->norm[step - 1] = res.grad_norm;
        if (s == SHARD_OK && r->save && step == STEPS / 2) s = shard_trainer_save(t, r->save, step, CONFIG);
    }
    shard_trainer_destroy(t);
    shard_mesh_destroy(mesh);
    return s;
}

static int ranks_of(const char *mesh) {
    int n = 1;
    for (const char *at = mesh; at && (at = strchr(at, '=')); at++) n *= atoi(at + 1);
    return n;
}

static int agree(const char *what, const run *ref, const run *got, int from) {
    for (int i = from; i < STEPS; i++)
        for (int k = 0; k < 2; k++) {
            double a = k ? got->norm[i] : got->loss[i], b = k ? ref->norm[i] : ref->loss[i];
            double rel = fabs(a - b) / fmax(fabs(b), 1e-12);
            if (!(rel <= 1e-5)) {
                fprintf(stderr, KIND ": %s step %d: %s %.9g, one rank's %.9g (%.2g relative; at most 1e-5)\n", what,
                        i + 1, k ? "gradient norm" : "loss", a, b, rel);
                return 0;
            }
        }
    printf("%s: the one rank's losses and gradient norms within 1e-5 relative at steps %d..%d\n", what, from + 1,
           STEPS);
    return 1;
}

/* The checkpoint's experts.weight, exported as one file: whole, [E, d, d]. */
static int experts_whole(const char *root) {
    char path[4200];
    snprintf(path, sizeof path, "%s/export.safetensors", root);
    shard_safetensors *f = NULL;
    const shard_st_entry *e = NULL;
    if (shard_ckpt_export(root, path, UINT64_MAX, 0, NULL) == SHARD_OK && shard_safetensors_open(path, &f) == SHARD_OK)
        e = shard_safetensors_find(f, "experts.weight");
    int ok = e && e->ndim == 3 && e->shape[0] == EXPERTS && e->shape[1] == DIM && e->shape[2] == DIM;
    if (!ok) fprintf(stderr, KIND ": %s: experts.weight is not whole [%d, %d, %d]\n", path, EXPERTS, DIM, DIM);
    shard_safetensors_close(f);
    return ok;
}

int main(void) {
    static run one = {0},
               runs[] = {{.mesh = "expert=2"},
                         {.mesh = "data=2,expert=2"},
                         {.mesh = "expert=4"},
                         {.mesh = "data=2,expert=2", .zero = 1},
                         {.mesh = "data=2,expert=2", .zero = 3}};
    static run saved = {.mesh = "data=2,expert=2", .zero = 3}, resumed = {.mesh = "expert=4"};
    char path[4096] = "", root[4096] = "";
    const char *tmp = getenv("TMPDIR");
    shard_model_kind kind = {.struct_size = sizeof kind,
                             .name = KIND,
                             .create = moe_mlp_create,
                             .batch_source = teacher_rows,
                             .expert_parallel = 1};
    shard_status s = shard_model_register_kind(&kind);
    snprintf(path, sizeof path, "%s/moe_mlp.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    snprintf(root, sizeof root, "%s/moe_mlp_ckpt.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = s == SHARD_OK ? mkstemp(path) : -1;
    if (fd < 0 || write(fd, CONFIG, strlen(CONFIG)) != (ssize_t)strlen(CONFIG) || !mkdtemp(root))
        s = s < 0 ? s : shard_error(SHARD_ERR_IO, "%s: cannot write the config or make %s", path, root);
    if (fd >= 0) close(fd);
    if (s == SHARD_OK) s = check_gradient();
    one.config_path = path;
    if (s == SHARD_OK) s = shard_launch(1, train, &one);
    size_t n = sizeof runs / sizeof runs[0];
    for (size_t i = 0; s == SHARD_OK && i < n; i++)
        runs[i].config_path = path, s = shard_launch(ranks_of(runs[i].mesh), train, &runs[i]);
    saved.config_path = resumed.config_path = path, saved.save = resumed.resume = root;
    if (s == SHARD_OK) s = shard_launch(ranks_of(saved.mesh), train, &saved);
    int whole = s == SHARD_OK && experts_whole(root);
    if (s == SHARD_OK) s = shard_launch(ranks_of(resumed.mesh), train, &resumed);
    remove(path);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (root[0] && system(cmd) != 0) fprintf(stderr, KIND ": could not remove %s\n", root);
    if (s < 0) {
        fprintf(stderr, KIND ": %s\n", shard_last_error());
        return 1;
    }
    printf("one rank: loss %.5f at step 1, %.5f at step %d\n", one.loss[0], one.loss[STEPS - 1], STEPS);
    int ok = whole;
    for (size_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s, ZeRO-%d", runs[i].mesh, runs[i].zero);
        ok &= agree(what, &one, &runs[i], 0);
    }
    ok &= agree("saved at step 5 on data=2,expert=2 (ZeRO-3), resumed on expert=4", &one, &resumed, STEPS / 2);
    if (ok && !(one.loss[STEPS - 1] < one.loss[0] / 2))
        fprintf(stderr, KIND ": the loss went from %g to %g: not learning\n", one.loss[0], one.loss[STEPS - 1]), ok = 0;
    return ok ? 0 : 1;
}
