"""fedweave's graph methods as Flower strategies, driven through Flower's
`Strategy` API with stub client proxies (no Flower simulation engine).

Run from the repository root after `pip install ./python flwr`:
    python3 -m pytest python/tests
"""

import numpy
import pytest

flwr = pytest.importorskip("flwr")

from flwr.common import Code, EvaluateRes, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays  # noqa: E402
from flwr.server.client_manager import ClientManager  # noqa: E402
from flwr.server.client_proxy import ClientProxy  # noqa: E402
from flwr.server.strategy import Strategy  # noqa: E402

import fedweave  # noqa: E402
from fedweave import flower, servers  # noqa: E402

from test_fedweave import SMALL  # noqa: E402


class StubClient(ClientProxy):
    """A client proxy the strategies only read the cid of."""

    def get_properties(self, ins, timeout, group_id):
        raise NotImplementedError

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


class StubManager(ClientManager):
    """Samples the first `num_clients` registered clients, in order."""

    def __init__(self, clients):
        self.clients = {c.cid: c for c in clients}

    def num_available(self):
        return len(self.clients)

    def register(self, client):
        self.clients[client.cid] = client
        return True

    def unregister(self, client):
        del self.clients[client.cid]

    def all(self):
        return dict(self.clients)

    def wait_for(self, num_clients, timeout=0):
        return len(self.clients) >= num_clients

    def sample(self, num_clients, min_num_clients=None, criterion=None):
        return list(self.clients.values())[:num_clients]


def split(flat, shapes):
    """A flat vector as tensors of `shapes`."""
    out, start = [], 0
    for s in shapes:
        size = int(numpy.prod(s))
        out.append(numpy.asarray(flat[start : start + size], dtype=numpy.float32).reshape(s))
        start += size
    return out


def fit_res(tensors, examples):
    return FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters(tensors), num_examples=examples, metrics={})


def sent_models(instructions):
    """cid → the flat model a configure_fit sends it."""
    return {c.cid: numpy.concatenate([a.ravel() for a in parameters_to_ndarrays(ins.parameters)]) for c, ins in instructions}


def fedavg_mean(p, x):
    """Σ_j p_j x_j in f64, summed in order, rounded once: fedweave's mix."""
    acc = numpy.zeros(x.shape[1])
    for w, row in zip(p, x.astype(numpy.float64)):
        if w != 0.0:
            acc += w * row
    return acc.astype(numpy.float32)


SHAPES = [(3, 4), (4,), (4, 2), (2,)]
D = sum(int(numpy.prod(s)) for s in SHAPES)


def random_setup(n, seed=0):
    rng = numpy.random.default_rng(seed)
    init = rng.normal(size=D).astype(numpy.float32)
    uploads = (init + rng.normal(scale=0.1, size=(n, D))).astype(numpy.float32)
    clients = [StubClient(f"client-{k}") for k in range(n)]
    return init, uploads, clients, StubManager(clients)


def test_the_strategies_are_flower_strategies():
    for cls in (flower.PFedGraph, flower.FedDWA, flower.FedAGHN):
        assert issubclass(cls, Strategy)
    assert isinstance(flower.GraphRule(lambda *a: None), Strategy)


def test_pfedgraph_strategy_infers_the_graph_fedweave_run_infers(tmp_path):
    """The round-1 uploads of a run (captured by a rule) through the Flower
    strategy give the W that `fedweave.run` with `pfedgraph` recorded, bit
    for bit; each client is then sent its own row's mixture."""
    captured = {}

    def capture(uploads, sizes, round, state, layers):
        captured.setdefault("uploads", uploads.copy())
        captured.setdefault("sizes", sizes.copy())
        captured["layers"] = [v.shape[1] for v in layers.values()]
        p = sizes / sizes.sum()
        return numpy.tile(p, (len(sizes), 1))

    fedweave.run(SMALL, tmp_path / "capture", graph_rule=capture, quiet=True, rounds=1)
    run = fedweave.run(SMALL, tmp_path / "pfedgraph", quiet=True, rounds=1)
    uploads, sizes = captured["uploads"], captured["sizes"]
    shapes = [(k,) for k in captured["layers"]]
    init = fedweave.initial_model(SMALL)
    n = SMALL["clients"]

    clients = [StubClient(str(k)) for k in range(n)]
    strategy = flower.PFedGraph(initial_parameters=ndarrays_to_parameters(split(init, shapes)), alpha=0.08 * n)
    manager = StubManager(clients)
    assert strategy.initialize_parameters(manager) is strategy.initial_parameters
    first = strategy.configure_fit(1, strategy.initial_parameters, manager)
    assert [c.cid for c, _ in first] == [str(k) for k in range(n)]
    assert all(numpy.array_equal(m, init) for m in sent_models(first).values())
    # Results arrive in any order: clients are matched by cid.
    results = [(clients[k], fit_res(split(uploads[k], shapes), int(sizes[k]))) for k in reversed(range(n))]
    params, _ = strategy.aggregate_fit(1, results, [])
    assert numpy.array_equal(strategy.graph, run.graphs[0])
    assert not numpy.allclose(strategy.graph, strategy.graph[0])

    sent = sent_models(strategy.configure_fit(2, params, manager))
    w = strategy.graph
    for k in range(n):
        want = w[k] @ uploads.astype(numpy.float64)
        assert numpy.allclose(sent[str(k)], want, rtol=0, atol=1e-6)
        assert numpy.array_equal(sent[str(k)], fedavg_mean(w[k], uploads)), k
    # The global model is FedAvg's mean of the uploads.
    p = sizes / sizes.sum()
    glob = numpy.concatenate([a.ravel() for a in parameters_to_ndarrays(params)])
    assert numpy.allclose(glob, p @ uploads.astype(numpy.float64), rtol=0, atol=1e-6)


def test_the_rule_adapter_with_fedavg_weights_gives_the_size_weighted_mean_bit_for_bit():
    init, uploads, clients, manager = random_setup(4)
    sizes = [10, 30, 20, 40]

    def fedavg(uploads, sizes, round, state):
        state["rounds"] = state.get("rounds", 0) + 1
        p = sizes / sizes.sum()
        return numpy.tile(p, (len(sizes), 1))

    strategy = flower.GraphRule(fedavg, initial_parameters=ndarrays_to_parameters(split(init, SHAPES)))
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    results = [(c, fit_res(split(uploads[k], SHAPES), sizes[k])) for k, c in enumerate(clients)]
    params, _ = strategy.aggregate_fit(1, results, [])
    p = numpy.array(sizes) / sum(sizes)
    want = fedavg_mean(p, uploads)
    assert not numpy.array_equal(want, uploads[0])
    for model in sent_models(strategy.configure_fit(2, params, manager)).values():
        assert numpy.array_equal(model, want)
    assert numpy.array_equal(strategy.graph, numpy.tile(p, (4, 1)))
    assert strategy.state == {"rounds": 1}


def test_each_client_receives_its_own_row_and_absent_clients_keep_theirs():
    init, uploads, clients, manager = random_setup(4, seed=1)
    ring = 0.7 * numpy.eye(4) + 0.3 * numpy.roll(numpy.eye(4), 1, axis=1)
    seen = []

    def rule(uploads, sizes, round, state):
        seen.append(uploads.shape)
        return ring if round == 1 else numpy.full((len(sizes), len(sizes)), 1.0 / len(sizes))

    strategy = flower.GraphRule(rule, initial_parameters=ndarrays_to_parameters(split(init, SHAPES)))
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    params, _ = strategy.aggregate_fit(1, [(c, fit_res(split(uploads[k], SHAPES), 5)) for k, c in enumerate(clients)], [])
    sent = sent_models(strategy.configure_fit(2, params, manager))
    for k in range(4):
        want = 0.7 * uploads[k].astype(numpy.float64) + 0.3 * uploads[(k + 1) % 4]
        assert numpy.allclose(sent[f"client-{k}"], want, rtol=0, atol=1e-6)
        assert numpy.array_equal(strategy.personalized(f"client-{k}")[1], split(sent[f"client-{k}"], SHAPES)[1])
    # Round 2: client-1 is absent; W is over the three others, client-1
    # keeps its mix and has an identity row.
    kept = sent["client-1"].copy()
    second = (uploads[[0, 2, 3]] + 0.5).astype(numpy.float32)
    results = [(clients[k], fit_res(split(second[j], SHAPES), 5)) for j, k in enumerate([0, 2, 3])]
    strategy.aggregate_fit(2, results, [])
    assert seen == [(4, D), (3, D)]
    assert numpy.array_equal(strategy.graph[1], [0.0, 1.0, 0.0, 0.0])
    assert numpy.allclose(strategy.graph[0], [1 / 3, 0, 1 / 3, 1 / 3])
    sent = sent_models(strategy.configure_fit(3, params, manager))
    assert numpy.array_equal(sent["client-1"], kept)
    assert numpy.allclose(sent["client-2"], second.astype(numpy.float64).mean(axis=0), rtol=0, atol=1e-6)


def test_bad_uploads_unknown_clients_and_bad_weights_are_clear_errors():
    init, uploads, clients, manager = random_setup(3, seed=2)
    strategy = flower.GraphRule(lambda u, s, r, st: numpy.eye(len(s)) * 0.5, initial_parameters=ndarrays_to_parameters(split(init, SHAPES)))
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    ok = [(c, fit_res(split(uploads[k], SHAPES), 5)) for k, c in enumerate(clients)]
    with pytest.raises(fedweave.FedweaveError, match=r"graph_rule, round 1: row 0 of W sums to 0.5"):
        strategy.aggregate_fit(1, ok, [])
    with pytest.raises(KeyError, match="unknown Flower client 'stranger'"):
        strategy.aggregate_fit(1, ok + [(StubClient("stranger"), ok[0][1])], [])
    wrong = split(uploads[0], SHAPES)[:-1]
    with pytest.raises(ValueError, match="client 'client-0' uploaded 3 tensors, expected 4"):
        strategy.aggregate_fit(1, [(clients[0], fit_res(wrong, 5))], [])
    nan = split(uploads[0], SHAPES)
    nan[2][1, 1] = numpy.nan
    with pytest.raises(ValueError, match="client 'client-0': element 19 is nan"):
        strategy.aggregate_fit(1, [(clients[0], fit_res(nan, 5))], [])
    shape = flower.GraphRule(lambda u, s, r, st: numpy.eye(2), initial_parameters=strategy.initial_parameters)
    shape.configure_fit(1, strategy.initial_parameters, manager)
    with pytest.raises(fedweave.FedweaveError, match=r"graph_rule, round 1: W has shape \(2, 2\)"):
        shape.aggregate_fit(1, ok, [])


def test_a_per_layer_rule_strategy_mixes_each_layer_by_its_own_w():
    init, uploads, clients, manager = random_setup(3, seed=3)
    n = 3
    ws = numpy.stack([numpy.eye(n), numpy.full((n, n), 1 / n)])

    strategy = flower.GraphRule(
        lambda u, s, r, st, layers: ws, tensors_per_layer=[2, 2], initial_parameters=ndarrays_to_parameters(split(init, SHAPES))
    )
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    params, _ = strategy.aggregate_fit(1, [(c, fit_res(split(uploads[k], SHAPES), 5)) for k, c in enumerate(clients)], [])
    sent = sent_models(strategy.configure_fit(2, params, manager))
    cut = 3 * 4 + 4
    for k in range(n):
        assert numpy.array_equal(sent[f"client-{k}"][:cut], uploads[k, :cut])
        assert numpy.allclose(sent[f"client-{k}"][cut:], uploads[:, cut:].astype(numpy.float64).mean(axis=0), atol=1e-6)
    assert numpy.array_equal(strategy.layer_graphs[0], ws)
    assert numpy.allclose(strategy.graph, ws.mean(axis=0))


def test_feddwa_strategy_weights_by_inverse_squared_distance_to_the_guidance():
    """Trained models at 0, 1 and 3 on a line; guidance models (0.5, 0),
    (1, 1), (3, 2): rows ∝ 1/‖ŵ*_i − ŵ_j‖² (fedweave's FedDWA unit case)."""
    models = numpy.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]], dtype=numpy.float32)
    guidance = numpy.array([[0.5, 0.0], [1.0, 1.0], [3.0, 2.0]], dtype=numpy.float32)
    clients = [StubClient(c) for c in "abc"]
    manager = StubManager(clients)
    strategy = flower.FedDWA(top_k=5, initial_parameters=ndarrays_to_parameters([numpy.zeros(2, numpy.float32)]))
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    results = [(c, fit_res([models[k], guidance[k]], 7)) for k, c in enumerate(clients)]
    params, _ = strategy.aggregate_fit(1, results, [])
    inv0 = numpy.array([4.0, 4.0, 0.16])
    inv1 = numpy.array([0.5, 1.0, 0.2])
    assert numpy.allclose(strategy.graph[0], inv0 / inv0.sum(), rtol=0, atol=1e-12)
    assert numpy.allclose(strategy.graph[1], inv1 / inv1.sum(), rtol=0, atol=1e-12)
    sent = sent_models(strategy.configure_fit(2, params, manager))
    assert numpy.allclose(sent["b"], strategy.graph[1] @ models, atol=1e-6)
    # Top-1: client b's nearest trained model is its own.
    one = flower.FedDWA(top_k=1, initial_parameters=strategy.initial_parameters)
    one.configure_fit(1, strategy.initial_parameters, manager)
    one.aggregate_fit(1, results, [])
    assert numpy.array_equal(one.graph, numpy.eye(3))
    with pytest.raises(ValueError, match="uploaded 1 tensors, expected 2 .*guidance"):
        one.aggregate_fit(1, [(clients[0], fit_res([models[0]], 7))], [])


def test_fedaghn_strategy_attends_per_layer_and_learns_its_self_weights():
    init, uploads, clients, manager = random_setup(4, seed=4)
    strategy = flower.FedAGHN(tensors_per_layer=[2, 2], initial_parameters=ndarrays_to_parameters(split(init, SHAPES)))
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    params, _ = strategy.aggregate_fit(1, [(c, fit_res(split(uploads[k], SHAPES), 5)) for k, c in enumerate(clients)], [])
    layers = strategy.layer_graphs[-1]
    assert layers.shape == (2, 4, 4)
    # Round 1 in numpy: Δ_j = θ_init − θ_j; α_ij = softmax_{j≠i}(q·cos)/(1+p), α_ii = p/(1+p).
    p, q = 0.03, 0.5
    deltas = (init - uploads).astype(numpy.float64)  # fedweave keeps Δ in float32
    cut = 3 * 4 + 4
    for layer, (a, b) in enumerate([(0, cut), (cut, D)]):
        x = deltas[:, a:b]
        cos = (x @ x.T) / numpy.outer(numpy.linalg.norm(x, axis=1), numpy.linalg.norm(x, axis=1))
        for i in range(4):
            e = numpy.exp(q * cos[i] - max(q * cos[i][j] for j in range(4) if j != i))
            e[i] = 0.0
            want = e / e.sum() / (1 + p)
            want[i] = p / (1 + p)
            assert numpy.allclose(layers[layer][i], want, rtol=0, atol=1e-12), (layer, i)
    assert numpy.allclose(strategy.graph, layers.mean(axis=0))
    sent = sent_models(strategy.configure_fit(2, params, manager))
    want0 = numpy.concatenate([layers[0][0] @ uploads[:, :cut].astype(numpy.float64), layers[1][0] @ uploads[:, cut:].astype(numpy.float64)])
    assert numpy.allclose(sent["client-0"], want0, atol=1e-6)
    # Round 2 without client-3: the participants' (p, q) take a step, the
    # absent client's wait; its row is the identity.
    assert numpy.all(strategy.server.p == p)
    second = [(clients[k], fit_res(split(sent[f"client-{k}"] + 0.05 * (k + 1), SHAPES), 5)) for k in range(3)]
    strategy.aggregate_fit(2, second, [])
    moved = strategy.server.p
    assert not numpy.allclose(moved[:3], p) and numpy.all(moved[3] == p)
    assert numpy.array_equal(strategy.graph[3], [0.0, 0.0, 0.0, 1.0])
    # A client first met later gets its own hypernetwork state.
    late = StubClient("late")
    manager.register(late)
    strategy.configure_fit(3, params, manager)
    assert strategy.server.clients == 5 and strategy.cids[-1] == "late"


def test_evaluation_uses_each_clients_own_model():
    init, uploads, clients, manager = random_setup(2, seed=5)
    strategy = flower.GraphRule(
        lambda u, s, r, st: numpy.eye(len(s)),
        initial_parameters=ndarrays_to_parameters(split(init, SHAPES)),
        evaluate_fn=lambda rnd, arrays, cfg: (float(sum(a.sum() for a in arrays)), {"round": rnd}),
    )
    strategy.initialize_parameters(manager)
    strategy.configure_fit(1, strategy.initial_parameters, manager)
    params, _ = strategy.aggregate_fit(1, [(c, fit_res(split(uploads[k], SHAPES), 1 + k)) for k, c in enumerate(clients)], [])
    ev = sent_models(strategy.configure_evaluate(1, params, manager))
    assert numpy.array_equal(ev["client-0"], uploads[0]) and numpy.array_equal(ev["client-1"], uploads[1])
    res = [
        (clients[0], EvaluateRes(status=Status(code=Code.OK, message=""), loss=1.0, num_examples=1, metrics={})),
        (clients[1], EvaluateRes(status=Status(code=Code.OK, message=""), loss=4.0, num_examples=3, metrics={})),
    ]
    loss, _ = strategy.aggregate_evaluate(1, res, [])
    assert loss == pytest.approx(13 / 4)
    value, metrics = strategy.evaluate(1, params)
    assert metrics == {"round": 1}
    assert value == pytest.approx(float((numpy.array([1, 2]) / 3) @ uploads.astype(numpy.float64).sum(axis=1)), rel=1e-5)
