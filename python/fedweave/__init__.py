"""fedweave from Python: personalised federated learning with collaboration graphs.

A thin layer over the Rust library the ``fedweave`` command runs: the same
configs, the same run directories, the same messages. ::

    import fedweave

    run = fedweave.run("examples/quickstart.toml", rounds=5, **{"algorithm.name": "pfedgraph"})
    print(run.summary["mean_test_acc"])
    run.rounds[["round", "mean_val_acc"]]   # pandas, one row per round
    run.graphs.shape                        # (rounds, clients, clients)
    run.models("best")[0]["fc3.weight"]     # numpy, PyTorch state_dict names

Runs release the GIL and show a progress bar (``progress=False``: none).
:func:`serve` runs the server of a networked run in this process (a Python
graph rule runs there); :mod:`fedweave.servers` has the graph methods' server
steps on numpy arrays and :mod:`fedweave.flower` the Flower strategies.
Ctrl-C stops a run after its current round with its checkpoint written and
raises ``KeyboardInterrupt``; ``fedweave.resume(dir)`` continues it. Errors
are :class:`FedweaveError` carrying the command line's message.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Union

from . import _fedweave
from ._fedweave import FedweaveError

__all__ = [
    "FedweaveError",
    "Run",
    "algorithms",
    "initial_model",
    "load",
    "resume",
    "run",
    "serve",
    "sweep",
    "__version__",
]

__version__: str = _fedweave.__version__

Config = Union[str, "os.PathLike[str]", Mapping[str, Any]]


def _toml_value(value: Any, key: str) -> str:
    """``value`` as a TOML literal (for ``--set``-style overrides)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FedweaveError(f"{key}: {value} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, key) for v in value) + "]"
    if isinstance(value, Mapping):
        items = (f"{json.dumps(str(k))} = {_toml_value(v, f'{key}.{k}')}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise FedweaveError(f"{key}: cannot express a {type(value).__name__} in a config")


def _overrides(table: Mapping[str, Any], prefix: str = "") -> list:
    """A (nested) mapping as dotted ``key=value`` overrides."""
    out = []
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and not (isinstance(k, str) and "." in k):
            out.extend(_overrides(v, key + "."))
        else:
            out.append(f"{key}={_toml_value(v, key)}")
    return out


def _config(config: Config) -> tuple:
    """(TOML text, path or None, overrides) for a path, TOML text or mapping."""
    if isinstance(config, Mapping):
        return "", None, _overrides(config)
    if isinstance(config, os.PathLike) or (
        isinstance(config, str) and "\n" not in config and config.endswith(".toml")
    ):
        path = os.fspath(config)
        if not os.path.isfile(path):
            raise FedweaveError(f"cannot read {path}: no such file")
        return "", path, []
    if isinstance(config, str):
        return config, None, []
    raise TypeError("config must be a path, TOML text or a mapping")


GraphRule = Callable[..., Any]
"""``rule(uploads, sizes, round, state[, layers]) -> W``: see :func:`run`."""


def _wants_layers(rule: GraphRule) -> bool:
    """Whether ``rule`` takes a ``layers`` argument (or ``**kwargs``)."""
    import inspect

    try:
        params = inspect.signature(rule).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "layers" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _rule_adapter(rule: GraphRule) -> Callable[..., tuple]:
    """The callable the Rust server calls each round: numpy in, W out.

    ``rule(uploads, sizes, round, state)`` gets the participants' models as
    a ``[participants, d]`` float32 array (read-only), their data sizes, the
    round (from 1) and its state dict (persisted between rounds as JSON, so
    it must hold JSON values; checkpoints carry it), and returns W:
    ``participants × participants``, or ``layers × participants ×
    participants`` (one W per layer group, in the order of ``layers``). A
    rule with a ``layers`` parameter also gets ``layers``: layer-group name →
    the uploads' columns of that group (a ``[participants, size]`` view).
    Returns ``(W as float64 bytes, W's shape, state as JSON)``; the Rust side
    checks W and names the round in its errors.
    """
    import numpy

    layered = _wants_layers(rule)

    def call(models, p, d, sizes, round, participants, layers, state):
        uploads = numpy.frombuffer(models, dtype="<f4").reshape(p, d)
        st = json.loads(state)
        extra = {}
        if layered:
            extra["layers"] = {name: uploads[:, a:b] for name, a, b in layers}
        w = numpy.asarray(
            rule(uploads, numpy.asarray(sizes, dtype=numpy.int64), round, st, **extra), dtype=numpy.float64
        )
        if w.shape != (p, p) and w.shape != (len(layers), p, p):
            names = ", ".join(name for name, _, _ in layers)
            raise ValueError(
                f"graph_rule returned W of shape {w.shape}, expected ({p}, {p}) for the round's participants "
                f"or ({len(layers)}, {p}, {p}), one W per layer group ({names})"
            )
        return numpy.ascontiguousarray(w, dtype="<f8").tobytes(), list(w.shape), json.dumps(st)

    return call


def _progress_bar(total: int, start: int, progress: bool, quiet: bool):
    """The progress bar for a run (None when off)."""
    if quiet or not progress:
        return None
    from ._progress import Progress

    return Progress(total, start)


def _drive(call: Callable[..., str], bar, **kwargs: Any) -> str:
    """Runs the extension's ``call`` with the bar as its round callback."""
    try:
        return call(quiet=bar is None, on_round=None if bar is None else bar.update, **kwargs)
    finally:
        if bar is not None:
            bar.close()


def run(
    config: Config,
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
    graph_rule: Optional[GraphRule] = None,
    *,
    overwrite: bool = False,
    quiet: bool = False,
    progress: bool = True,
    **overrides: Any,
) -> "Run":
    """Runs one experiment and returns it.

    ``config`` is a path to a TOML file, TOML text, or a mapping shaped like
    the file (``{"data": {"dataset": "digits"}, "rounds": 5}``).
    ``overrides`` set keys by their dotted path, as ``--set`` does:
    ``fedweave.run(cfg, rounds=5, **{"train.lr": 0.05})``. ``out`` defaults
    to a fresh directory under ``runs/``; an existing run there is refused
    unless ``overwrite``.

    A progress bar on stderr shows the rounds done, the last mean
    validation accuracy, elapsed time and ETA (tqdm's when tqdm is
    installed); ``progress=False`` or ``quiet=True`` turns it off.

    ``graph_rule(uploads, sizes, round, state) -> W`` makes the server's
    graph rule a Python function (the method ``graph-rule``): ``uploads`` is
    the round's participants' models, a read-only ``[participants, d]``
    float32 array in the layout's order (:func:`initial_model`), ``sizes``
    their training-set sizes, ``round`` counts from 1 and ``state`` is the
    rule's own dict (JSON values; checkpointed, so resumes see it). W is
    ``participants × participants`` — or ``layers × participants ×
    participants``, one W per layer group of the model (as FedAGHN's
    per-layer graphs; :attr:`Run.graphs` then holds their mean and
    :meth:`Run.layer_graphs` each). A rule with a ``layers`` parameter also
    gets ``layers=``, a dict from layer-group name to that group's columns
    of ``uploads``. fedweave checks W (finite, non-negative, rows summing to
    1), mixes (layer by layer for a per-layer W) and trains the clients; a
    bad W stops the run with a :class:`FedweaveError` naming the round.
    ``**{"algorithm.evaluate": "received"}`` scores the mixed models
    instead of the trained ones.
    """
    text, path, sets, total = _prepare(config, overrides, graph_rule, progress and not quiet)
    where = _drive(
        _fedweave.run,
        _progress_bar(total, 0, progress, quiet),
        text=text,
        path=path,
        out=None if out is None else os.fspath(out),
        overrides=sets,
        overwrite=overwrite,
        rule=None if graph_rule is None else _rule_adapter(graph_rule),
    )
    return Run(where)


def _prepare(config: Config, overrides: Mapping[str, Any], graph_rule: Optional[GraphRule], bar: bool) -> tuple:
    """The config's text and path, its ``--set`` lines (``graph-rule`` as
    the method when a rule is given) and, for a progress bar, its rounds."""
    text, path, base = _config(config)
    sets = base + _overrides(overrides)
    if graph_rule is not None:
        sets.append('algorithm.name="graph-rule"')
    return text, path, sets, _rounds_of(sets, text, path) if bar else 0


def _rounds_of(sets: list, text: str, path: Optional[str]) -> int:
    """The run's rounds: the last ``rounds=`` override, else the config's."""
    for item in reversed(sets):
        key, _, value = item.partition("=")
        if key == "rounds":
            return int(value)
    return _config_rounds(text, path)


def _config_rounds(text: str, path: Optional[str]) -> int:
    """The top-level ``rounds`` of TOML ``text`` (or the file ``path``); 0
    when it is not set there (the bar then shows rounds without a total)."""
    import re

    if path is not None:
        text = Path(path).read_text()
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            break
        m = re.match(r"\s*rounds\s*=\s*(\d+)", line)
        if m:
            return int(m.group(1))
    return 0


def resume(
    dir: Union[str, "os.PathLike[str]"],
    rounds: Optional[int] = None,
    graph_rule: Optional[GraphRule] = None,
    *,
    quiet: bool = False,
    progress: bool = True,
) -> "Run":
    """Continues the run in ``dir`` from its last checkpoint (to ``rounds``
    rounds if given); the result equals an uninterrupted run. A
    ``graph-rule`` run needs its ``graph_rule`` again. The progress bar
    starts at the rounds already done (``progress=False``: none)."""
    rule = None if graph_rule is None else _rule_adapter(graph_rule)
    bar = None
    if progress and not quiet and _fedweave.is_run_dir(os.fspath(dir)):
        done = len(Run(dir)._records())
        total = rounds if rounds is not None else _config_rounds("", os.fspath(Path(dir) / "config.toml"))
        bar = _progress_bar(total, done, progress, quiet)
    return Run(_drive(_fedweave.resume, bar, dir=os.fspath(dir), rounds=rounds, rule=rule))


def serve(
    config: Config,
    listen: str = "127.0.0.1:7070",
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
    graph_rule: Optional[GraphRule] = None,
    *,
    resume: bool = False,
    tokens: Optional[Union[str, "os.PathLike[str]"]] = None,
    quiet: bool = False,
    progress: bool = True,
    **overrides: Any,
) -> "Run":
    """Serves a networked run in this process, as ``fedweave serve CONFIG
    --listen ADDR`` does, and returns it when its last round is done.

    Clients are ``fedweave client CONFIG --connect http://ADDR --id I`` (or
    ``worker``) processes with the same config. With ``graph_rule`` the run
    is a ``graph-rule`` run whose rule (see :func:`run`) runs here, where
    the server runs; the clients need the config with ``algorithm.name =
    "graph-rule"`` (it is set here for the server). ``tokens``: a file of
    ``id token`` lines clients must present; ``resume``: continue from the
    directory's last checkpoint. Serving a non-loopback address needs TLS
    and credentials: use the command line for that.
    """
    text, path, sets, total = _prepare(config, overrides, graph_rule, progress and not quiet)
    where = _drive(
        _fedweave.serve,
        _progress_bar(total, 0, progress, quiet),
        text=text,
        listen=str(listen),
        path=path,
        out=None if out is None else os.fspath(out),
        overrides=sets,
        resume=resume,
        tokens=None if tokens is None else os.fspath(tokens),
        rule=None if graph_rule is None else _rule_adapter(graph_rule),
    )
    return Run(where)


def load(dir: Union[str, "os.PathLike[str]"]) -> "Run":
    """The run in ``dir``, finished or not."""
    return Run(dir)


def sweep(
    grid: Union[str, "os.PathLike[str]"],
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    jobs: int = 1,
    quiet: bool = False,
    graph_rule: Optional[GraphRule] = None,
) -> "pandas.DataFrame":  # noqa: F821
    """Runs the grid file ``grid`` (finished runs are skipped) and returns
    its ``results.csv`` as a DataFrame (one row per run).

    ``graph_rule`` (as in :func:`run`) is the rule of the grid's
    ``algorithm.name = "graph-rule"`` runs; each run keeps its own
    ``state``, and with ``jobs > 1`` the rule is called from several runs
    at once (one at a time: it holds the GIL)."""
    import pandas

    where = _fedweave.sweep(
        os.fspath(grid),
        out=None if out is None else os.fspath(out),
        jobs=jobs,
        quiet=quiet,
        rule=None if graph_rule is None else _rule_adapter(graph_rule),
    )
    return pandas.read_csv(Path(where) / "results.csv")


def initial_model(config: Config, **overrides: Any) -> "numpy.ndarray":  # noqa: F821
    """The model every client of ``config`` starts from, flat (float32, in
    the order of the uploads a graph rule receives): θ_init for rules that,
    like pFedGraph's, compare models by how far they moved."""
    import numpy

    text, path, base = _config(config)
    raw = _fedweave.initial_model(text, path=path, overrides=base + _overrides(overrides))
    return numpy.frombuffer(raw, dtype="<f4").copy()


def algorithms() -> "pandas.DataFrame":  # noqa: F821
    """Every algorithm: name, summary (graph rule and local objective), reference."""
    import pandas

    return pandas.DataFrame(_fedweave.algorithms(), columns=["name", "summary", "reference"])


class Run:
    """A run directory and what it holds (read when asked for)."""

    def __init__(self, dir: Union[str, "os.PathLike[str]"]):
        self.dir = Path(dir)
        if not _fedweave.is_run_dir(os.fspath(self.dir)):
            raise FedweaveError(f"{self.dir} is not a run directory (no config.toml with rounds.jsonl or a checkpoint)")

    def __repr__(self) -> str:
        return f"fedweave.Run({str(self.dir)!r})"

    @property
    def config(self) -> str:
        """The resolved configuration that ran (TOML text)."""
        return (self.dir / "config.toml").read_text()

    @property
    def summary(self) -> Dict[str, Any]:
        """``summary.json``: the headline figures (``mean_test_acc``, ...)."""
        path = self.dir / "summary.json"
        if not path.is_file():
            raise FedweaveError(f"{self.dir} has no summary.json yet: the run has not finished (fedweave.resume continues it)")
        return json.loads(path.read_text())

    def _records(self) -> list:
        path = self.dir / "rounds.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    @property
    def rounds(self) -> "pandas.DataFrame":  # noqa: F821
        """One row per round (``rounds.jsonl`` without its graphs: see
        :attr:`graphs`)."""
        import pandas

        rows = [{k: v for k, v in r.items() if k not in ("graph", "graph_layers")} for r in self._records()]
        return pandas.DataFrame(rows)

    @property
    def graphs(self) -> "numpy.ndarray":  # noqa: F821
        """The collaboration graphs, ``rounds × clients × clients`` (the mean
        over layers for per-layer methods; see :meth:`layer_graphs`)."""
        import numpy

        return numpy.array([r["graph"] for r in self._records()], dtype=numpy.float64)

    def layer_graphs(self) -> Dict[str, "numpy.ndarray"]:  # noqa: F821
        """Per-layer methods: layer name → ``rounds × clients × clients``."""
        import numpy

        records = self._records()
        names = records[0].get("graph_layers", {}).keys() if records else []
        return {n: numpy.array([r["graph_layers"][n] for r in records], dtype=numpy.float64) for n in names}

    @property
    def clients(self) -> "pandas.DataFrame":  # noqa: F821
        """One row per client: whether it is malicious, its data sizes,
        training label counts, test accuracy of its best-validation model
        and the round that model is from."""
        import pandas

        info = _fedweave.clients(os.fspath(self.dir))
        rows = []
        summary = self.summary if (self.dir / "summary.json").is_file() else {}
        acc = summary.get("per_client_test_acc") or [None] * len(info)
        best = summary.get("per_client_best_round") or [None] * len(info)
        for i, (benign, train, val, test, labels) in enumerate(info):
            rows.append(
                {
                    "client": i,
                    "malicious": not benign,
                    "train_size": train,
                    "val_size": val,
                    "test_size": test,
                    "label_counts": list(labels),
                    "test_acc": acc[i] if i < len(acc) else None,
                    "best_round": best[i] if i < len(best) else None,
                }
            )
        return pandas.DataFrame(rows).set_index("client")

    def models(self, which: str = "best") -> Dict[int, Dict[str, "numpy.ndarray"]]:  # noqa: F821
        """Each client's kept model (``"best"``: the best-validation one
        behind ``mean_test_acc``; ``"last"``) as ``{name: array}`` with the
        names and shapes of ``fedweave export`` (PyTorch's ``state_dict``)."""
        import numpy

        out = {}
        for client, tensors in _fedweave.models(os.fspath(self.dir), which):
            out[client] = {
                name: numpy.frombuffer(data, dtype=numpy.dtype(dtype).newbyteorder("<")).reshape(shape).copy()
                for name, shape, dtype, data in tensors
            }
        return out

    @property
    def report_path(self) -> Path:
        """The run's HTML report."""
        return self.dir / "report.html"
