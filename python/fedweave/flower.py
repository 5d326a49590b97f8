"""fedweave's collaboration-graph methods as Flower strategies.

``PFedGraph``, ``FedDWA``, ``FedAGHN`` and ``GraphRule`` (a graph rule
written in Python) implement Flower's ``flwr.server.strategy.Strategy``:
``configure_fit`` sends every sampled client *its own* personalised
parameters (the mixture its row of the collaboration graph W gives; the
current global parameters before it has one), and ``aggregate_fit`` infers
W from the uploads with fedweave's Rust kernels (:mod:`fedweave.servers`,
the code ``fedweave run`` runs) and mixes a model for each participant::

    import flwr
    from fedweave.flower import PFedGraph

    strategy = PFedGraph(initial_parameters=flwr.common.ndarrays_to_parameters(init), alpha=0.8)
    flwr.server.start_server(config=flwr.server.ServerConfig(num_rounds=50), strategy=strategy)
    strategy.graph        # the last round's W over every client seen (numpy)

Clients are told apart by ``ClientProxy.cid`` and numbered in the order the
strategy first meets them (:attr:`GraphStrategy.cids`). All state — W, each
client's personalised model, FedAGHN's hypernetwork, a rule's state — lives
in the strategy object. Parameters are mixed in float32 and handed back in
each tensor's own dtype. Needs ``pip install flwr``; importing
``fedweave`` itself does not.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    MetricsAggregationFn,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from . import FedweaveError, _wants_layers, servers

__all__ = ["FedAGHN", "FedDWA", "GraphRule", "GraphStrategy", "PFedGraph"]

EvaluateFn = Callable[[int, NDArrays, Dict[str, Scalar]], Optional[Tuple[float, Dict[str, Scalar]]]]


class GraphStrategy(Strategy):
    """The Flower plumbing the graph strategies share (sampling as Flower's
    ``FedAvg`` does, client numbering, the per-client models, evaluation);
    subclasses supply :meth:`infer`.

    ``initial_parameters``: the model every client starts from (θ_init);
    without it the parameters of the first ``configure_fit`` are taken.
    ``evaluate_fn(server_round, ndarrays, config)`` evaluates the global
    model (the data-size-weighted mean of the round's uploads) centrally.
    The other arguments are ``FedAvg``'s.
    """

    #: Models per upload (FedDWA's clients upload two).
    models_per_upload = 1

    def __init__(
        self,
        *,
        fraction_fit: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_fit_clients: int = 2,
        min_evaluate_clients: int = 2,
        min_available_clients: int = 2,
        initial_parameters: Optional[Parameters] = None,
        evaluate_fn: Optional[EvaluateFn] = None,
        on_fit_config_fn: Optional[Callable[[int], Dict[str, Scalar]]] = None,
        on_evaluate_config_fn: Optional[Callable[[int], Dict[str, Scalar]]] = None,
        accept_failures: bool = True,
        fit_metrics_aggregation_fn: Optional[MetricsAggregationFn] = None,
        evaluate_metrics_aggregation_fn: Optional[MetricsAggregationFn] = None,
    ) -> None:
        super().__init__()
        if not (0.0 <= fraction_fit <= 1.0 and 0.0 <= fraction_evaluate <= 1.0):
            raise ValueError("fraction_fit and fraction_evaluate must be in [0, 1]")
        self.fraction_fit = fraction_fit
        self.fraction_evaluate = fraction_evaluate
        self.min_fit_clients = min_fit_clients
        self.min_evaluate_clients = min_evaluate_clients
        self.min_available_clients = min_available_clients
        self.initial_parameters = initial_parameters
        self.evaluate_fn = evaluate_fn
        self.on_fit_config_fn = on_fit_config_fn
        self.on_evaluate_config_fn = on_evaluate_config_fn
        self.accept_failures = accept_failures
        self.fit_metrics_aggregation_fn = fit_metrics_aggregation_fn
        self.evaluate_metrics_aggregation_fn = evaluate_metrics_aggregation_fn
        #: Client ids in the order of their indices.
        self.cids: List[str] = []
        self._index: Dict[str, int] = {}
        self._personal: Dict[int, numpy.ndarray] = {}
        self._shapes: Optional[List[Tuple[int, ...]]] = None
        self._dtypes: List[numpy.dtype] = []
        self.init: Optional[numpy.ndarray] = None
        #: W of every round that aggregated (over the clients known then).
        self.graphs: List[numpy.ndarray] = []
        #: Per-layer methods: each such round's ``[layers, n, n]`` W.
        self.layer_graphs: List[numpy.ndarray] = []

    def __repr__(self) -> str:
        return f"fedweave.flower.{type(self).__name__}(clients={len(self.cids)})"

    # Client numbering and parameter layout.

    def index(self, cid: str, register: bool = False) -> int:
        """The index of client ``cid``; new clients are numbered when
        ``register`` (sampling does), otherwise an unknown ``cid`` is a
        ``KeyError``."""
        if cid not in self._index:
            if not register:
                raise KeyError(f"unknown Flower client {cid!r}: it was never sent a fit instruction by this strategy")
            self._index[cid] = len(self.cids)
            self.cids.append(cid)
            self.on_new_clients(1)
        return self._index[cid]

    def on_new_clients(self, more: int) -> None:
        """Called when ``more`` clients are numbered (per-client state grows)."""

    @property
    def graph(self) -> numpy.ndarray:
        """The last round's W over all clients known then (identity rows for
        those absent); the identity before the first round."""
        return self.graphs[-1] if self.graphs else numpy.eye(len(self.cids))

    def _layout(self, arrays: NDArrays) -> None:
        """Takes ``arrays`` (the initial model) as the tensors' shapes and dtypes."""
        self._shapes = [tuple(a.shape) for a in arrays]
        self._dtypes = [a.dtype for a in arrays]
        self.init = self._flatten(arrays, "the initial parameters")

    def _flatten(self, arrays: NDArrays, what: str) -> numpy.ndarray:
        """The tensors as one float32 vector, checked against the layout."""
        assert self._shapes is not None
        if len(arrays) != len(self._shapes):
            raise ValueError(f"{what}: {len(arrays)} tensors, the model has {len(self._shapes)}")
        for k, (a, shape) in enumerate(zip(arrays, self._shapes)):
            if tuple(a.shape) != shape:
                raise ValueError(f"{what}: tensor {k} has shape {tuple(a.shape)}, the model's is {shape}")
        flat = numpy.concatenate([numpy.asarray(a, dtype=numpy.float32).ravel() for a in arrays])
        bad = ~numpy.isfinite(flat)
        if bad.any():
            raise ValueError(f"{what}: element {int(numpy.argmax(bad))} is {flat[bad][0]} (parameters must be finite)")
        return flat

    def _unflatten(self, flat: numpy.ndarray) -> NDArrays:
        """A flat vector as the model's tensors, each in its own dtype."""
        assert self._shapes is not None
        out, start = [], 0
        for shape, dtype in zip(self._shapes, self._dtypes):
            size = int(numpy.prod(shape, dtype=numpy.int64))
            out.append(flat[start : start + size].reshape(shape).astype(dtype))
            start += size
        return out

    @property
    def shapes(self) -> List[Tuple[int, ...]]:
        """The model's tensor shapes (known from the initial parameters)."""
        if self._shapes is None:
            raise FedweaveError("the strategy has not seen the initial parameters yet")
        return list(self._shapes)

    def personalized(self, cid: str) -> Optional[NDArrays]:
        """Client ``cid``'s personalised model (None before it has one)."""
        flat = self._personal.get(self.index(cid))
        return None if flat is None else self._unflatten(flat)

    # The Strategy interface.

    def initialize_parameters(self, client_manager: ClientManager) -> Optional[Parameters]:
        """The initial global parameters (None: Flower asks a client)."""
        if self.initial_parameters is not None and self._shapes is None:
            self._layout(parameters_to_ndarrays(self.initial_parameters))
        return self.initial_parameters

    def _sample(self, client_manager: ClientManager, fraction: float, minimum: int) -> List[ClientProxy]:
        available = client_manager.num_available()
        size = max(int(available * fraction), minimum)
        return client_manager.sample(num_clients=size, min_num_clients=self.min_available_clients)

    def _parameters_for(self, client: ClientProxy, parameters: Parameters) -> Parameters:
        """What ``client`` starts from: its own mix, else ``parameters``."""
        flat = self._personal.get(self.index(client.cid, register=True))
        return parameters if flat is None else ndarrays_to_parameters(self._unflatten(flat))

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> List[Tuple[ClientProxy, FitIns]]:
        """Samples clients; each gets its own personalised parameters."""
        if self._shapes is None:
            self._layout(parameters_to_ndarrays(parameters))
        config = self.on_fit_config_fn(server_round) if self.on_fit_config_fn is not None else {}
        clients = self._sample(client_manager, self.fraction_fit, self.min_fit_clients)
        return [(c, FitIns(self._parameters_for(c, parameters), dict(config))) for c in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: List[Tuple[ClientProxy, FitRes]],
        failures: List[Union[Tuple[ClientProxy, FitRes], BaseException]],
    ) -> Tuple[Optional[Parameters], Dict[str, Scalar]]:
        """Infers W from the uploads (:meth:`infer`), keeps each
        participant's mixed model for its next ``configure_fit``, and returns
        the data-size-weighted mean of the uploads as the global model."""
        if not results or (failures and not self.accept_failures):
            return None, {}
        if self._shapes is None:
            raise FedweaveError("aggregate_fit before the strategy has seen the initial parameters")
        rows = sorted(((self.index(c.cid), res) for c, res in results), key=lambda r: r[0])
        ids = [i for i, _ in rows]
        if len(set(ids)) != len(ids):
            raise ValueError("two results from the same client in one round")
        k = len(self._shapes)
        uploads: List[List[numpy.ndarray]] = [[] for _ in range(self.models_per_upload)]
        sizes = []
        for i, res in rows:
            arrays = parameters_to_ndarrays(res.parameters)
            if len(arrays) != k * self.models_per_upload:
                raise ValueError(
                    f"client {self.cids[i]!r} uploaded {len(arrays)} tensors, expected {k * self.models_per_upload}"
                    + (" (its model's, then its guidance model's)" if self.models_per_upload > 1 else "")
                )
            for u in range(self.models_per_upload):
                uploads[u].append(self._flatten(arrays[u * k : (u + 1) * k], f"client {self.cids[i]!r}"))
            if res.num_examples < 0:
                raise ValueError(f"client {self.cids[i]!r} reported {res.num_examples} examples")
            sizes.append(res.num_examples)
        stacked = [numpy.stack(u) for u in uploads]
        sizes_arr = numpy.asarray(sizes, dtype=numpy.int64)
        w, mixed, layers = self.infer(server_round, stacked, sizes_arr, ids)
        for i, model in zip(ids, mixed):
            self._personal[i] = model
        self.graphs.append(w)
        if layers is not None:
            self.layer_graphs.append(layers)
        total = sizes_arr.sum()
        p = sizes_arr / total if total > 0 else numpy.full(len(ids), 1.0 / len(ids))
        mean = (p[:, None] * stacked[0].astype(numpy.float64)).sum(axis=0).astype(numpy.float32)
        metrics: Dict[str, Scalar] = {}
        if self.fit_metrics_aggregation_fn is not None:
            metrics = self.fit_metrics_aggregation_fn([(res.num_examples, res.metrics) for _, res in results])
        return ndarrays_to_parameters(self._unflatten(mean)), metrics

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> List[Tuple[ClientProxy, EvaluateIns]]:
        """Samples clients; each evaluates its own personalised model."""
        if self.fraction_evaluate == 0.0:
            return []
        config = self.on_evaluate_config_fn(server_round) if self.on_evaluate_config_fn is not None else {}
        clients = self._sample(client_manager, self.fraction_evaluate, self.min_evaluate_clients)
        return [(c, EvaluateIns(self._parameters_for(c, parameters), dict(config))) for c in clients]

    def aggregate_evaluate(
        self,
        server_round: int,
        results: List[Tuple[ClientProxy, EvaluateRes]],
        failures: List[Union[Tuple[ClientProxy, EvaluateRes], BaseException]],
    ) -> Tuple[Optional[float], Dict[str, Scalar]]:
        """The example-weighted mean loss of the personalised models."""
        if not results or (failures and not self.accept_failures):
            return None, {}
        total = sum(r.num_examples for _, r in results)
        loss = sum(r.num_examples * r.loss for _, r in results) / total if total else None
        metrics: Dict[str, Scalar] = {}
        if self.evaluate_metrics_aggregation_fn is not None:
            metrics = self.evaluate_metrics_aggregation_fn([(r.num_examples, r.metrics) for _, r in results])
        return loss, metrics

    def evaluate(self, server_round: int, parameters: Parameters) -> Optional[Tuple[float, Dict[str, Scalar]]]:
        """``evaluate_fn`` on the global parameters, if one was given."""
        if self.evaluate_fn is None:
            return None
        return self.evaluate_fn(server_round, parameters_to_ndarrays(parameters), {})

    # The method.

    def infer(
        self, server_round: int, uploads: List[numpy.ndarray], sizes: numpy.ndarray, participants: List[int]
    ) -> Tuple[numpy.ndarray, numpy.ndarray, Optional[numpy.ndarray]]:
        """W over all ``len(cids)`` clients, the participants' mixed models
        ``[m, d]`` and, for per-layer methods, the ``[L, n, n]`` W; ``uploads``
        holds ``models_per_upload`` arrays ``[m, d]``, rows in the order of
        the ascending ``participants``."""
        raise NotImplementedError


class PFedGraph(GraphStrategy):
    """pFedGraph (Ye et al., ICML 2023): W_i = simplex projection of
    p + s_i/(2·alpha), s = cos(θ − θ_init) thresholded at ``threshold``;
    client i receives θ̃_i = Σ_j W_ij θ_j. ``alpha`` defaults to 0.08 ×
    ``num_clients`` (the clients seen so far when that is not given), as in
    ``fedweave run``. The local regulariser (−λ·cos(θ, θ̃_i)) is the
    clients' part: θ̃_i is what they receive."""

    def __init__(
        self, *, alpha: Optional[float] = None, threshold: float = 0.9, num_clients: Optional[int] = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.alpha = alpha
        self.threshold = threshold
        self.num_clients = num_clients

    def infer(self, server_round, uploads, sizes, participants):
        alpha = self.alpha if self.alpha is not None else 0.08 * (self.num_clients or len(self.cids))
        w, mixed = servers.pfedgraph(
            uploads[0],
            sizes,
            self.init,
            alpha=alpha,
            threshold=self.threshold,
            participants=participants,
            n=len(self.cids),
        )
        return w, mixed, None


class FedDWA(GraphStrategy):
    """FedDWA (Liu et al., IJCAI 2023): each client uploads its trained
    model's tensors followed by its guidance model's (one more local epoch
    on a copy); row i: P_ij ∝ 1/‖ŵ*_i − ŵ_j‖², its ``top_k`` largest kept;
    client i receives Σ_j P_ij ŵ_j."""

    models_per_upload = 2

    def __init__(self, *, top_k: int = 5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if int(top_k) < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        self.top_k = int(top_k)

    def infer(self, server_round, uploads, sizes, participants):
        w, mixed = servers.feddwa(
            uploads[0], uploads[1], top_k=self.top_k, participants=participants, n=len(self.cids)
        )
        return w, mixed, None


class FedAGHN(GraphStrategy):
    """FedAGHN (Song et al.): per layer group, W_ii = p/(1+p) and W_ij =
    softmax_{j≠i}(q·cos(Δ_i, Δ_j))/(1+p), with each client's (p, q) learned
    by a hypernetwork step from its update (:class:`fedweave.servers.FedAghnServer`,
    kept in :attr:`server`). ``tensors_per_layer`` groups consecutive
    tensors into layers (e.g. ``[2, 2]``: weight and bias of two layers);
    by default every tensor is its own layer. :attr:`graph` is the mean
    over layers, :attr:`layer_graphs` each."""

    def __init__(
        self,
        *,
        tensors_per_layer: Optional[Sequence[int]] = None,
        p_init: float = 0.03,
        q_init: float = 0.5,
        hn_lr: float = 0.005,
        hn_sign: str = "fedaghn",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.tensors_per_layer = tensors_per_layer
        self.hn = dict(p_init=p_init, q_init=q_init, hn_lr=hn_lr, hn_sign=hn_sign)
        self.server: Optional[servers.FedAghnServer] = None

    def _layout(self, arrays: NDArrays) -> None:
        super()._layout(arrays)
        layers = servers.layer_groups(self.shapes, self.tensors_per_layer)
        self.server = servers.FedAghnServer(self.init, layers, len(self.cids), **self.hn)

    def on_new_clients(self, more: int) -> None:
        if self.server is not None:
            self.server.add_clients(more)

    def infer(self, server_round, uploads, sizes, participants):
        assert self.server is not None
        layers, w, mixed = self.server.step(uploads[0], participants)
        return w, mixed, layers


class GraphRule(GraphStrategy):
    """A graph rule written in Python, as in ``fedweave.run(config,
    graph_rule=rule)``: ``rule(uploads, sizes, round, state) -> W`` gets the
    participants' models ``[m, d]`` (float32, read-only; rows in the order
    of the ascending client indices), their ``num_examples``, the round and
    its own state dict (kept in the strategy), and returns W ``[m, m]`` —
    or ``[L, m, m]``, one per layer group of ``tensors_per_layer`` (see
    :class:`FedAGHN`). A rule with a ``layers`` parameter also gets a dict
    from layer name to that layer's columns. W is checked and mixed by
    fedweave's kernels; a bad W raises :class:`fedweave.FedweaveError`
    naming the round."""

    def __init__(
        self,
        rule: Callable[..., Any],
        *,
        tensors_per_layer: Optional[Sequence[int]] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.rule = rule
        self.tensors_per_layer = tensors_per_layer
        self.state: Dict[str, Any] = {}
        self._wants_layers = _wants_layers(rule)

    def infer(self, server_round, uploads, sizes, participants):
        models = uploads[0]
        models.setflags(write=False)
        layers = servers.layer_groups(self.shapes, self.tensors_per_layer)
        extra = {}
        if self._wants_layers:
            extra["layers"] = {name: models[:, a:b] for name, a, b in layers}
        try:
            w = numpy.asarray(self.rule(models, sizes, server_round, self.state, **extra), dtype=numpy.float64)
            mixed = servers.mix(w, models, layers)
        except (FedweaveError, ValueError) as e:
            raise FedweaveError(f"graph_rule, round {server_round}: {e}") from e
        n = len(self.cids)
        ix = numpy.asarray(participants)

        def embed(rows: numpy.ndarray) -> numpy.ndarray:
            full = numpy.eye(n)
            full[ix] = 0.0
            full[numpy.ix_(ix, ix)] = rows
            return full

        if w.ndim == 3:
            per_layer = numpy.stack([embed(x) for x in w])
            return per_layer.mean(axis=0), mixed, per_layer
        return embed(w), mixed, None
