#!/usr/bin/env python3
"""bench_gpt_ddp_torch.py — PyTorch DDP's training step on shard's GPT, for `shard bench train --ranks N`.

usage: bench_gpt_ddp_torch.py CONFIG.json GLOBAL_BATCH SEQ STEPS WARMUP WORLD [BUCKET_MB]
WORLD processes (gloo, one thread each: the DDP setting of the comparison), each with GLOBAL_BATCH / WORLD rows of
random tokens (GLOBAL_BATCH a multiple of WORLD); AdamW with clipping at 1.0 as shard train; gradient
buckets of BUCKET_MB MiB (DDP's bucket_cap_mb; default 25, DDP's own), as shard's --bucket-mb.  Prints one JSON line from rank 0:
{"ms_per_step": median over STEPS after WARMUP, "world": ..., "torch": version}.
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_golden  # noqa: E402


class GPT(torch.nn.Module):
    def __init__(self, c, gen):
        super().__init__()
        self.c = c
        self.w = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v)
                                         for k, v in gpt_golden.make_weights(c, gen).items()})
        self.names = {k.replace(".", "_"): k for k in gpt_golden.make_weights(c, torch.Generator().manual_seed(0))}

    def forward(self, idx):
        return gpt_golden.forward({self.names[k]: v for k, v in self.w.items()}, self.c, idx)


def rank_main(rank, world, config_path, batch, seq, steps, warmup, bucket_mb, port):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    raw = json.load(open(config_path))
    c = {k: raw[k] for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size")}
    c["layer_norm_epsilon"] = raw.get("layer_norm_epsilon", 1e-5)
    model = torch.nn.parallel.DistributedDataParallel(GPT(c, torch.Generator().manual_seed(1)), bucket_cap_mb=bucket_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    gen = torch.Generator().manual_seed(2 + rank)
    times = []
    for step in range(warmup + steps):
        idx = torch.randint(0, c["vocab_size"], (batch // world, seq + 1), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        print(json.dumps({"ms_per_step": statistics.median(times), "world": world, "torch": torch.__version__}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) not in (7, 8):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    cfg, (b, t, s, w, n) = sys.argv[1], map(int, sys.argv[2:7])
    bucket = float(sys.argv[7]) if len(sys.argv) == 8 else 25.0
    if b % n:
        print(f"bench_gpt_ddp_torch.py: global batch {b} does not divide over {n} processes", file=sys.stderr)
        sys.exit(2)
    mp.spawn(rank_main, args=(n, cfg, b, t, s, w, bucket, 29500 + os.getpid() % 1000), nprocs=n, join=True)
