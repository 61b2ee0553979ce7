#!/usr/bin/env python3
"""mlp_golden.py — golden vectors for the engine API's 2-layer MLP, ReLU(x W0) W1, computed with numpy
exactly as a single-device reference does it (einsum forward, hand-written backward).

usage: mlp_golden.py OUT.safetensors
Writes x, layer_0/weights, layer_1/weights, dy, and the expected y, grad/layer_0/weights and
grad/layer_1/weights (float32), with metadata saying how to regenerate the file.
"""
import sys

import numpy as np

sys.path.insert(0, __import__("os").path.dirname(__file__))
import safetensors_ref  # noqa: E402


def relu(x):
    return x * (x > 0)


def main(out):
    rng = np.random.default_rng(2026)
    batch, model, hidden = 8, 16, 32
    x = rng.standard_normal((batch, model), dtype=np.float32)
    w0 = (rng.standard_normal((model, hidden), dtype=np.float32) * 0.3).astype(np.float32)
    w1 = (rng.standard_normal((hidden, model), dtype=np.float32) * 0.3).astype(np.float32)
    dy = rng.standard_normal((batch, model), dtype=np.float32)
    z = np.einsum("bd,df->bf", x, w0)
    y = np.einsum("bf,fd->bd", relu(z), w1)
    w1_grad = np.einsum("bf,bd->fd", relu(z), dy)
    dh = np.einsum("bd,fd->bf", dy, w1) * (z > 0)
    w0_grad = np.einsum("bd,bf->df", x, dh)
    tensors = {"x": x, "layer_0/weights": w0, "layer_1/weights": w1, "dy": dy, "y": y.astype(np.float32),
               "grad/layer_0/weights": w0_grad.astype(np.float32), "grad/layer_1/weights": w1_grad.astype(np.float32)}
    safetensors_ref.write_tensors(out, tensors, {"regenerate": "python3 tools/reference/mlp_golden.py " + out,
                                                 "model": "engine API MLP, batch 8, model 16, hidden 32"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
