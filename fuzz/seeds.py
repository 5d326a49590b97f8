#!/usr/bin/env python3
"""Writes small valid seed inputs for every fuzz target into fuzz/corpus/<target>/
(standard library only). Run from anywhere: `python3 fuzz/seeds.py`."""
import gzip, io, json, pathlib, pickle, shutil, struct, zipfile, zlib

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


def numpy_batch(n):
    """A CIFAR-10 python batch as Python 2's cPickle wrote it: the uint8
    array through numpy.core.multiarray._reconstruct and BUILD."""
    o = bytearray(b"\x80\x02}(")
    def s(b): o.extend(b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b)
    def i(v): o.extend(b"K" + bytes([v]) if v < 256 else b"M" + struct.pack("<H", v))
    s(b"data")
    o.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n")
    i(0); o.extend(b"\x85"); s(b"b"); o.extend(b"\x87R(")
    i(1); i(n); i(3072); o.extend(b"\x86cnumpy\ndtype\n"); s(b"u1"); i(0); i(1)
    o.extend(b"\x87R("); i(3); s(b"|"); o.extend(b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xff"); i(0)
    o.extend(b"tb\x89"); s(bytes(range(256)) * 12 * n); o.extend(b"tb")
    s(b"labels"); o.extend(b"]("); [i(k % 10) for k in range(n)]; o.extend(b"eu.")
    return bytes(o)


put("cifar_pickle", "numpy", bytes([0]) + numpy_batch(1))

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

# PFLlib client files: plain x.npy / y.npy members, and data.npy as a 0-d
# object array (its pickle here holds bytes, not numpy arrays: the fuzzer
# mutates from the structure).
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("x.npy", npy("<f4", (2, 1, 2, 2), struct.pack("<8f", *[i / 8 for i in range(8)])))
    z.writestr("y.npy", npy("<i8", (2,), struct.pack("<2q", 0, 3)))
put("pfllib_npz", "plain.npz", buf.getvalue())
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    z.writestr("data.npy", npy("|O", (), pickle.dumps({"x": bytes(16), "y": bytes(8)}, protocol=3)))
put("pfllib_npz", "object.npz", buf.getvalue())

# Images: a 2x2 RGB PNG (mode byte first: RGB, resized).
def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
png = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
       + png_chunk(b"IDAT", zlib.compress(b"\x00" + bytes(range(6)) + b"\x00" + bytes(range(6, 12))))
       + png_chunk(b"IEND", b""))
put("image", "rgb.png", bytes([2]) + png)

# Configs: the shipped examples.
for f in sorted((root.parent / "examples").glob("*.toml")):
    put("config", f.name, f.read_bytes())
print("seeds written to", corpus)

# Wire payloads: the tag, then postcard. Task::Wait is variant 0; a
# Task::Train { seq 2, round 1, participate, before, after, origin } is
# variant 1 with varints and bools; a Reply::Trained with an upload of two
# floats.
put("wire", "wait", b"FWM2" + bytes([0]))
put("wire", "train", b"FWM2" + bytes([1, 2, 1, 1, 0, 1, 0]))
put("wire", "trained", b"FWM2" + bytes([0, 1, 2]) + struct.pack("<2f", 0.5, -1.0)
    + struct.pack("<d", 0.25) + bytes([0, 0, 0]))

# Checkpoint: a safetensors buffer with one 2-float tensor and the metadata
# the checks read; the fuzzer mutates toward a state the body decodes.
def safetensors(meta, tensors):
    header, offset, blob = {"__metadata__": meta}, 0, b""
    for name, floats in tensors.items():
        data = struct.pack(f"<{len(floats)}f", *floats)
        header[name] = {"dtype": "F32", "shape": [len(floats)],
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data); blob += data
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + blob

put("checkpoint", "pfedgraph", safetensors(
    {"format": "fedweave-checkpoint", "version": "1", "algorithm": "pfedgraph",
     "config": "seed = 1\n", "state": '{"round":1,"server":null,"clients":[],"trackers":null}'},
    {"v0000000": [0.5, -1.0]}))
