#!/usr/bin/env python3
"""moe_golden.py — golden vectors for shard's mixture-of-experts GPT, computed by PyTorch autograd
(Debian's python3-torch) on a model written here with torch ops: the GPT-2 decoder of gpt_golden.py
whose MLP, in blocks l with (l + 1) % moe_layer_frequency == 0, is a mixture of experts written as a
loop over experts with index_select / index_add:

  logits = x gate^T, probs = softmax(logits), the top-k experts per token (ties: the lower index),
  gates = the softmax probability (k = 1) or the top-k probabilities renormalised (norm_topk_prob),
  per row (routing group) an expert admits at most ceil(capacity_factor x T x k / E) assignments in
  position order (earlier tokens first), the rest dropped (output zero),
  y[token] += gate x expert(x[token]), expert = c_proj(gelu(c_fc(x))) in GPT-2's Conv1D layout.

  aux = E x sum_e f_e P_e per row (f_e: the row's top-k choices of e over T x k, P_e: the row's mean
  probability of e), z = the row's mean of logsumexp(logits)^2; each a mean over rows, summed over the
  MoE blocks; the objective is cross-entropy + aux_coef x aux + z_coef x z.

usage: moe_golden.py OUT_DIR
Writes OUT_DIR/moe_golden_top1.safetensors (top-1, capacity factor 1: tokens dropped; the MoE in
block 1 only) and OUT_DIR/moe_golden_top2.safetensors (top-2, no capacity, both blocks MoE): the
config (metadata), the weights under shard's names, inputs and targets (I32), the expected logits, loss
(the cross-entropy), aux, z, dropped (assignments dropped for capacity) and every parameter's gradient
of the objective (grad/NAME).
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

BASE = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 16, "vocab_size": 64, "layer_norm_epsilon": 1e-5,
        "num_local_experts": 4, "router_aux_loss_coef": 0.1, "router_z_loss_coef": 0.01}
CASES = {
    "top1": dict(BASE, num_experts_per_tok=1, expert_capacity_factor=1.0, moe_layer_frequency=2),
    "top2": dict(BASE, num_experts_per_tok=2, expert_capacity_factor=0, moe_layer_frequency=1),
}
B, T = 2, 8


def is_moe(c, l):
    return (l + 1) % c["moe_layer_frequency"] == 0


def make_weights(c, gen):
    C, L, E = c["n_embd"], c["n_layer"], c["num_local_experts"]
    w = {"wte.weight": torch.randn(c["vocab_size"], C, generator=gen) * 0.02,
         "wpe.weight": torch.randn(c["n_positions"], C, generator=gen) * 0.02}
    for l in range(L):
        p = f"h.{l}."
        w[p + "ln_1.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        w[p + "ln_1.bias"] = 0.1 * torch.randn(C, generator=gen)
        w[p + "attn.c_attn.weight"] = torch.randn(C, 3 * C, generator=gen) * 0.02
        w[p + "attn.c_attn.bias"] = 0.02 * torch.randn(3 * C, generator=gen)
        w[p + "attn.c_proj.weight"] = torch.randn(C, C, generator=gen) * 0.02 / math.sqrt(2 * L)
        w[p + "attn.c_proj.bias"] = 0.02 * torch.randn(C, generator=gen)
        w[p + "ln_2.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
        w[p + "ln_2.bias"] = 0.1 * torch.randn(C, generator=gen)
        if is_moe(c, l):
            # a router decisive enough that no two experts' probabilities are near a tie
            w[p + "mlp.gate.weight"] = torch.randn(E, C, generator=gen) * 0.2
            w[p + "mlp.experts.c_fc.weight"] = torch.randn(E, C, 4 * C, generator=gen) * 0.02
            w[p + "mlp.experts.c_fc.bias"] = 0.02 * torch.randn(E, 4 * C, generator=gen)
            w[p + "mlp.experts.c_proj.weight"] = torch.randn(E, 4 * C, C, generator=gen) * 0.02 / math.sqrt(2 * L)
            w[p + "mlp.experts.c_proj.bias"] = 0.02 * torch.randn(E, C, generator=gen)
        else:
            w[p + "mlp.c_fc.weight"] = torch.randn(C, 4 * C, generator=gen) * 0.02
            w[p + "mlp.c_fc.bias"] = 0.02 * torch.randn(4 * C, generator=gen)
            w[p + "mlp.c_proj.weight"] = torch.randn(4 * C, C, generator=gen) * 0.02 / math.sqrt(2 * L)
            w[p + "mlp.c_proj.bias"] = 0.02 * torch.randn(C, generator=gen)
    w["ln_f.weight"] = 1 + 0.1 * torch.randn(C, generator=gen)
    w["ln_f.bias"] = 0.1 * torch.randn(C, generator=gen)
    return {k: v.float() for k, v in w.items()}


def run_experts(w, p, xf, choice, keep, gates, E):
    """The experts as a loop: each expert's kept tokens gathered (index_select), its MLP, and the results
    added back weighted by their gates (index_add)."""
    y = torch.zeros(xf.shape[0], xf.shape[1])
    for e in range(E):
        tok, slot = ((choice == e) & keep).nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        xe = xf.index_select(0, tok)
        h = F.gelu(xe @ w[p + "mlp.experts.c_fc.weight"][e] + w[p + "mlp.experts.c_fc.bias"][e], approximate="tanh")
        o = h @ w[p + "mlp.experts.c_proj.weight"][e] + w[p + "mlp.experts.c_proj.bias"][e]
        y = y.index_add(0, tok, gates[tok, slot].unsqueeze(1) * o)
    return y


def moe_mlp(w, p, c, x):
    """The mixture of experts on x [b, t, C]: (y, aux, z, dropped)."""
    b, t, C = x.shape
    E, K = c["num_local_experts"], c["num_experts_per_tok"]
    xf = x.reshape(-1, C)
    N = xf.shape[0]
    logits = xf @ w[p + "mlp.gate.weight"].t()
    probs = logits.softmax(dim=-1)
    with torch.no_grad():  # top-k, the lower index on a tie (argmax returns the first largest)
        left, picks = probs.clone(), []
        for _ in range(K):
            e = left.argmax(dim=-1)
            picks.append(e)
            left[torch.arange(N), e] = -1.0
        choice = torch.stack(picks, dim=1)
        ordered = probs.sort(dim=-1, descending=True).values
        assert (ordered[:, K - 1] - ordered[:, K]).min().item() > 1e-4 if K < E else True, "a near tie"
    sel = probs.gather(1, choice)
    gates = sel / sel.sum(dim=-1, keepdim=True) if K > 1 and c.get("norm_topk_prob", K > 1) else sel
    factor = c.get("expert_capacity_factor", 0)
    cap = math.ceil(factor * t * K / E) if factor > 0 else N * K
    keep = torch.zeros(N, K, dtype=torch.bool)
    dropped = 0
    for r in range(b):
        counts = [0] * E
        for pos in range(t):
            for j in range(K):
                e = int(choice[r * t + pos, j])
                if counts[e] < cap:
                    counts[e] += 1
                    keep[r * t + pos, j] = True
                else:
                    dropped += 1
    y = run_experts(w, p, xf, choice, keep, gates, E)
    f = F.one_hot(choice, E).float().sum(dim=1).reshape(b, t, E).sum(dim=1) / (t * K)  # [b, E]
    P = probs.reshape(b, t, E).mean(dim=1)
    aux = (E * (f * P).sum(dim=-1)).mean()
    z = (torch.logsumexp(logits, dim=-1).reshape(b, t) ** 2).mean(dim=1).mean()
    return y.reshape(b, t, C), aux, z, dropped


def forward(w, c, idx):
    C, H, eps = c["n_embd"], c["n_head"], c["layer_norm_epsilon"]
    D = C // H
    b, t = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][torch.arange(t)]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    aux, z, dropped = torch.zeros(()), torch.zeros(()), 0
    for l in range(c["n_layer"]):
        p = f"h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = (u.view(b, t, H, D).transpose(1, 2) for u in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        if is_moe(c, l):
            m, a, zl, d = moe_mlp(w, p, c, h)
            x, aux, z, dropped = x + m, aux + a, z + zl, dropped + d
        else:
            h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    return x @ w["wte.weight"].t(), aux, z, dropped


def write_case(name, c, out_dir):
    gen = torch.Generator().manual_seed(2027)
    init = make_weights(c, gen)
    idx = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    targets = torch.randint(0, c["vocab_size"], (B, T), generator=gen)
    targets[1, 3] = -100  # an ignored position
    w = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    logits, aux, z, dropped = forward(w, c, idx)
    loss = F.cross_entropy(logits.view(-1, c["vocab_size"]), targets.view(-1), ignore_index=-100)
    (loss + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * z).backward()
    arrays = {k: v.numpy() for k, v in init.items()}
    arrays["logits"] = logits.detach().reshape(B * T, -1).numpy()
    for key, value in (("loss", loss.item()), ("aux", aux.item()), ("z", z.item()), ("dropped", float(dropped))):
        arrays[key] = np.array([value], dtype=np.float32)
    for k, v in w.items():
        arrays["grad/" + k] = v.grad.detach().numpy()
    tensors = {k: ("F32", list(v.shape), v.astype(np.float32).reshape(-1)) for k, v in arrays.items()}
    tensors["inputs"] = ("I32", [B, T], idx.numpy().astype(np.int32).reshape(-1))
    tensors["targets"] = ("I32", [B, T], targets.numpy().astype(np.int32).reshape(-1))
    meta = {"regenerate": "python3 tools/reference/moe_golden.py " + out_dir, "config": json.dumps(c),
            "torch": torch.__version__}
    path = os.path.join(out_dir, f"moe_golden_{name}.safetensors")
    safetensors_ref.write_raw(path, tensors, meta)
    print(f"{path}: loss {loss.item():.6f}, aux {aux.item():.6f}, z {z.item():.6f}, dropped {dropped}")


def main(out_dir):
    torch.manual_seed(0)
    for name, c in CASES.items():
        write_case(name, c, out_dir)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
