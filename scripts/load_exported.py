#!/usr/bin/env python3
"""Load a model exported by `fedweave export` into a torch.nn.Module.

    from load_exported import load
    model = load("runs/x/export-best/model.json", "runs/x/export-best/client-0.safetensors")
    logits = model(x)   # x: float32 [n, *input_shape], the dataset's features as fedweave feeds them

`model.json`'s `layers` list (every model but gru, textcnn and mf) is built
as modules registered at their dotted names (conv1, layer1.0.conv1,
layers.3, ...; residual blocks as `Residual` modules), so the exported
state_dict loads with strict=True. Needs only torch (the safetensors file is read here; with the
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
        return nn.Linear(layer["in_features"], layer["out_features"], bias=layer.get("bias", True))
    if t == "conv2d":
        return nn.Conv2d(
            layer["in_channels"],
            layer["out_channels"],
            layer["kernel_size"],
            stride=layer["stride"],
            padding=layer["padding"],
            groups=layer.get("groups", 1),
            bias=layer.get("bias", True),
        )
    if t == "batch_norm2d":
        return nn.BatchNorm2d(layer["num_features"], eps=layer["eps"], momentum=layer["momentum"])
    if t == "group_norm":
        return nn.GroupNorm(layer["num_groups"], layer["num_channels"], eps=layer["eps"])
    if t == "relu":
        return nn.ReLU()
    if t == "gelu":
        return nn.GELU()
    if t == "tanh":
        return nn.Tanh()
    if t == "max_pool2d":
        return nn.MaxPool2d(layer["kernel_size"], stride=layer["stride"], padding=layer.get("padding", 0))
    if t == "avg_pool2d":
        return nn.AvgPool2d(layer["kernel_size"], stride=layer["stride"], padding=layer["padding"])
    if t == "adaptive_avg_pool2d":
        return nn.AdaptiveAvgPool2d(layer["output_size"])
    if t == "adaptive_max_pool2d":
        return nn.AdaptiveMaxPool2d(layer["output_size"])
    if t == "flatten":
        return nn.Flatten()
    if t == "dropout":
        return nn.Dropout(layer["p"])
    if t == "embedding":
        return Embedding(layer["num_embeddings"], layer["embedding_dim"])
    if t == "residual":
        return Residual(layer["layers"], layer["shortcut"])
    if t == "scale":
        return Scale(layer["factor"])
    raise ValueError(f"unknown layer type {t}")


def attach(owner, dotted, mod):
    """Registers `mod` under `owner` at a dotted name (`layer1.0.conv1`,
    `downsample.conv`), making plain containers for the parts before the
    last, so state_dict keys are the dotted names."""
    *path, last = dotted.split(".")
    for part in path:
        if part not in owner._modules:
            owner.add_module(part, nn.Module())
        owner = owner._modules[part]
    owner.add_module(last, mod)


def chain(owner, layers, tag):
    """Builds `layers` as modules registered under `owner` (named ones at
    their names, the parameter-free ones under `_{tag}{k}`); returns them in
    order."""
    out = []
    for k, layer in enumerate(layers):
        m = module(layer)
        attach(owner, layer.get("name") or f"_{tag}{k}", m)
        out.append(m)
    return out


def run(modules, x):
    for m in modules:
        x = m(x)
    return x


class Embedding(nn.Embedding):
    """Token ids (as float features) to a one-channel len x dim map."""

    def forward(self, x):
        return super().forward(x.long()).unsqueeze(1)


class Residual(nn.Module):
    """layers(x) + shortcut(x); an empty shortcut is the identity."""

    def __init__(self, layers, shortcut):
        super().__init__()
        # Plain lists under names no child takes (children may be called
        # `layers` and `shortcut`, as nn.Sequential's state_dict keys are).
        self._branch = chain(self, layers, "layers")
        self._skip = chain(self, shortcut, "shortcut")

    def forward(self, x):
        return run(self._branch, x) + run(self._skip, x)


class Scale(nn.Module):
    """Multiplies by a constant (ResNet-9's logit scale)."""

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


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
        self._order = chain(self, description["layers"], "")

    def forward(self, x):
        return run(self._order, x.reshape(-1, *self.input_shape))


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
