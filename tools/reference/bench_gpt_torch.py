#!/usr/bin/env python3
"""bench_gpt_torch.py — PyTorch's training step on shard's GPT definition, for `shard bench train`.

usage: bench_gpt_torch.py CONFIG.json BATCH SEQ STEPS WARMUP THREADS
Builds the same GPT as tools/reference/gpt_golden.py (torch ops, Hugging Face layout) from the config,
trains on random tokens with AdamW (clipping at 1.0, as shard train), and prints one JSON line:
{"ms_per_step": median, "tokens_per_s": ..., "threads": ..., "torch": version}.
Run with OMP_WAIT_POLICY=PASSIVE (the fastest single-process setting measured).
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_golden  # noqa: E402


def main(config_path, batch, seq, steps, warmup, threads):
    torch.set_num_threads(threads)
    raw = json.load(open(config_path))
    c = {k: raw[k] for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size")}
    c["layer_norm_epsilon"] = raw.get("layer_norm_epsilon", 1e-5)
    gen = torch.Generator().manual_seed(1)
    w = {k: v.requires_grad_(True) for k, v in gpt_golden.make_weights(c, gen).items()}
    opt = torch.optim.AdamW(list(w.values()), lr=1e-3, weight_decay=0.1)
    times = []
    for step in range(warmup + steps):
        idx = torch.randint(0, c["vocab_size"], (batch, seq + 1), generator=gen)
        t0 = time.perf_counter()
        logits = gpt_golden.forward(w, c, idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), idx[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        if step >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    print(json.dumps({"ms_per_step": ms, "tokens_per_s": batch * seq / (ms / 1e3), "threads": threads,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    if len(sys.argv) != 7:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], *map(int, sys.argv[2:]))
