#!/usr/bin/env python3
"""cnn_golden.py — golden vectors for the two-shard image classifier (conv 3x3 same -> ReLU ->
max-pool 2 -> dense), computed by PyTorch autograd (Debian's python3-torch).

usage: cnn_golden.py OUT.safetensors
Writes the config (metadata), the weights (features.conv.weight [8,1,3,3], features.conv.bias,
classifier.weight [in, out], classifier.bias), images [4,1,28,28], labels, the expected logits and
loss, and every gradient (grad/NAME).
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_ref  # noqa: E402

CONFIG = {"model_type": "cnn", "in_channels": 1, "height": 28, "width": 28, "channels": 8, "kernel": 3, "pool": 2,
          "classes": 10}


def main(out):
    gen = torch.Generator().manual_seed(2026)
    c = CONFIG
    feats = c["channels"] * (c["height"] // c["pool"]) * (c["width"] // c["pool"])
    w = {"features.conv.weight": torch.randn(c["channels"], 1, 3, 3, generator=gen) * 0.3,
         "features.conv.bias": torch.randn(c["channels"], generator=gen) * 0.1,
         "classifier.weight": torch.randn(feats, c["classes"], generator=gen) * 0.03,
         "classifier.bias": torch.randn(c["classes"], generator=gen) * 0.1}
    w = {k: v.float().requires_grad_(True) for k, v in w.items()}
    images = torch.rand(4, 1, 28, 28, generator=gen)
    labels = torch.tensor([3, 0, 9, 5])
    h = F.relu(F.conv2d(images, w["features.conv.weight"], w["features.conv.bias"], padding=1))
    h = F.max_pool2d(h, 2).flatten(1)
    logits = h @ w["classifier.weight"] + w["classifier.bias"]
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    arrays = {k: v.detach().clone().numpy() for k, v in w.items()}
    arrays.update({"grad/" + k: v.grad.detach().clone().numpy() for k, v in w.items()})
    arrays["images"] = images.numpy()
    arrays["logits"] = logits.detach().numpy()
    arrays["loss"] = np.array([loss.item()], dtype=np.float32)
    tensors = {k: ("F32", list(v.shape), v.astype(np.float32).reshape(-1)) for k, v in arrays.items()}
    tensors["labels"] = ("I32", [4], labels.numpy().astype(np.int32))
    safetensors_ref.write_raw(out, tensors, {"regenerate": "python3 tools/reference/cnn_golden.py " + out,
                                             "config": json.dumps(c), "torch": torch.__version__})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1])
