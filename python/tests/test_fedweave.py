"""The Python package against the files a run writes and against itself.

Run from the repository root after `pip install ./python`:
    python3 -m pytest python/tests
"""

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import fedweave

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.toml"
# Small and fast: 6 digits clients, 2 classes each, a few steps a round.
SMALL = {
    "seed": 3,
    "clients": 6,
    "rounds": 3,
    "threads": 2,
    "data": {"dataset": "digits"},
    "partition": {"kind": "pathological", "classes_per_client": 2},
    "model": {"kind": "mlp"},
    "train": {"local_iterations": 5, "batch_size": 16, "lr": 0.05},
    "algorithm": {"name": "pfedgraph"},
}


def small(tmp_path, name="run", **overrides):
    return fedweave.run(SMALL, tmp_path / name, quiet=True, **overrides)


def records(run):
    return [json.loads(l) for l in (run.dir / "rounds.jsonl").read_text().splitlines() if l.strip()]


def test_run_attributes_match_the_files_on_disk(tmp_path):
    run = small(tmp_path, **{"attack.kind": "sign_flip", "attack.ratio": 0.34})
    summary = json.loads((run.dir / "summary.json").read_text())
    assert run.summary == summary
    assert summary["clients"] == 6 and summary["rounds"] == 3
    assert summary["algorithm"] == "pfedgraph"

    rows = records(run)
    frame = run.rounds
    assert list(frame["round"]) == [1, 2, 3]
    for col in ("mean_val_acc", "mean_test_acc", "bytes_up", "bytes_down", "seconds"):
        assert list(frame[col]) == [r[col] for r in rows], col
    assert "graph" not in frame.columns

    graphs = run.graphs
    assert graphs.shape == (3, 6, 6)
    assert numpy.array_equal(graphs, numpy.array([r["graph"] for r in rows]))
    assert numpy.allclose(graphs.sum(axis=2), 1.0)
    assert numpy.array_equal(graphs[-1], numpy.array(summary["final_graph"]))

    clients = run.clients
    assert list(clients.index) == list(range(6))
    assert sorted(clients.index[clients["malicious"]]) == summary["malicious"]
    benign = clients[~clients["malicious"]]
    want = [a for a in summary["per_client_test_acc"] if a is not None]
    assert list(benign["test_acc"]) == want
    # Pathological with 2 classes: every client's training labels span 2 classes.
    for counts, size in zip(clients["label_counts"], clients["train_size"]):
        assert sum(counts) == size and sum(1 for c in counts if c > 0) == 2
    assert run.report_path == run.dir / "report.html" and run.report_path.is_file()


def read_safetensors(path):
    """(name → array) of a safetensors file, read by hand (its format: an
    8-byte header length, a JSON header, the data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = {"F32": "<f4", "I64": "<i8"}[info["dtype"]]
        out[name] = numpy.frombuffer(raw[8 + n + start : 8 + n + end], dtype=dtype).reshape(info["shape"])
    return out


def fedweave_binary():
    for profile in ("debug", "release"):
        path = ROOT / "target" / profile / "fedweave"
        if path.is_file():
            return path
    return shutil.which("fedweave")


def test_models_are_the_exported_state_dicts(tmp_path):
    run = small(tmp_path, **{"algorithm.name": "fedrep"})
    best, last = run.models("best"), run.models("last")
    assert sorted(best) == list(range(6)) and sorted(last) == list(range(6))
    for i in range(6):
        assert best[i]["fc1.weight"].shape == (200, 64)  # PyTorch's [out, in]
        assert best[i]["fc3.bias"].shape == (10,)
        same_round = run.clients.loc[i, "best_round"] == 3
        equal = all(numpy.array_equal(best[i][k], last[i][k]) for k in best[i])
        assert equal == same_round, i
    binary = fedweave_binary()
    if binary is None:
        pytest.skip("no fedweave binary (cargo build) to export with")
    out = tmp_path / "export"
    subprocess.run([str(binary), "export", str(run.dir), "--out", str(out)], check=True, capture_output=True)
    for i in range(6):
        exported = read_safetensors(out / f"client-{i}.safetensors")
        assert sorted(exported) == sorted(best[i])
        for name, array in exported.items():
            assert array.dtype == best[i][name].dtype and numpy.array_equal(array, best[i][name]), name
    with pytest.raises(fedweave.FedweaveError, match="best.*last"):
        run.models("middle")


def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    whole = small(tmp_path, "whole", rounds=4)
    part = small(tmp_path, "part", rounds=2)
    resumed = fedweave.resume(part.dir, rounds=4, quiet=True)
    assert resumed.dir == part.dir
    a, b = whole.summary, resumed.summary
    for key in ("per_client_test_acc", "mean_test_acc", "final_graph", "bytes_up", "bytes_down"):
        assert a[key] == b[key], key
    assert numpy.array_equal(whole.graphs, resumed.graphs)
    assert fedweave.load(part.dir).summary == b


def test_configs_as_path_text_and_mapping_run_the_same(tmp_path):
    base = {**SMALL, "rounds": 2}
    text = "\n".join(
        [
            "seed = 3",
            "clients = 6",
            "rounds = 2",
            "threads = 2",
            '[data]\ndataset = "digits"',
            '[partition]\nkind = "pathological"\nclasses_per_client = 2',
            '[model]\nkind = "mlp"',
            "[train]\nlocal_iterations = 5\nbatch_size = 16\nlr = 0.05",
            '[algorithm]\nname = "pfedgraph"',
        ]
    )
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    runs = [
        fedweave.run(base, tmp_path / "a", quiet=True),
        fedweave.run(text, tmp_path / "b", quiet=True),
        fedweave.run(str(path), tmp_path / "c", quiet=True),
        fedweave.run(path, tmp_path / "d", quiet=True),
    ]
    accs = [r.summary["per_client_test_acc"] for r in runs]
    assert all(a == accs[0] for a in accs)
    # An override changes the run as --set does.
    other = fedweave.run(base, tmp_path / "e", quiet=True, **{"algorithm.name": "fedavg"})
    assert other.summary["algorithm"] == "fedavg"
    assert other.summary["per_client_test_acc"] != accs[0]


def test_bad_input_is_a_clear_error(tmp_path):
    with pytest.raises(fedweave.FedweaveError, match="train.lrr.*unknown key.*did you mean `train.lr`"):
        fedweave.run(SMALL, tmp_path / "x", quiet=True, **{"train.lrr": 0.1})
    with pytest.raises(fedweave.FedweaveError, match="unknown algorithm"):
        fedweave.run(SMALL, tmp_path / "x", quiet=True, **{"algorithm.name": "fedfoo"})
    with pytest.raises(fedweave.FedweaveError, match="finite"):
        fedweave.run(SMALL, tmp_path / "x", quiet=True, **{"train.lr": float("nan")})
    with pytest.raises(fedweave.FedweaveError, match="no such file"):
        fedweave.run(tmp_path / "missing.toml")
    with pytest.raises(fedweave.FedweaveError, match="not a run directory"):
        fedweave.load(tmp_path)
    with pytest.raises(fedweave.FedweaveError, match="not a run directory"):
        fedweave.resume(tmp_path)
    run = small(tmp_path, "taken", rounds=1)
    with pytest.raises(fedweave.FedweaveError, match="already holds a run"):
        small(tmp_path, "taken", rounds=1)
    again = fedweave.run(SMALL, run.dir, quiet=True, overwrite=True, rounds=1)
    assert again.summary["rounds"] == 1


def test_ctrl_c_stops_at_a_safe_point_and_resume_finishes_the_run(tmp_path):
    out = tmp_path / "stopped"
    script = (
        # Python installs its Ctrl-C handler only where SIGINT is not ignored,
        # and a shell's background jobs inherit it ignored: install it here.
        "import signal, sys, fedweave\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"cfg = {SMALL!r}\n"
        "try:\n"
        f"    fedweave.run(cfg, {str(out)!r}, rounds=40, **{{'train.local_iterations': 40}})\n"
        "except KeyboardInterrupt as e:\n"
        "    print('interrupted:', e)\n"
        "    sys.exit(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Wait for the first round, then press Ctrl-C.
    for line in proc.stderr:
        if line.startswith("round 1/"):
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 3, stdout + stderr
    assert "checkpoint" in stdout and "fedweave.resume" in stdout
    done = len(records(fedweave.load(out)))
    assert 1 <= done < 40
    resumed = fedweave.resume(out, quiet=True)
    whole = fedweave.run(SMALL, tmp_path / "whole", quiet=True, rounds=40, **{"train.local_iterations": 40})
    assert resumed.summary["per_client_test_acc"] == whole.summary["per_client_test_acc"]
    assert resumed.summary["final_graph"] == whole.summary["final_graph"]


def test_sweep_returns_its_results_table(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f'base = {json.dumps(str(QUICKSTART))}\nseeds = [1]\n[set]\nrounds = 1\nclients = 4\n'
        '"train.local_iterations" = 2\n[grid]\n"algorithm.name" = ["fedavg", "local"]\n'
    )
    table = fedweave.sweep(grid, tmp_path / "sweep", quiet=True)
    assert sorted(table["algorithm.name"]) == ["fedavg", "local"]
    assert len(table) == 2 and table["mean_test_acc"].between(0, 1).all()
    # Finished runs are skipped: the same table again.
    again = fedweave.sweep(grid, tmp_path / "sweep", quiet=True)
    assert again["mean_test_acc"].tolist() == table["mean_test_acc"].tolist()


def fedavg_rule(uploads, sizes, round, state):
    """FedAvg's W: every row the data-size weights p; counts its rounds in
    its state, which must survive between rounds (and resumes)."""
    assert state.get("rounds", 0) == round - 1, (state, round)
    state["rounds"] = round
    p = sizes / sizes.sum()
    return numpy.tile(p, (len(sizes), 1))


def test_a_python_rule_with_fedavg_weights_is_fedavg(tmp_path):
    received = {"algorithm.evaluate": "received"}
    ours = fedweave.run(SMALL, tmp_path / "rule", graph_rule=fedavg_rule, quiet=True, **received)
    theirs = small(tmp_path, "fedavg", **{"algorithm.name": "fedavg"})
    assert ours.summary["algorithm"] == "graph-rule"
    assert ours.summary["per_client_test_acc"] == theirs.summary["per_client_test_acc"]
    assert numpy.array_equal(ours.graphs, theirs.graphs)
    assert ours.summary["bytes_up"] == theirs.summary["bytes_up"]
    # Its state is checkpointed: stopped after 2 rounds and resumed, the
    # rule sees its round count continue (it asserts so) and the result is
    # the uninterrupted run's.
    part = fedweave.run(SMALL, tmp_path / "part", graph_rule=fedavg_rule, quiet=True, rounds=2, **received)
    resumed = fedweave.resume(part.dir, rounds=3, graph_rule=fedavg_rule, quiet=True)
    assert resumed.summary["per_client_test_acc"] == ours.summary["per_client_test_acc"]
    with pytest.raises(fedweave.FedweaveError, match="no graph rule is installed"):
        fedweave.resume(part.dir, rounds=4, quiet=True)


def test_a_python_rule_gets_the_attacks_and_defences_of_every_server_method(tmp_path):
    # Sign-flipping attackers and norm clipping wrap the messages around the
    # rule as around fedavg: FedAvg's W in numpy gives fedavg's run.
    hostile = {"attack.kind": "sign_flip", "attack.ratio": 0.34, "aggregator.kind": "norm_clip", "aggregator.clip": 2.0}
    ours = fedweave.run(
        SMALL, tmp_path / "rule", graph_rule=fedavg_rule, quiet=True, **{"algorithm.evaluate": "received"}, **hostile
    )
    theirs = small(tmp_path, "fedavg", **{"algorithm.name": "fedavg"}, **hostile)
    assert ours.summary["per_client_test_acc"] == theirs.summary["per_client_test_acc"]
    assert numpy.array_equal(ours.graphs, theirs.graphs)
    clean = small(tmp_path, "clean", **{"algorithm.name": "fedavg"})
    assert ours.summary["per_client_test_acc"] != clean.summary["per_client_test_acc"], "the attack changed nothing"


def test_a_sweep_runs_a_python_rule(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(
        f'base = {json.dumps(str(QUICKSTART))}\nseeds = [1, 2]\n[set]\nrounds = 2\nclients = 4\n'
        '"train.local_iterations" = 2\n'
        '[[case]]\n"algorithm.name" = "graph-rule"\n"algorithm.evaluate" = "received"\n'
        '[[case]]\n"algorithm.name" = "fedavg"\n'
    )
    calls = []

    def rule(uploads, sizes, round, state):
        calls.append(round)
        return fedavg_rule(uploads, sizes, round, state)

    table = fedweave.sweep(grid, tmp_path / "sweep", jobs=2, quiet=True, graph_rule=rule)
    assert sorted(calls) == [1, 1, 2, 2], "each seed's run calls the rule once a round, with its own state"
    by = {(r["algorithm.name"], r["seed"]): r["mean_test_acc"] for _, r in table.iterrows()}
    assert set(by) == {("graph-rule", 1), ("graph-rule", 2), ("fedavg", 1), ("fedavg", 2)}
    for seed in (1, 2):
        assert by[("graph-rule", seed)] == by[("fedavg", seed)]
    assert by[("fedavg", 1)] != by[("fedavg", 2)], "the seeds made no difference"


@pytest.mark.parametrize(
    "rule, message",
    [
        (lambda u, s, r, st: numpy.ones((2, 2)) / 2, r"graph_rule, round 1: .*shape \(2, 2\), expected \(6, 6\)"),
        (lambda u, s, r, st: numpy.full((6, 6), numpy.nan), r"graph_rule, round 1: W\[0\]\[0\] = NaN"),
        (lambda u, s, r, st: numpy.eye(6) * 0.5, r"graph_rule, round 1: row 0 of W sums to 0.5"),
        (lambda u, s, r, st: -numpy.eye(6) + 2 / 6, r"graph_rule, round 1: W\[0\]\[0\] = -0.6"),
        (lambda u, s, r, st: 1 / 0, r"graph_rule, round 1: ZeroDivisionError"),
    ],
)
def test_a_bad_rule_is_a_clear_error_naming_the_round(tmp_path, rule, message):
    with pytest.raises(fedweave.FedweaveError, match=message):
        fedweave.run(SMALL, tmp_path / "bad", graph_rule=rule, quiet=True)


def simplex_projection(v):
    """Euclidean projection of v onto the probability simplex (sort-based)."""
    u = numpy.sort(v)[::-1]
    css = numpy.cumsum(u)
    k = numpy.arange(1, len(v) + 1)
    rho = numpy.nonzero(u * k > css - 1)[0][-1]
    theta = (css[rho] - 1) / (rho + 1)
    return numpy.maximum(v - theta, 0)


def test_pfedgraph_written_in_numpy_reproduces_pfedgraph(tmp_path):
    """pFedGraph's rule — cosine similarity of the models' moves from
    θ_init, above 0.9 set to 1, each row the simplex projection of
    p + s_i/(2α) — in numpy, against the Rust method without its local
    regulariser (λ = 0: a graph rule changes the server only)."""
    init = fedweave.initial_model(SMALL).astype(numpy.float64)
    alpha = 0.08 * SMALL["clients"]

    def pfedgraph(uploads, sizes, round, state):
        moves = uploads.astype(numpy.float64) - init
        gram = moves @ moves.T
        norms = numpy.sqrt(numpy.diag(gram))
        s = gram / numpy.outer(norms, norms)
        s[s > 0.9] = 1.0
        numpy.fill_diagonal(s, 1.0)
        p = sizes / sizes.sum()
        return numpy.array([simplex_projection(p + row / (2 * alpha)) for row in s])

    ours = fedweave.run(SMALL, tmp_path / "numpy", graph_rule=pfedgraph, quiet=True)
    theirs = small(tmp_path, "rust", **{"algorithm.lambda": 0.0})
    assert numpy.allclose(ours.graphs, theirs.graphs, rtol=0, atol=1e-6)
    a = numpy.array(ours.summary["per_client_test_acc"])
    b = numpy.array(theirs.summary["per_client_test_acc"])
    assert numpy.allclose(a, b, rtol=0, atol=1e-6), (a, b)
    # The graph is not FedAvg's: the rule did something.
    assert not numpy.allclose(ours.graphs[-1], ours.graphs[-1][0])


def flat_from_state_dict(tensors):
    """A kept model as the flat vector a rule sees: the state_dict in order,
    linear weights transposed back to fedweave's [in, out] (mlp)."""
    parts = []
    for name, t in tensors.items():
        if name.endswith(("running_mean", "running_var", "num_batches_tracked")):
            continue
        parts.append((t.T if t.ndim == 2 else t).ravel())
    return numpy.concatenate(parts)


def test_a_per_layer_rule_with_fedavg_weights_is_fedavg(tmp_path):
    """W given per layer group, every layer FedAvg's: the run is `fedavg`'s
    bit for bit, and the per-layer graphs are the rule's."""
    seen = {}

    def rule(uploads, sizes, round, state, layers):
        seen["layers"] = list(layers)
        p = sizes / sizes.sum()
        return numpy.stack([numpy.tile(p, (len(sizes), 1))] * len(layers))

    received = {"algorithm.evaluate": "received"}
    ours = fedweave.run(SMALL, tmp_path / "rule", graph_rule=rule, quiet=True, **received)
    theirs = small(tmp_path, "fedavg", **{"algorithm.name": "fedavg"})
    assert seen["layers"] == ["fc1", "fc2", "fc3"]
    assert ours.summary["per_client_test_acc"] == theirs.summary["per_client_test_acc"]
    for a, b in zip(ours.models("last").values(), theirs.models("last").values()):
        for name in a:
            assert numpy.array_equal(a[name], b[name]), name
    assert numpy.allclose(ours.graphs, theirs.graphs, rtol=0, atol=1e-15)
    layers = ours.layer_graphs()
    assert list(layers) == ["fc1", "fc2", "fc3"]
    for name, g in layers.items():
        assert g.shape == (3, 6, 6)
        assert numpy.array_equal(g, theirs.graphs), name


def test_a_per_layer_rule_mixes_layer_by_layer(tmp_path):
    """Layer fc1 kept (identity), fc2 the uniform mean, fc3 a ring: one
    client's received model against numpy, and the graphs as given."""
    captured = {}

    def rule(uploads, sizes, round, state, layers):
        n = len(sizes)
        captured["uploads"] = uploads.copy()
        captured["layers"] = {k: v.shape for k, v in layers.items()}
        ring = 0.5 * numpy.eye(n) + 0.5 * numpy.roll(numpy.eye(n), 1, axis=1)
        return numpy.stack([numpy.eye(n), numpy.full((n, n), 1.0 / n), ring])

    run = fedweave.run(SMALL, tmp_path / "layers", graph_rule=rule, quiet=True, rounds=1, **{"algorithm.evaluate": "received"})
    uploads = captured["uploads"].astype(numpy.float64)
    sizes = [captured["layers"][k][1] for k in ("fc1", "fc2", "fc3")]
    bounds = numpy.cumsum([0] + sizes)
    assert bounds[-1] == uploads.shape[1]
    client = 2
    got = flat_from_state_dict(run.models("last")[client])
    want = numpy.concatenate(
        [
            uploads[client, bounds[0] : bounds[1]],
            uploads[:, bounds[1] : bounds[2]].mean(axis=0),
            0.5 * uploads[client, bounds[2] :] + 0.5 * uploads[client + 1, bounds[2] :],
        ]
    ).astype(numpy.float32)
    assert numpy.array_equal(got[: bounds[1]], want[: bounds[1]]), "fc1 is the client's own upload"
    assert numpy.allclose(got, want, rtol=0, atol=1e-6)
    assert not numpy.allclose(got[bounds[1] : bounds[2]], uploads[client, bounds[1] : bounds[2]], atol=1e-4)
    layers = run.layer_graphs()
    assert numpy.array_equal(layers["fc1"][0], numpy.eye(6))
    assert numpy.allclose(layers["fc2"][0], 1 / 6, rtol=0, atol=1e-15)
    assert layers["fc3"][0][client, client + 1] == 0.5
    assert numpy.allclose(run.graphs[0], (layers["fc1"][0] + layers["fc2"][0] + layers["fc3"][0]) / 3)


def test_a_bad_per_layer_rule_names_the_layer_and_round(tmp_path):
    def rule(uploads, sizes, round, state):
        n = len(sizes)
        w = numpy.stack([numpy.eye(n)] * 3)
        if round == 2:
            w[1, 4, :] = 0.1
        return w

    with pytest.raises(fedweave.FedweaveError, match=r"graph_rule, round 2: layer fc2: row 4 of W sums to 0.6"):
        fedweave.run(SMALL, tmp_path / "bad", graph_rule=rule, quiet=True)
    with pytest.raises(fedweave.FedweaveError, match=r"graph_rule, round 1: .*\(3, 6, 6\), one W per layer group \(fc1, fc2, fc3\)"):
        fedweave.run(SMALL, tmp_path / "bad2", graph_rule=lambda u, s, r, st: numpy.ones((2, 6, 6)) / 6, quiet=True)


def test_the_progress_bar_counts_rounds_and_estimates_the_rest():
    import io

    from fedweave._progress import Progress

    now = [100.0]
    out = io.StringIO()
    bar = Progress(4, stream=out, use_tqdm=False, clock=lambda: now[0])
    now[0] += 10
    bar.update(1, 0.5, None, 10.0)
    now[0] += 10
    bar.update(2, 0.75, None, 10.0)
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "round 1/4 [######..................]  25% · val acc 0.5000 · 0:10 elapsed · ETA 0:30"
    assert lines[1] == "round 2/4 [############............]  50% · val acc 0.7500 · 0:20 elapsed · ETA 0:20"
    # Resumed at round 2: the pace counts the rounds run now only.
    resumed = Progress(4, start=2, stream=io.StringIO(), use_tqdm=False, clock=lambda: now[0])
    assert resumed.eta() is None
    now[0] += 5
    resumed.update(3, None, 1.25, 5.0)
    assert resumed.eta() == 5.0
    assert "val MAE 1.2500" in resumed.line("val MAE 1.2500")


def test_run_shows_progress_unless_told_not_to(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # our own bar, even where tqdm is installed
    fedweave.run(SMALL, tmp_path / "bar")
    err = capsys.readouterr().err
    assert "round 3/3 [########################] 100%" in err, err
    assert "ETA 0:00" in err and "val acc" in err
    fedweave.run(SMALL, tmp_path / "none", progress=False)
    assert "round" not in capsys.readouterr().err
    part = fedweave.run(SMALL, tmp_path / "part", progress=False, rounds=2)
    fedweave.resume(part.dir, rounds=3)
    err = capsys.readouterr().err
    assert "round 3/3" in err and "round 1/" not in err, err


def test_serve_runs_a_python_rule_where_the_server_runs(tmp_path):
    """`fedweave.serve` with a rule (in a child process, so a hang cannot
    stall the suite) and a real `fedweave worker` process hosting the six
    clients on loopback: the same accuracies and graphs as `fedweave.run`
    with the rule, and the rule ran in the server's process once a round."""
    binary = fedweave_binary()
    if binary is None:
        pytest.skip("no fedweave binary (cargo build) to run the clients with")
    import socket

    cfg = tmp_path / "net.toml"
    cfg.write_text(
        'seed = 3\nclients = 6\nrounds = 3\nthreads = 2\n[data]\ndataset = "digits"\n'
        '[partition]\nkind = "pathological"\nclasses_per_client = 2\n[model]\nkind = "mlp"\n'
        "[train]\nlocal_iterations = 5\nbatch_size = 16\nlr = 0.05\n"
        '[algorithm]\nname = "graph-rule"\nevaluate = "received"\n'
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "serve.py"
    script.write_text(
        "import json, os, sys, numpy, fedweave\n"
        "calls = []\n"
        "def rule(uploads, sizes, round, state):\n"
        "    calls.append([round, os.getpid()])\n"
        "    p = sizes / sizes.sum()\n"
        "    return numpy.tile(p, (len(sizes), 1))\n"
        f"fedweave.serve({str(cfg)!r}, '127.0.0.1:{port}', {str(tmp_path / 'net')!r}, graph_rule=rule, quiet=True)\n"
        "print(json.dumps({'calls': calls, 'pid': os.getpid()}))\n"
    )
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = subprocess.Popen(
        [str(binary), "worker", str(cfg), "--connect", f"http://127.0.0.1:{port}", "--ids", "0..6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        served, errors = server.communicate(timeout=240)
        logged, _ = worker.communicate(timeout=60)
    finally:
        server.kill()
        worker.kill()
    assert server.returncode == 0, errors
    assert worker.returncode == 0, logged
    seen = json.loads(served.strip().splitlines()[-1])
    assert seen["calls"] == [[r, seen["pid"]] for r in (1, 2, 3)]
    net = fedweave.load(tmp_path / "net")
    local = fedweave.run(cfg, tmp_path / "local", graph_rule=fedavg_rule, quiet=True)
    assert net.summary["algorithm"] == "graph-rule"
    assert net.summary["per_client_test_acc"] == local.summary["per_client_test_acc"]
    assert numpy.array_equal(net.graphs, local.graphs)
    with pytest.raises(fedweave.FedweaveError, match="listen"):
        fedweave.serve(cfg, "nowhere", tmp_path / "bad", graph_rule=fedavg_rule, quiet=True)
