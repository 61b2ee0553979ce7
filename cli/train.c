/* train.c — `shard train`: single-device training of the GPT.
 *
 *   shard train --config CONFIG.json --data DIR --batch 8 --seq 128 --steps N --lr X --seed S
 *               [--init weights.safetensors] [--log run.jsonl] [--save DIR] [--save-every K]
 *               [--warmup W] [--min-lr X] [--weight-decay 0.1] [--clip 1.0]
 *
 * A step: the batch of (seed, step) from DIR/train.tokens, forward,
 * backward, clipping by the global gradient norm, the warm-up + cosine
 * learning rate, AdamW.  A progress bar on a terminal, plain lines
 * otherwise; --log writes a JSON line per step; --save writes a sharded
 * checkpoint (the config rides in its index) every K steps and at the end. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "comm/comm_impl.h"
#include "shard/shard.h"
#include "train_util.h"

typedef struct train_opts {
    const char *config, *data, *init, *log, *save;
    long batch, seq, steps, save_every, warmup;
    double lr, min_lr, weight_decay, clip;
    unsigned long long seed;
    int have_min_lr, have_warmup;
} train_opts;

static shard_status train_rank(shard_comm *comm, void *arg) {
    const train_opts *o = arg;
    shard_gpt_config c;
    SHARD_CHECK(shard_gpt_config_load(o->config, &c));
    if ((size_t)o->seq > c.n_positions)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'n_positions' = %zu is shorter than --seq %ld", o->config,
                           c.n_positions, o->seq);
    char path[4096];
    snprintf(path, sizeof path, "%s/train.tokens", o->data);
    shard_tokens *tokens = NULL;
    SHARD_CHECK(shard_tokens_open(path, &tokens));
    if (shard_tokens_vocab(tokens) > c.vocab_size) {
        shard_status s = shard_error(SHARD_ERR_INVALID_ARG, "%s: key 'vocab_size' = %zu is smaller than the data's vocabulary (%u)",
                                     o->config, c.vocab_size, shard_tokens_vocab(tokens));
        shard_tokens_close(tokens);
        return s;
    }
    size_t B = (size_t)o->batch, T = (size_t)o->seq;
    shard_gpt *g = NULL;
    shard_params *grads = NULL, *m = NULL, *v = NULL;
    int32_t *inputs = malloc(B * T * sizeof *inputs), *targets = malloc(B * T * sizeof *targets);
    FILE *log = NULL;
    shard_status s = inputs && targets ? shard_gpt_create(&c, B, T, &g) : shard_error(SHARD_ERR_NO_MEMORY, "train: out of memory");
    if (s == SHARD_OK) {
        shard_gpt_init(g, o->seed);
        if (o->init) s = shard_params_load(shard_gpt_params(g), o->init, 0, NULL);
    }
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_GRADS, &grads);
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_OPTIMIZER, &m);
    if (s == SHARD_OK) s = shard_params_like(shard_gpt_params(g), SHARD_MEM_OPTIMIZER, &v);
    if (s == SHARD_OK && o->log && !(log = fopen(o->log, "w")))
        s = shard_error(SHARD_ERR_IO, "--log %s: cannot open: %s", o->log, strerror(errno));
    shard_params *p = g ? shard_gpt_params(g) : NULL;
    shard_adamw_config ac = shard_adamw_defaults();
    ac.weight_decay = (float)o->weight_decay;
    shard_lr_schedule sched = {(float)o->lr, (float)(o->have_min_lr ? o->min_lr : o->lr / 10),
                               (uint64_t)(o->have_warmup ? o->warmup : (o->steps >= 20 ? o->steps / 20 : 0)),
                               (uint64_t)o->steps};
    int tty = isatty(STDOUT_FILENO);
    double started = shard__now(), first_loss = 0, last_loss = 0, tokens_done = 0;
    if (s == SHARD_OK)
        printf("train: GPT %zu layers x %zu wide, %zu heads, vocab %zu: %.2f M parameters; batch %zu x %zu tokens, %ld steps\n"
               "  blas: %s\n",
               c.n_layer, c.n_embd, c.n_head, c.vocab_size, (double)shard_gpt_param_count(&c) / 1e6, B, T, o->steps,
               shard_blas_description());
    for (long step = 1; step <= o->steps && s == SHARD_OK; step++) {
        double t0 = shard__now();
        float loss = 0;
        s = shard_tokens_batch(tokens, o->seed, (uint64_t)step, 0, B, T, inputs, targets);
        if (s == SHARD_OK) {
            shard_params_zero(grads);
            s = shard_gpt_forward(g, inputs, targets, B, T, &loss);
        }
        if (s == SHARD_OK) s = shard_gpt_backward(g, grads);
        double norm = s == SHARD_OK ? sqrt(shard_sum_squares(grads->data, grads->total)) : 0;
        if (s == SHARD_OK && o->clip > 0) shard_scale(grads->data, grads->total, shard_clip_factor(norm, (float)o->clip));
        float lr = shard_lr_at(&sched, (uint64_t)step);
        if (s == SHARD_OK) shard_adamw_update(&ac, (uint64_t)step, lr, p->data, grads->data, m->data, v->data, p->total);
        double ms = (shard__now() - t0) * 1e3, tps = (double)(B * T) / (ms / 1e3);
        if (s < 0) break;
        if (!isfinite(loss)) {
            s = shard_error(SHARD_ERR_INTERNAL, "train: the loss became %g at step %ld (try a lower --lr)", loss, step);
            break;
        }
        if (step == 1) first_loss = loss;
        last_loss = loss, tokens_done += (double)(B * T);
        if (log)
            fprintf(log, "{\"step\": %ld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6g, \"tokens_per_s\": %.1f, \"ms\": %.3f}\n",
                    step, loss, lr, norm, tps, ms);
        cli_progress(tty, step, o->steps, loss, lr, tps, ms);
        if (o->save && s == SHARD_OK && ((o->save_every > 0 && step % o->save_every == 0) || step == o->steps))
            s = train_save_checkpoint(comm, o->save, (uint64_t)step, p, o->config);
    }
    if (tty) printf("\n");
    if (s == SHARD_OK)
        printf("train: %ld steps in %.1f s, loss %.4f -> %.4f, %.0f tokens/s on average%s%s\n", o->steps,
               shard__now() - started, first_loss, last_loss, tokens_done / (shard__now() - started),
               o->save ? ", checkpoint in " : "", o->save ? o->save : "");
    if (log) fclose(log);
    free(inputs), free(targets);
    shard_params_destroy(grads), shard_params_destroy(m), shard_params_destroy(v);
    shard_gpt_destroy(g);
    shard_tokens_close(tokens);
    return s;
}

int cli_train(int argc, char **argv) {
    train_opts o = {.batch = 8, .seq = 128, .steps = 100, .lr = 1e-3, .seed = 1, .weight_decay = 0.1, .clip = 1.0};
    cli_common common = {0};
    for (int i = 1; i < argc; i++) {
        int cc = cli_common_option(&common, argc, argv, &i);
        if (cc < 0) return 2;
        if (cc > 0) continue;
        const char *a = argv[i], *val = NULL;
        const char **strs[] = {&o.config, &o.data, &o.init, &o.log, &o.save};
        const char *str_names[] = {"--config", "--data", "--init", "--log", "--save"};
        int done = 0;
        for (int k = 0; k < 5 && !done; k++)
            if (strcmp(a, str_names[k]) == 0) {
                if (!(*strs[k] = cli_value(argc, argv, &i))) return 2;
                done = 1;
            }
        if (done) continue;
        long *ints[] = {&o.batch, &o.seq, &o.steps, &o.save_every, &o.warmup};
        const char *int_names[] = {"--batch", "--seq", "--steps", "--save-every", "--warmup"};
        const long lo[] = {1, 1, 1, 0, 0}, hi[] = {1 << 20, 1 << 20, 1L << 40, 1L << 40, 1L << 40};
        for (int k = 0; k < 5 && !done; k++)
            if (strcmp(a, int_names[k]) == 0) {
                if (!(val = cli_value(argc, argv, &i)) || cli_parse_int(a, val, lo[k], hi[k], ints[k])) return 2;
                if (k == 4) o.have_warmup = 1;
                done = 1;
            }
        if (done) continue;
        double *dbls[] = {&o.lr, &o.min_lr, &o.weight_decay, &o.clip};
        const char *dbl_names[] = {"--lr", "--min-lr", "--weight-decay", "--clip"};
        for (int k = 0; k < 4 && !done; k++)
            if (strcmp(a, dbl_names[k]) == 0) {
                char *end = NULL;
                if (!(val = cli_value(argc, argv, &i))) return 2;
                *dbls[k] = strtod(val, &end);
                if (!end || *end || !(*dbls[k] >= 0) || (k == 0 && !(*dbls[k] > 0)) || *dbls[k] > 1e6) {
                    cli_error("%s '%s' is invalid: give a number%s", a, val, k == 0 ? " > 0, e.g. 3e-4" : " >= 0");
                    return 2;
                }
                if (k == 1) o.have_min_lr = 1;
                done = 1;
            }
        if (done) continue;
        if (strcmp(a, "--seed") == 0) {
            long sd;
            if (!(val = cli_value(argc, argv, &i)) || cli_parse_int(a, val, 0, 1L << 62, &sd)) return 2;
            o.seed = (unsigned long long)sd;
            continue;
        }
        cli_error("train: unknown option '%s' (see 'shard help')", a);
        return 2;
    }
    if (!o.config || !o.data) {
        cli_error("train: --config CONFIG.json and --data DIR are required");
        return 2;
    }
    if (common.ranks > 1) {
        cli_error("train: --ranks %d is invalid: shard train runs one rank (single-device training); give --ranks 1",
                  common.ranks);
        return 2;
    }
    common.ranks = 1;
    shard_launch_config launch = cli_launch_config(&common);
    shard_status s = shard_launch_with(&launch, train_rank, &o);
    if (s < 0) {
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
