"""Type stubs of the extension module (the Rust half of `fedweave`)."""

from typing import Any, Callable, List, Optional, Sequence, Tuple

__version__: str

OnRound = Callable[[int, Optional[float], Optional[float], float], Any]
LayerGroups = Sequence[Tuple[str, int, int]]

class FedweaveError(RuntimeError):
    """A fedweave error; the message is the command line's."""

def run(
    text: str,
    path: Optional[str] = None,
    out: Optional[str] = None,
    overrides: Sequence[str] = ...,
    overwrite: bool = False,
    quiet: bool = False,
    rule: Optional[Callable[..., Any]] = None,
    on_round: Optional[OnRound] = None,
) -> str:
    """Runs an experiment (TOML `text`, or the file `path`) with `overrides`; returns its directory.
    `rule` (from `fedweave._rule_adapter`) is the server's graph rule of a `graph-rule` run;
    `on_round(round, val_acc, val_mae, seconds)` is called after each round (else one line per
    round on stderr unless `quiet`)."""

def resume(
    dir: str,
    rounds: Optional[int] = None,
    quiet: bool = False,
    rule: Optional[Callable[..., Any]] = None,
    on_round: Optional[OnRound] = None,
) -> str:
    """Continues the run in `dir`; returns its directory."""

def sweep(
    grid: str, out: Optional[str] = None, jobs: int = 1, quiet: bool = False, rule: Optional[Callable[..., Any]] = None
) -> str:
    """Runs a grid file (``rule``: the graph rule of its ``graph-rule`` runs); returns the sweep's directory."""

def models(dir: str, which: str = "best") -> List[Tuple[int, List[Tuple[str, List[int], str, bytes]]]]:
    """Each client's kept model: (client, [(name, shape, dtype, little-endian bytes)])."""

def clients(dir: str) -> List[Tuple[bool, int, int, int, List[int]]]:
    """Per client: (benign, train size, validation size, test size, training label counts)."""

def algorithms() -> List[Tuple[str, str, str]]:
    """(name, summary, reference) of every algorithm."""

def is_run_dir(dir: str) -> bool:
    """Whether `dir` holds a run."""

def initial_model(text: str, path: Optional[str] = None, overrides: Sequence[str] = ...) -> bytes:
    """The clients' common initial model (little-endian float32, layout order)."""

def pfedgraph_step(
    uploads: bytes,
    m: int,
    d: int,
    participants: Sequence[int],
    n: int,
    sizes: Sequence[int],
    init: bytes,
    alpha: float,
    threshold: float,
) -> Tuple[bytes, bytes]:
    """pFedGraph's server step on `m` × `d` float32 uploads of the ascending `participants` among
    `n` clients: (W, `n` × `n` float64 bytes; mixed models, `m` × `d` float32 bytes)."""

def feddwa_step(
    models: bytes, guidance: bytes, m: int, d: int, participants: Sequence[int], n: int, top_k: int
) -> Tuple[bytes, bytes]:
    """FedDWA's server step: (W, `n` × `n` float64 bytes; mixed models, `m` × `d` float32 bytes)."""

def rule_mix(w: bytes, shape: Sequence[int], uploads: bytes, d: int, layers: LayerGroups) -> bytes:
    """Checks W (`[m, m]` or `[L, m, m]` float64 bytes) as `graph-rule` does and mixes the uploads
    by it (per layer group for `[L, m, m]`): `m` × `d` float32 bytes."""

class FedAghnServer:
    """FedAGHN's server state (per client and layer group p and q, the clients' models)."""

    def __init__(
        self,
        init: bytes,
        d: int,
        groups: LayerGroups,
        p_init: float = 0.03,
        q_init: float = 0.5,
        hn_lr: float = 0.005,
        hn_sign: str = "fedaghn",
    ) -> None: ...
    def add_clients(self, more: int) -> None:
        """Adds `more` clients in their initial state."""
    @property
    def clients(self) -> int:
        """Number of clients."""
    @property
    def p(self) -> List[List[float]]:
        """Self weights, per client then layer group."""
    @property
    def q(self) -> List[List[float]]:
        """Temperatures, per client then layer group."""
    def step(self, uploads: bytes, m: int, participants: Sequence[int]) -> Tuple[bytes, bytes, bytes]:
        """One round: (per-layer W `L` × `n` × `n`, their mean `n` × `n`, float64 bytes;
        personalised models `m` × `d` float32 bytes)."""

def serve(
    text: str,
    listen: str,
    path: Optional[str] = None,
    out: Optional[str] = None,
    overrides: Sequence[str] = ...,
    resume: bool = False,
    tokens: Optional[str] = None,
    quiet: bool = False,
    rule: Optional[Callable[..., Any]] = None,
    on_round: Optional[OnRound] = None,
) -> str:
    """Serves a networked run (as `fedweave serve`) in this process with `rule` as its graph rule;
    returns its directory."""
