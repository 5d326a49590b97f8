#!/usr/bin/env python3
"""Writes small valid seed inputs for every fuzz target into fuzz/corpus/<target>/
(standard library only). Run from anywhere: `python3 fuzz/seeds.py`."""
import gzip, io, json, pathlib, pickle, shutil, struct, zipfile

root = pathlib.Path(__file__).resolve().parent
corpus = root / "corpus"


def put(target, name, data):
    d = corpus / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


# IDX: 2 images of 3x2, and 4 labels; raw and gzip.
images = struct.pack(">IIII", 2051, 2, 3, 2) + bytes(range(12))
labels = struct.pack(">II", 2049, 4) + bytes([0, 9, 3, 1])
put("idx", "images", images)
put("idx", "labels", labels)
put("idx", "images.gz", gzip.compress(images))

# CIFAR binary: variant byte, then records (label byte(s) + 3072 pixels).
put("cifar_bin", "cifar10", bytes([0]) + bytes([7]) + bytes(range(256)) * 12)
put("cifar_bin", "cifar100", bytes([1]) + bytes([3, 42]) + bytes(3072))

# CIFAR python: a protocol-2 pickled dict (the real files hold a numpy array
# under b'data'; the fuzzer mutates from this structure).
batch = {b"data": bytes(3072), b"labels": [1], b"fine_labels": [5], b"coarse_labels": [2]}
put("cifar_pickle", "dict", bytes([0]) + pickle.dumps(batch, protocol=2))

# LEAF JSON: FEMNIST (784 floats) and Shakespeare (80 characters -> 1).
femnist = {"users": ["f_0"], "num_samples": [1],
           "user_data": {"f_0": {"x": [[0.5] * 784], "y": [3]}}}
shakes = {"users": ["s_0"], "num_samples": [1],
          "user_data": {"s_0": {"x": ["a" * 80], "y": ["b"]}}}
put("leaf_json", "femnist.json", json.dumps(femnist).encode())
put("leaf_json", "shakespeare.json", json.dumps(shakes).encode())


def npy(descr, shape, payload):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (
        descr, "(%s)" % "".join(f"{s}, " for s in shape))
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


# us-weather npz: 60 days x 3 stations, a 3-node path graph.
days, nodes = 60, 3
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    z.writestr("daily_temperature_midrange_c.npy",
               npy("<f4", (days, nodes), struct.pack(f"<{days*nodes}f", *[float(i % 7) for i in range(days * nodes)])))
    z.writestr("observation_mask.npy", npy("|b1", (days, nodes), bytes([1]) * (days * nodes)))
    z.writestr("adjacency_shape.npy", npy("<i4", (2,), struct.pack("<2i", nodes, nodes)))
    z.writestr("adjacency_indptr.npy", npy("<i4", (4,), struct.pack("<4i", 0, 1, 3, 4)))
    z.writestr("adjacency_indices.npy", npy("<i4", (4,), struct.pack("<4i", 1, 0, 2, 1)))
    z.writestr("adjacency_data.npy", npy("<f8", (4,), struct.pack("<4d", 1.0, 1.0, 0.5, 0.5)))
put("npz", "tiny.npz", buf.getvalue())

# Configs: the shipped examples.
for f in sorted((root.parent / "examples").glob("*.toml")):
    put("config", f.name, f.read_bytes())
print("seeds written to", corpus)
