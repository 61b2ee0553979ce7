#!/usr/bin/env bash
# bench.sh — the tables of docs/performance.md: threads all_reduce on 2 ranks, the MPI backend
# against the raw MPI call in the same run, and the redistribution transitions.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build/shard bench comm --op all_reduce --ranks 2 --min 1M --max 256M --iters 10
for op in all_reduce all_gather reduce_scatter all_to_all sendrecv; do
  mpiexec.openmpi --oversubscribe -np 2 build/shard bench comm --op "$op" --min 1M --max 64M --iters 10
done
# the redistribution table: the five transitions at 64 MiB, threads and MPI
build/shard bench redistribute --ranks 2
mpiexec.openmpi --oversubscribe -np 2 build/shard bench redistribute
# the checkpoint table: a 1 GiB model saved and loaded on 4 ranks
build/shard bench ckpt --ranks 4
# the GEMM table (the environment's OPENBLAS_CORETYPE is overridden by shard)
for t in 1 2; do OPENBLAS_CORETYPE=Haswell build/shard bench gemm --threads "$t"; done
# the training-step comparison (PyTorch from Debian's python3-torch, if installed)
build/shard bench train --config configs/gpt-bench.json --batch 8 --seq 128
# the data-parallel / ZeRO table (PyTorch DDP in the same run for zero 0) and memory on 4 ranks
build/shard bench train --config configs/gpt-bench.json --ranks 2 --zero 0 --bucket-mb 4
for z in 1 2 3; do build/shard bench train --config configs/gpt-bench.json --ranks 2 --zero "$z" --bucket-mb 4 --no-torch; done
for z in 0 1 2 3; do build/shard bench train --config configs/gpt-bench.json --ranks 4 --zero "$z" --no-torch --warmup 1; done
# the tensor-parallel table
build/shard bench tensor --config configs/gpt-bench.json --ranks 2
# the pipeline tables (bubbles, activations per stage, pipe=2 against one rank)
build/shard bench pipeline --config configs/gpt-bench.json --ranks 2
