/* main.c — the `shard` command line: dispatch to one verb per file.
 *
 *   shard bench comm --op all_reduce --ranks 2 [--json] ...
 *   shard bench redistribute --ranks 2 [--mesh data=2] [--bytes 64M] [--json]
 *   shard demo [--ranks 4]
 *   shard inspect spec --mesh data=4,tensor=2 --shape 128,4096 --spec "P('data','tensor')"
 *   shard inspect ckpt DIR|FILE|NAME.index.json [--verify]
 *   shard ckpt export DIR --out model.safetensors [--max-shard-size 5G] [--optimizer]
 *   shard data text FILE... --out DIR [--val-fraction 0.1]
 *   shard train --config CONFIG.json --data DIR --batch 8 --seq 128 --steps N --lr X --seed S ...
 *   shard generate (--ckpt DIR | --config CONFIG.json --init W.safetensors) --prompt "..." --tokens N
 *   shard version | --version */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_comm.h"
#include "cli_util.h"
#include "shard/shard.h"

static void usage(FILE *to) {
    fprintf(to,
            "usage: shard <verb> [options]\n"
            "\n"
            "verbs:\n"
            "  bench comm   collective bandwidth (nccl-tests style): [--op all_reduce|all_gather|\n"
            "               reduce_scatter|all_to_all|sendrecv] [--ranks 1] [--backend threads|mpi]\n"
            "               [--min 4K] [--max 256M] [--dtype f32] [--iters K] [--json]\n"
            "  bench redistribute  the common spec transitions of a 2-D f32 tensor timed against\n"
            "               their collective: --ranks N [--mesh data=N] [--bytes 64M] [--iters 7] [--json]\n"
            "  bench ckpt   save / load throughput of a sharded model beside plain write / read:\n"
            "               --ranks 4 [--bytes 1G] [--iters 5] [--dir DIR] [--keep] [--json]\n"
            "  bench gemm   sgemm GFLOP/s (OpenBLAS, kernels chosen for this CPU) against the FMA peak\n"
            "               measured in the same run: [--size 4096] [--threads 1] [--iters 5] [--json]\n"
            "  bench train  the GPT's training step (ms/step, tokens/s, MFU), its matrix products timed alone\n"
            "               and their time at the FMA peak, and PyTorch's step in the same run:\n"
            "               --config C.json [--batch 8] [--seq 128] [--steps 20] [--warmup 3] [--threads 2]\n"
            "               [--no-torch] [--json]; data parallel against PyTorch DDP: --ranks N (or --mesh data=N)\n"
            "               --zero 0..3 [--bucket-mb 25]\n"
            "               [--grad-dtype bf16] [--compute-dtype bf16]\n"
            "  bench tensor the GPT tensor parallel (and sequence parallel) on --ranks T against one rank:\n"
            "               ms/step, forward latency, bytes on the tensor axis against their formula,\n"
            "               activation bytes: --config C.json [--batch 8] [--seq 128] [--steps 10] [--json]\n"
            "  bench pipeline the GPT pipelined over --ranks P: each schedule's measured bubble against its\n"
            "               formula (m = 4, 8, 16), activation bytes per stage (GPipe, 1F1B, recompute),\n"
            "               ms/step against one rank: --config C.json [--batch 8] [--seq 128] [--steps 10] [--json]\n"
            "  data text    byte-level tokens of text files: FILE... --out DIR [--val-fraction 0.1]\n"
            "               (train.tokens, val.tokens, meta.json; token = byte value)\n"
            "  train        train a model (the config's model_type: gpt2, cnn, mlp) on a data mesh:\n"
            "               --config CONFIG.json --data DIR [--batch 8 (global)] [--ranks N]\n"
            "               [--mesh data=D,tensor=T,pipe=P] [--sequence-parallel] [--zero 0|1|2|3] [--accum K]\n"
            "               [--micro-batch M] [--bucket-mb 25]\n"
            "               [--grad-dtype f32|bf16] [--compute-dtype f32|bf16] [--resume DIR]\n"
            "               [--seq 128] [--steps N] [--lr 1e-3] [--seed S] [--init W.safetensors]\n"
            "               [--log run.jsonl] [--save DIR] [--save-every K] [--warmup W] [--min-lr X]\n"
            "               [--weight-decay 0.1] [--clip 1.0]\n"
            "               [--spec NAME=SPEC ...] the GPT's parameter placement on the tensor axis\n"
            "               (default Megatron: heads, MLP columns, vocabulary split; P(): whole),\n"
            "               e.g. --spec 'h.*.mlp.*=P()'; [--print-specs] lists every parameter's placement\n"
            "               pipe > 1: [--schedule gpipe|1f1b|interleaved] [--micro-batches M (= --accum)]\n"
            "               [--virtual-stages V] [--recompute] [--layers-per-stage 3,3,2|balanced] [--trace run.json]\n"
            "  generate     text from the GPT: (--ckpt DIR | --config C.json --init W.safetensors)\n"
            "               --prompt TEXT [--tokens 64] [--temperature 0.8] [--top-k 40] [--seed S]\n"
            "  demo         ranks exchanging data, then the all_reduce benchmark at a few sizes [--ranks 4]\n"
            "  inspect spec describe a sharding without running ranks: --mesh data=4,tensor=2\n"
            "               --shape 128,4096 --spec \"P('data','tensor')\" [--dtype f32]\n"
            "               [--to SPEC] (also print the redistribution plan to SPEC)\n"
            "  inspect schedule a pipeline schedule as an ASCII timeline per rank, its peak micro-batches\n"
            "               and bubble: --pipe P --micro-batches M [--schedule 1f1b] [--virtual-stages V]\n"
            "               [--backward-cost 2] (a backward's time in forwards)\n"
            "  inspect ckpt a checkpoint (DIR: a root or a step_N), a .safetensors FILE or a sharded\n"
            "               export's NAME.index.json: tensors, dtypes, shapes, specs, chunks; --verify checks\n"
            "               sizes and xxh3 checksums\n"
            "  ckpt export  a checkpoint's model tensors, full: DIR --out model.safetensors\n"
            "               [--max-shard-size 5G] (past it: model-0000k-of-0000N + index, as Hugging Face)\n"
            "               [--optimizer] (AdamW's moments too)\n"
            "  version      print the library's version and the backends in this build (also --version)\n"
            "\n"
            "options every verb that runs ranks takes:\n"
            "  --ranks N        ranks as threads of this process (under mpirun: one per process)\n"
            "  --backend B      threads | mpi | auto (default: mpi when started by mpirun, else threads)\n"
            "  --timeout S      deadline of every wait in seconds (default SHARD_TIMEOUT or 300)\n"
            "  --verbose        say which backend and environment variables were used\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *verb = argv[1];
    if (strcmp(verb, "bench") == 0) return cli_bench(argc - 1, argv + 1);
    if (strcmp(verb, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(verb, "inspect") == 0) return cli_inspect(argc - 1, argv + 1);
    if (strcmp(verb, "ckpt") == 0) return cli_ckpt(argc - 1, argv + 1);
    if (strcmp(verb, "data") == 0) return cli_data(argc - 1, argv + 1);
    if (strcmp(verb, "train") == 0) return cli_train(argc - 1, argv + 1);
    if (strcmp(verb, "generate") == 0) return cli_generate(argc - 1, argv + 1);
    int is_version = strcmp(verb, "version") == 0 || strcmp(verb, "--version") == 0;
    int is_help = strcmp(verb, "help") == 0 || strcmp(verb, "--help") == 0 || strcmp(verb, "-h") == 0;
    if ((is_version || is_help) && argc > 2) {
        cli_error("%s takes no arguments, not '%s'", verb, argv[2]);
        return 2;
    }
    if (is_version) {
        printf("shard %s (backends: threads%s)\n", shard_version(), shard_have_mpi() ? ", mpi" : "");
        return 0;
    }
    if (is_help) {
        usage(stdout);
        return 0;
    }
    cli_error("unknown verb '%s': valid verbs are bench, ckpt, data, demo, generate, inspect, train, version, help", verb);
    return 2;
}
