/* generate.c — `shard generate`: text from the GPT, byte-level tokens.
 *
 *   shard generate (--ckpt DIR | --config CONFIG.json --init weights.safetensors)
 *                  --prompt "..." --tokens N [--temperature T] [--top-k K] [--seed S]
 *
 * Token ids are the prompt's bytes (0-255); a model with a larger vocabulary
 * is sampled over its first 256 ids.  Each new token comes from the
 * logits of the last position over at most n_positions tokens: temperature
 * 0 takes the arg-max (greedy); otherwise softmax(logits / T) restricted to
 * the K most likely (K 0: all), sampled with a seeded generator
 * (shard/sample.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/shard.h"
#include "train_util.h"

typedef struct gen_opts {
    const char *ckpt, *config, *init, *prompt;
    long tokens, top_k;
    double temperature;
    unsigned long long seed;
} gen_opts;

static shard_status generate_rank(shard_comm *comm, void *arg) {
    const gen_opts *o = arg;
    shard_gpt_config c;
    if (o->ckpt) {
        char *text = NULL;
        SHARD_CHECK(shard_ckpt_read_config(o->ckpt, &text));
        shard_status s = shard_gpt_config_parse(text, o->ckpt, &c);
        free(text);
        SHARD_CHECK(s);
    } else {
        SHARD_CHECK(shard_gpt_config_load(o->config, &c));
    }
    size_t plen = strlen(o->prompt), total = plen + (size_t)o->tokens, ctx = c.n_positions;
    if (c.vocab_size < 256)
        return shard_error(SHARD_ERR_INVALID_ARG, "generate: the model's vocab_size %zu cannot hold byte tokens (256)",
                           c.vocab_size);
    if (plen == 0)
        return shard_error(SHARD_ERR_INVALID_ARG, "generate: --prompt is empty; give at least one character");
    if (total < ctx) ctx = total; /* activations for the tokens there will be, not all n_positions */
    shard_gpt *g = NULL;
    SHARD_CHECK(shard_gpt_create(&c, 1, ctx, &g));
    shard_status s = o->ckpt ? train_load_checkpoint(comm, o->ckpt, shard_gpt_model(g), NULL)
                             : train_load_weights(o->init, shard_gpt_model(g));
    int32_t *ids = malloc(total * sizeof *ids);
    if (s == SHARD_OK && !ids) s = shard_error(SHARD_ERR_NO_MEMORY, "generate: out of memory");
    for (size_t i = 0; s == SHARD_OK && i < plen; i++) ids[i] = (unsigned char)o->prompt[i];
    uint64_t rng = o->seed;
    int write_errno = 0;
    int printed = s == SHARD_OK;
    if (printed) fwrite(o->prompt, 1, plen, stdout);
    for (size_t n = plen; s == SHARD_OK && n < total; n++) {
        size_t T = n < ctx ? n : ctx;
        s = shard_gpt_forward(g, ids + (n - T), NULL, 1, T, NULL);
        if (s < 0) break;
        /* byte tokens: a model with a larger vocabulary is sampled over its first 256 ids, the bytes */
        int next = 0;
        s = shard_sample_token(shard_gpt_logits(g) + (T - 1) * c.vocab_size, 256, o->temperature, (size_t)o->top_k,
                               &rng, &next);
        if (s == SHARD_ERR_INVALID_ARG) { /* a logit not finite: said in terms of the model */
            s = shard_error(SHARD_ERR_INVALID_ARG,
                            "generate: the model's logits at token %zu are NaN or infinite: its "
                            "weights are not finite (a diverged run?)",
                            n - plen + 1);
        }
        if (s < 0) break;
        ids[n] = next;
        if (fputc(next, stdout) == EOF || fflush(stdout) != 0) { /* reported below */
            write_errno = errno ? errno : EIO;
            break;
        }
    }
    if (printed) fputc('\n', stdout); /* also before an error: its line does not follow the output's */
    if (s == SHARD_OK && !write_errno && fflush(stdout) != 0) write_errno = errno ? errno : EIO;
    if (s == SHARD_OK && (write_errno || ferror(stdout)))
        s = shard_error(SHARD_ERR_IO, "generate: cannot write the text to standard output: %s",
                        write_errno ? strerror(write_errno) : "a write failed");
    free(ids);
    shard_gpt_destroy(g);
    return s;
}

static const char *const USAGE =
    "usage: shard generate (--ckpt DIR | --config CONFIG.json --init W.safetensors) --prompt TEXT [options]\n"
    "\n"
    "Text from the GPT, byte-level tokens: the prompt, then --tokens more, each from the last position's\n"
    "logits over at most n_positions tokens (a model with a larger vocabulary is sampled over its first\n"
    "256 ids, the bytes).  One rank.\n"
    "\n"
    "options:\n"
    "  --ckpt DIR               a checkpoint (a root or a step_N directory): its config and weights\n"
    "  --config FILE            the GPT's config JSON, with --init (instead of --ckpt)\n"
    "  --init FILE              the weights, a .safetensors file, with --config\n"
    "  --prompt TEXT            the text to continue (required, not empty)\n"
    "  --tokens N               tokens to generate, 0..1048576 (default 64)\n"
    "  --temperature T          the softmax temperature, 0..100; 0: the most likely token each time\n"
    "                           (default 0.8)\n"
    "  --top-k K                sample among the K most likely tokens, 0..1073741824; 0: among all\n"
    "                           (default 40)\n"
    "  --seed S                 the sampler's seed, 0..2^62 (default 1)\n";

int cli_generate(int argc, char **argv) {
    if (cli_help_asked(argc, argv, 1)) return cli_usage(USAGE, 0);
    gen_opts o = {.tokens = 64, .temperature = 0.8, .top_k = 40, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        long n;
        if (strcmp(a, "--ckpt") == 0) {
            if (!(o.ckpt = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--config") == 0) {
            if (!(o.config = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--init") == 0) {
            if (!(o.init = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--prompt") == 0) {
            if (!(o.prompt = cli_value(argc, argv, &i))) return 2;
        } else if (strcmp(a, "--tokens") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 20, &o.tokens)) return 2;
        } else if (strcmp(a, "--top-k") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1 << 30, &o.top_k)) return 2;
        } else if (strcmp(a, "--seed") == 0) {
            if (!(v = cli_value(argc, argv, &i)) || cli_parse_int(a, v, 0, 1L << 62, &n)) return 2;
            o.seed = (unsigned long long)n;
        } else if (strcmp(a, "--temperature") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_number(v, &o.temperature) || !(o.temperature >= 0) || o.temperature > 100) {
                cli_error("--temperature '%s' is invalid: give a number in 0..100 (0: greedy)", v);
                return 2;
            }
        } else {
            cli_unknown_option("generate", a, USAGE);
            return 2;
        }
    }
    if (o.ckpt && (o.config || o.init)) {
        cli_error(
            "generate: --ckpt DIR carries its config and weights: give it alone, or --config with --init instead");
        return 2;
    }
    if (!o.prompt || (!o.ckpt && !(o.config && o.init))) {
        cli_error(
            "generate: give --prompt and either --ckpt DIR or --config CONFIG.json with --init weights.safetensors");
        return 2;
    }
    shard_launch_config launch = shard_launch_config_default();
    launch.ranks = 1;
    shard_status s = shard_launch_with(&launch, generate_rank, &o);
    if (s < 0) {
        fflush(stdout);
        cli_error("%s", shard_last_error());
        return 1;
    }
    return 0;
}
