#!/usr/bin/env python3
"""Load a model exported by `fedweave export` into a torch.nn.Module.

    from load_exported import load
    model = load("runs/x/export-best/model.json", "runs/x/export-best/client-0.safetensors")
    logits = model(x)   # x: float32 [n, *input_shape], the dataset's features as fedweave feeds them

`model.json`'s `layers` list (mlp, cnn, cnn-bn, cnn-dwa) is built as named
modules (conv1, bn1, fc1, ...), so the exported state_dict loads with
strict=True. Needs only torch (the safetensors file is read here; with the
`safetensors` package, `safetensors.torch.load_file` reads it the same).

As a command (used by fedweave's tests where torch is installed):

    load_exported.py MODEL_JSON WEIGHTS INPUT_F32 N

prints the logits of the N samples in INPUT_F32 (raw little-endian float32,
N x prod(input_shape) values) as a JSON list of lists.
"""
import json
import struct
import sys

import torch
from torch import nn

DTYPES = {"F32": torch.float32, "I64": torch.int64}


def read_safetensors(path):
    """The tensors of a safetensors file, by name."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(body[a:b])
        out[name] = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


def module(layer):
    """The torch module of one entry of model.json's layer list."""
    t = layer["type"]
    if t == "linear":
        return nn.Linear(layer["in_features"], layer["out_features"])
    if t == "conv2d":
        return nn.Conv2d(
            layer["in_channels"],
            layer["out_channels"],
            layer["kernel_size"],
            stride=layer["stride"],
            padding=layer["padding"],
        )
    if t == "batch_norm2d":
        return nn.BatchNorm2d(layer["num_features"], eps=layer["eps"], momentum=layer["momentum"])
    if t == "relu":
        return nn.ReLU()
    if t == "max_pool2d":
        return nn.MaxPool2d(layer["kernel_size"], stride=layer["stride"])
    if t == "flatten":
        return nn.Flatten()
    raise ValueError(f"unknown layer type {t}")


class Exported(nn.Module):
    """The layer list of model.json as one module; forward reshapes the
    input to [n, *input_shape] first."""

    def __init__(self, description):
        super().__init__()
        if description.get("layers") is None:
            raise ValueError(
                f"model kind {description['kind']} has no layer list; build it by hand "
                "from the state_dict names (see model.json's state_dict)"
            )
        self.input_shape = description["input_shape"]
        self.order = []
        for k, layer in enumerate(description["layers"]):
            name = layer.get("name") or f"{layer['type']}_{k}"
            self.add_module(name, module(layer))
            self.order.append(name)

    def forward(self, x):
        x = x.reshape(-1, *self.input_shape)
        for name in self.order:
            x = getattr(self, name)(x)
        return x


def load(model_json, weights):
    """The exported client model, in eval mode (batch norm uses the
    client's running statistics)."""
    with open(model_json) as f:
        description = json.load(f)
    model = Exported(description)
    model.load_state_dict(read_safetensors(weights), strict=True)
    return model.eval()


def main(argv):
    model_json, weights, inputs, n = argv[1], argv[2], argv[3], int(argv[4])
    model = load(model_json, weights)
    with open(inputs, "rb") as f:
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    with torch.no_grad():
        logits = model(x.reshape(n, -1))
    print(json.dumps(logits.tolist()))


if __name__ == "__main__":
    main(sys.argv)
