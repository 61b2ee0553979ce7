#!/usr/bin/env python3
"""gpt_golden.py — golden vectors for shard's GPT-2-style decoder, computed by PyTorch autograd
(Debian's python3-torch) on a model written here with torch ops from GPT-2's definition:
Hugging Face names and Conv1D (in x out) layout, pre-LayerNorm blocks, GELU tanh form, causal
attention scaled by 1/sqrt(head size), LM head tied to wte, mean cross-entropy.

usage: gpt_golden.py OUT.safetensors
Writes the config (metadata), the initial weights under their Hugging Face names, inputs and
targets (int64 as F32-exact floats are avoided: I32), the expected logits and loss, every
parameter gradient (grad/NAME), and the weights after 3 AdamW steps on the same batch
(adamw3/NAME; lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.1).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

CONFIG = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16, "vocab_size": 64, "layer_norm_epsilon": 1e-5}
B, T = 2, 8
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1}


def make_weights(c, gen):
    C, L = c["n_embd"], c["n_layer"]
    w = {"wte.weight": torch.randn(c["vocab_size"], C, generator=gen) * 0.02,
         "wpe.weight": torch.randn(c["n_positions"], C, generator=gen) * 0.02}
    for l in range(L):
        p = f"h.{l}."
        # LayerNorm weights and biases away from 1 and 0, so their gradients are exercised
        w[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        w[p + "ln_1.bias"] = 0.1 * torch.randn(C, generator=gen)
        w[p + "attn.c_attn.weight"] = torch.randn(C, 3 * C, generator=gen) * 0.02
        w[p + "attn.c_attn.bias"] = 0.02 * torch.randn(3 * C, generator=gen)
        w[p + "attn.c_proj.weight"] = torch.randn(C, C, generator=gen) * 0.02 / math.sqrt(2 * L)
        w[p + "attn.c_proj.bias"] = 0.02 * torch.randn(C, generator=gen)
        w[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        w[p + "ln_2.bias"] = 0.1 * torch.randn(C, generator=gen)
        w[p + "mlp.c_fc.weight"] = torch.randn(C, 4 * C, generator=gen) * 0.02
        w[p + "mlp.c_fc.bias"] = 0.02 * torch.randn(4 * C, generator=gen)
        w[p + "mlp.c_proj.weight"] = torch.randn(4 * C, C, generator=gen) * 0.02 / math.sqrt(2 * L)
        w[p + "mlp.c_proj.bias"] = 0.02 * torch.randn(C, generator=gen)
    w["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
    w["ln_f.bias"] = 0.1 * torch.randn(C, generator=gen)
    return {k: v.float() for k, v in w.items()}


def forward(w, c, idx):
    C, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    D = C // H
    b, t = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][torch.arange(t)]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    for l in range(c["n_layer"]):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (z.view(b, t, H, D).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w["wte.weight"].t()


def main(out):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2026)
    c = CONFIG
    init = make_weights(c, gen)
    idx = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    targets[1, 3] = -100  # an ignored position
    w = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    logits = forward(w, c, idx)
    loss = F.cross_entropy(logits.view(-1, c["vocab_size"]), targets.view(-1), ignore_index=-100)
    loss.backward()
    arrays = {k: v.numpy() for k, v in init.items()}
    arrays["logits"] = logits.detach().reshape(B * T, -1).numpy()
    arrays["loss"] = np.array([loss.item()], dtype=np.float32)
    for k, v in w.items():
        arrays["grad/" + k] = v.grad.detach().clone().numpy()  # a copy: the optimizer reuses .grad
    opt = torch.optim.AdamW(list(w.values()), foreach=False, **ADAMW)
    for _ in range(3):  # three steps on the same batch (the first reuses the gradients above)
        opt.step()
        opt.zero_grad()
        loss = F.cross_entropy(forward(w, c, idx).view(-1, c["vocab_size"]), targets.view(-1), ignore_index=-100)
        loss.backward()
    for k, v in w.items():
        arrays["adamw3/" + k] = v.detach().clone().numpy()
    tensors = {k: ("F32", list(v.shape), v.astype(np.float32).reshape(-1)) for k, v in arrays.items()}
    tensors["inputs"] = ("I32", [B, T], idx.numpy().astype(np.int32).reshape(-1))
    tensors["targets"] = ("I32", [B, T], targets.numpy().astype(np.int32).reshape(-1))
    meta = {"regenerate": "python3 tools/reference/gpt_golden.py " + out, "config": json.dumps(c),
            "adamw": json.dumps({"lr": ADAMW["lr"], "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1}),
            "torch": torch.__version__}
    safetensors_ref.write_raw(out, tensors, meta)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
