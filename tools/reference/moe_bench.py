#!/usr/bin/env python3
"""moe_bench.py — PyTorch's training step on shard's mixture-of-experts GPT, for `shard bench moe`.

usage: moe_bench.py CONFIG.json BATCH SEQ STEPS WARMUP THREADS
Builds the model of tools/reference/moe_golden.py (the GPT-2 decoder whose MoE MLP is a loop over
experts with index_select / index_add) from the config, with the capacity rule computed by a cumulative
count instead of a loop over tokens (the same assignments kept: per row, each expert admits its first
ceil(capacity_factor x T x k / E) in position order, then slot order).  Trains on random tokens with
AdamW (clipping at 1.0, as shard train) on the objective cross-entropy + aux and z losses at the config's
coefficients, on one process, and prints one JSON line:
{"ms_per_step": median, "tokens_per_s": ..., "threads": ..., "torch": version}.
Run with OMP_WAIT_POLICY=PASSIVE (as bench_gpt_torch.py).
"""
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_golden  # noqa: E402


def moe_mlp(w, p, c, x):
    """moe_golden.moe_mlp without its loop over tokens: (y, aux, z, dropped)."""
    b, t, C = x.shape
    E, K = c["num_local_experts"], c["num_experts_per_tok"]
    xf = x.reshape(-1, C)
    N = xf.shape[0]
    logits = xf @ w[p + "mlp.gate.weight"].t()
    probs = logits.softmax(dim=-1)
    sel, choice = probs.topk(K, dim=-1)  # ties: topk's order, a measure of speed, not of values
    gates = sel / sel.sum(dim=-1, keepdim=True) if K > 1 and c.get("norm_topk_prob", K > 1) else sel
    factor = c.get("expert_capacity_factor", 0)
    with torch.no_grad():
        onehot = F.one_hot(choice, E).reshape(b, t * K, E)  # per row: position-major, slot-minor
        if factor > 0:
            place = (onehot.cumsum(dim=1) * onehot).sum(dim=-1).reshape(N, K)  # 1-based place in its expert
            keep = place <= math.ceil(factor * t * K / E)
        else:
            keep = torch.ones(N, K, dtype=torch.bool)
        dropped = int((~keep).sum())
    y = moe_golden.run_experts(w, p, xf, choice, keep, gates, E)
    f = onehot.float().sum(dim=1) / (t * K)  # [b, E]
    P = probs.reshape(b, t, E).mean(dim=1)
    aux = (E * (f * P).sum(dim=-1)).mean()
    z = (torch.logsumexp(logits, dim=-1).reshape(b, t) ** 2).mean(dim=1).mean()
    return y.reshape(b, t, C), aux, z, dropped


def main(config_path, batch, seq, steps, warmup, threads):
    torch.set_num_threads(threads)
    raw = json.load(open(config_path))
    c = {k: raw[k] for k in ("n_embd", "n_layer", "n_head", "n_positions", "vocab_size", "num_local_experts",
                             "num_experts_per_tok")}
    for k, default in (("layer_norm_epsilon", 1e-5), ("moe_layer_frequency", 1), ("expert_capacity_factor", 0),
                       ("router_aux_loss_coef", 0.0), ("router_z_loss_coef", 0.0)):
        c[k] = raw.get(k, default)
    if "norm_topk_prob" in raw:
        c["norm_topk_prob"] = raw["norm_topk_prob"]
    moe_golden.moe_mlp = moe_mlp  # moe_golden.forward calls the module's moe_mlp: this one
    gen = torch.Generator().manual_seed(1)
    w = {k: v.requires_grad_(True) for k, v in moe_golden.make_weights(c, gen).items()}
    opt = torch.optim.AdamW(list(w.values()), lr=1e-3, weight_decay=0.1)
    times = []
    for step in range(warmup + steps):
        idx = torch.randint(0, c["vocab_size"], (batch, seq + 1), generator=gen)
        t0 = time.perf_counter()
        logits, aux, z, _ = moe_golden.forward(w, c, idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c["vocab_size"]), idx[:, 1:].reshape(-1))
        loss = loss + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * z
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
