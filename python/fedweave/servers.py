"""The graph methods' server steps on numpy arrays, run by fedweave's Rust kernels.

These are the functions the methods themselves run in ``fedweave.run`` (one
implementation each: ``fedweave_algos::{pfedgraph, feddwa,
fedaghn}::server_step``), exposed for use outside fedweave's own runtime —
the Flower strategies of :mod:`fedweave.flower` are built on them. Models
are rows of a ``[m, d]`` array (converted to float32), W is float64.

Every function takes the uploads of the round's participants; W comes back
over all ``n`` clients when ``participants`` (ascending indices below ``n``)
are given — identity rows for the absent ones, as in a run's graphs — and
over the participants otherwise. Bad input (wrong shapes, non-finite values,
unknown participants) raises ``ValueError`` before any work starts.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy
import numpy.typing as npt

from . import _fedweave

__all__ = ["FedAghnServer", "check_models", "feddwa", "layer_groups", "mix", "pfedgraph"]


def check_models(models: npt.ArrayLike, what: str = "uploads", d: Optional[int] = None) -> numpy.ndarray:
    """``models`` as a C-contiguous little-endian float32 ``[m, d]`` array,
    or ``ValueError`` naming ``what`` (not 2-D, no rows, another ``d``,
    non-finite values)."""
    arr = numpy.asarray(models)
    if arr.ndim != 2:
        raise ValueError(f"{what} must be a [clients, d] array, got shape {arr.shape}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{what} is empty (shape {arr.shape})")
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"{what} has {arr.shape[1]} values per model, expected {d}")
    arr = numpy.ascontiguousarray(arr, dtype="<f4")
    bad = ~numpy.isfinite(arr)
    if bad.any():
        row, col = numpy.argwhere(bad)[0]
        raise ValueError(f"{what}[{row}, {col}] = {arr[row, col]}: models must be finite")
    return arr


def _participants(participants: Optional[Sequence[int]], m: int, n: Optional[int]) -> Tuple[List[int], int]:
    """(participant indices, number of clients), checked."""
    if participants is None:
        if n is not None and n != m:
            raise ValueError(f"n = {n} clients needs the participants' indices for {m} uploads")
        return list(range(m)), m
    ids = [int(i) for i in participants]
    if len(ids) != m:
        raise ValueError(f"{len(ids)} participants for {m} uploads")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"participants must be ascending and distinct, got {ids}")
    n = (max(ids) + 1 if ids else 0) if n is None else int(n)
    if ids and (ids[0] < 0 or ids[-1] >= n):
        raise ValueError(f"participants {ids} are not all among the {n} clients")
    return ids, n


def _square(raw: bytes, n: int) -> numpy.ndarray:
    return numpy.frombuffer(raw, dtype="<f8").reshape(n, n).copy()


def _models(raw: bytes, m: int, d: int) -> numpy.ndarray:
    return numpy.frombuffer(raw, dtype="<f4").reshape(m, d).copy()


def _sizes(sizes: npt.ArrayLike, m: int) -> List[int]:
    arr = numpy.asarray(sizes)
    if arr.shape != (m,):
        raise ValueError(f"sizes must have one entry per upload ({m}), got shape {arr.shape}")
    if not numpy.issubdtype(arr.dtype, numpy.integer):
        if not (numpy.isfinite(arr).all() and (arr == numpy.round(arr)).all()):
            raise ValueError(f"sizes must be whole numbers, got {arr.tolist()}")
    if (arr < 0).any():
        raise ValueError(f"sizes must be ≥ 0, got {arr.tolist()}")
    return [int(x) for x in arr]


def pfedgraph(
    uploads: npt.ArrayLike,
    sizes: npt.ArrayLike,
    init: npt.ArrayLike,
    *,
    alpha: float,
    threshold: float = 0.9,
    participants: Optional[Sequence[int]] = None,
    n: Optional[int] = None,
) -> Tuple[numpy.ndarray, numpy.ndarray]:
    """pFedGraph's graph and mixed models (Ye et al., ICML 2023).

    S_ij = cos(θ_i − θ_init, θ_j − θ_init), values above ``threshold`` set
    to 1; row i of W is the simplex projection of p + s_i/(2·alpha), p the
    data-size weights ``sizes / sizes.sum()``; θ̃_i = Σ_j W_ij θ_j. (In a
    run, alpha defaults to 0.08 × the number of clients.) Returns ``(W,
    mixed)``: W ``[n, n]`` (or ``[m, m]``), mixed ``[m, d]`` float32 in the
    participants' order.
    """
    arr = check_models(uploads)
    m, d = arr.shape
    ids, n = _participants(participants, m, n)
    base = check_models(numpy.asarray(init).reshape(1, -1), "init", d)
    if not (numpy.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if not numpy.isfinite(threshold):
        raise ValueError(f"threshold must be finite, got {threshold}")
    w, mixed = _fedweave.pfedgraph_step(
        arr.tobytes(), m, d, ids, n, _sizes(sizes, m), base.tobytes(), float(alpha), float(threshold)
    )
    return _square(w, n), _models(mixed, m, d)


def feddwa(
    models: npt.ArrayLike,
    guidance: npt.ArrayLike,
    *,
    top_k: int = 5,
    participants: Optional[Sequence[int]] = None,
    n: Optional[int] = None,
) -> Tuple[numpy.ndarray, numpy.ndarray]:
    """FedDWA's graph and mixed models (Liu et al., IJCAI 2023).

    Row i: P_ij ∝ 1/‖ŵ*_i − ŵ_j‖² over the trained ``models`` ŵ_j and
    client i's ``guidance`` model ŵ*_i (one more local epoch), cut to its
    ``top_k`` largest entries and renormalised; client i receives Σ_j P_ij
    ŵ_j. Returns ``(W, mixed)`` as :func:`pfedgraph`.
    """
    arr = check_models(models, "models")
    m, d = arr.shape
    guide = check_models(guidance, "guidance", d)
    if guide.shape[0] != m:
        raise ValueError(f"{guide.shape[0]} guidance models for {m} models")
    if int(top_k) < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    ids, n = _participants(participants, m, n)
    w, mixed = _fedweave.feddwa_step(arr.tobytes(), guide.tobytes(), m, d, ids, n, int(top_k))
    return _square(w, n), _models(mixed, m, d)


def layer_groups(shapes: Sequence[Sequence[int]], per_group: Optional[Sequence[int]] = None) -> List[Tuple[str, int, int]]:
    """Layer groups ``(name, start, end)`` over the flat concatenation of
    tensors of ``shapes``: one group per tensor, or ``per_group[k]``
    consecutive tensors in group k (e.g. ``[2, 2, 2]`` for three layers'
    weight and bias). Names are ``layer0``, ``layer1``, ..."""
    sizes = [int(numpy.prod(s, dtype=numpy.int64)) for s in shapes]
    counts = [1] * len(sizes) if per_group is None else [int(c) for c in per_group]
    if any(c < 1 for c in counts) or sum(counts) != len(sizes):
        raise ValueError(f"per_group {list(counts)} must be positive and add up to the {len(sizes)} tensors")
    groups, start, t = [], 0, 0
    for k, c in enumerate(counts):
        size = sum(sizes[t : t + c])
        if size == 0:
            raise ValueError(f"layer group {k} has no elements")
        groups.append((f"layer{k}", start, start + size))
        start, t = start + size, t + c
    return groups


def mix(
    w: npt.ArrayLike,
    uploads: npt.ArrayLike,
    layers: Optional[Sequence[Tuple[str, int, int]]] = None,
) -> numpy.ndarray:
    """Σ_j W_ij θ_j for every row of W after checking W as ``graph-rule``
    does (finite, ≥ 0, rows summing to 1 within 1e-6): W ``[m, m]`` mixes
    the whole models, ``[L, m, m]`` mixes layer group l of ``layers``
    (``(name, start, end)``, see :func:`layer_groups`) by W[l]. A bad W is a
    :class:`fedweave.FedweaveError` with the check's message."""
    arr = check_models(uploads)
    m, d = arr.shape
    weights = numpy.ascontiguousarray(numpy.asarray(w, dtype=numpy.float64), dtype="<f8")
    groups = [("all", 0, d)] if layers is None else [(str(a), int(b), int(c)) for a, b, c in layers]
    if weights.shape not in ((m, m), (len(groups), m, m)):
        raise ValueError(f"W has shape {weights.shape}, expected ({m}, {m}) or ({len(groups)}, {m}, {m}) for {m} uploads")
    raw = _fedweave.rule_mix(weights.tobytes(), list(weights.shape), arr.tobytes(), d, groups)
    return _models(raw, m, d)


class FedAghnServer:
    """FedAGHN's server (Song et al.): per client and layer group a self
    weight p and a temperature q, learned by a hypernetwork step from each
    client's update; the personalised model of client i is, per layer,
    α_ii = p/(1+p) of its own model plus a softmax over the others' models
    of q·cos(Δ_i, Δ_j), scaled by 1/(1+p).

    ``init`` is the clients' common initial model (flat, length d) and
    ``layers`` its layer groups (:func:`layer_groups`). Clients are indices
    from 0; :meth:`add_clients` makes room for more. The state lives in
    Rust (the one implementation ``fedaghn`` runs).
    """

    def __init__(
        self,
        init: npt.ArrayLike,
        layers: Sequence[Tuple[str, int, int]],
        clients: int = 0,
        *,
        p_init: float = 0.03,
        q_init: float = 0.5,
        hn_lr: float = 0.005,
        hn_sign: str = "fedaghn",
    ):
        base = check_models(numpy.asarray(init).reshape(1, -1), "init")
        self.d = base.shape[1]
        self.layers = [(str(a), int(b), int(c)) for a, b, c in layers]
        self._server = _fedweave.FedAghnServer(
            base.tobytes(), self.d, self.layers, p_init=p_init, q_init=q_init, hn_lr=hn_lr, hn_sign=hn_sign
        )
        if clients:
            self.add_clients(clients)

    @property
    def clients(self) -> int:
        """Number of clients the state holds."""
        return self._server.clients

    @property
    def p(self) -> numpy.ndarray:
        """Self weights, ``[clients, layers]``."""
        return numpy.array(self._server.p, dtype=numpy.float64).reshape(self.clients, len(self.layers))

    @property
    def q(self) -> numpy.ndarray:
        """Temperatures, ``[clients, layers]``."""
        return numpy.array(self._server.q, dtype=numpy.float64).reshape(self.clients, len(self.layers))

    def add_clients(self, more: int) -> None:
        """Adds ``more`` clients in their initial state (p_init, q_init)."""
        if int(more) < 0:
            raise ValueError(f"cannot add {more} clients")
        self._server.add_clients(int(more))

    def step(
        self, uploads: npt.ArrayLike, participants: Sequence[int]
    ) -> Tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        """One round on the ``[m, d]`` uploads of ``participants``
        (ascending): steps their hypernetworks, then returns ``(layer W
        [L, n, n], their mean [n, n], personalised models [m, d])``."""
        arr = check_models(uploads, d=self.d)
        m = arr.shape[0]
        ids, _ = _participants(participants, m, self.clients)
        layers, mean, mixed = self._server.step(arr.tobytes(), m, ids)
        n, big_l = self.clients, len(self.layers)
        return (
            numpy.frombuffer(layers, dtype="<f8").reshape(big_l, n, n).copy(),
            _square(mean, n),
            _models(mixed, m, self.d),
        )
