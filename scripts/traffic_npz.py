#!/usr/bin/env python3
"""Converts DCRNN's traffic-speed releases (METR-LA, PEMS-BAY) into the
`.npz` that fedweave's `metr-la` / `pems-bay` datasets read.

DCRNN (Li et al., ICLR 2018) distributes each dataset as two files:
- `metr-la.h5` / `pems-bay.h5`: a pandas DataFrame (key `df`), one row per
  5-minute step, one column per sensor id, speed in mph, 0 = no reading;
- `adj_mx.pkl` / `adj_mx_bay.pkl`: a pickle of `(sensor_ids,
  sensor_id_to_ind, adj_mx)`, `adj_mx[i, j]` the thresholded Gaussian
  kernel of the road distance from sensor i to sensor j (directed, ones on
  the diagonal). It was written by Python 2, hence `encoding="latin1"`.

The output holds `speed` (T, N) float32 with the columns in the pickle's
sensor order, `adjacency` (N, N) float64 as given, and `sensor_ids`.
fedweave reads HDF5 through this script rather than a C library at build
time; the conversion is once per dataset.

    python3 scripts/traffic_npz.py metr-la.h5 adj_mx.pkl data/traffic/metr-la.npz
    python3 scripts/traffic_npz.py pems-bay.h5 adj_mx_bay.pkl data/traffic/pems-bay.npz

Then `[data] dataset = "metr-la"`, `path = "data/traffic"`. Needs pandas and
PyTables (`pip install pandas tables`).
"""
import argparse
import pickle
import sys

import numpy as np
import pandas as pd


def convert(h5_path, pkl_path, out_path):
    df = pd.read_hdf(h5_path)
    with open(pkl_path, "rb") as f:
        sensor_ids, _, adj = pickle.load(f, encoding="latin1")
    sensor_ids = [str(s) for s in sensor_ids]
    adj = np.asarray(adj, dtype=np.float64)
    n = len(sensor_ids)
    if adj.shape != (n, n):
        sys.exit(f"{pkl_path}: adjacency of shape {adj.shape} for {n} sensor ids")
    columns = {str(c): k for k, c in enumerate(df.columns)}
    missing = [s for s in sensor_ids if s not in columns]
    if missing:
        sys.exit(f"{h5_path}: no column for sensor ids {missing[:5]} (of {len(missing)})")
    speed = df.to_numpy(dtype=np.float32)[:, [columns[s] for s in sensor_ids]]
    np.savez(out_path, speed=speed, adjacency=adj, sensor_ids=np.array(sensor_ids))
    observed = np.count_nonzero(speed) / speed.size
    edges = np.count_nonzero(adj) - np.count_nonzero(np.diag(adj))
    print(
        f"{out_path}: {speed.shape[0]} steps x {n} sensors "
        f"({observed:.1%} nonzero readings), {edges} directed edges"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("h5", help="metr-la.h5 or pems-bay.h5")
    p.add_argument("pkl", help="adj_mx.pkl or adj_mx_bay.pkl")
    p.add_argument("out", help="the .npz to write (metr-la.npz or pems-bay.npz)")
    a = p.parse_args()
    convert(a.h5, a.pkl, a.out)


if __name__ == "__main__":
    main()
