"""Type stubs of the extension module (the Rust half of `fedweave`)."""

from typing import Any, Callable, List, Optional, Sequence, Tuple

__version__: str

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
) -> str:
    """Runs an experiment (TOML `text`, or the file `path`) with `overrides`; returns its directory.
    `rule` (from `fedweave._rule_adapter`) is the server's graph rule of a `graph-rule` run."""

def resume(dir: str, rounds: Optional[int] = None, quiet: bool = False, rule: Optional[Callable[..., Any]] = None) -> str:
    """Continues the run in `dir`; returns its directory."""

def sweep(grid: str, out: Optional[str] = None, jobs: int = 1, quiet: bool = False) -> str:
    """Runs a grid file; returns the sweep's directory."""

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
