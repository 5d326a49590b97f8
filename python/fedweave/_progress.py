"""The progress bar of :func:`fedweave.run` and :func:`fedweave.resume`.

``tqdm`` draws it when it is installed (it is not a dependency); otherwise
a bar of our own is redrawn in place on ``sys.stderr`` with ``\\r``, or
written one line per round where stderr is not a terminal (a log file, CI)
so that the log stays readable.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional, TextIO


def _clock(seconds: float) -> str:
    """``seconds`` as ``m:ss`` or ``h:mm:ss``."""
    seconds = int(round(max(seconds, 0.0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _interactive(stream: TextIO) -> bool:
    """Whether ``stream`` redraws a line on ``\\r`` (a terminal or a notebook)."""
    try:
        if stream.isatty():
            return True
    except (AttributeError, ValueError):
        return False
    return "ipykernel" in sys.modules


class Progress:
    """Rounds done out of ``total``, the last mean validation accuracy (or
    MAE), elapsed time and ETA; ``update`` is called once per finished round
    with the round's number. ``start`` is the last round already done (a
    resumed run)."""

    WIDTH = 24

    def __init__(
        self,
        total: int,
        start: int = 0,
        stream: Optional[TextIO] = None,
        use_tqdm: Optional[bool] = None,
        clock=time.monotonic,
    ):
        self.total = max(int(total), 0)
        self.start = int(start)
        self.done = self.start
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.began = clock()
        self.interactive = _interactive(self.stream)
        self.bar: Any = None
        if use_tqdm is None:
            use_tqdm = stream is None
        if use_tqdm:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=self.total, initial=self.start, unit="round", desc="fedweave", file=self.stream)

    def eta(self) -> Optional[float]:
        """Seconds left at the mean pace of the rounds run so far (None
        before the first)."""
        ran = self.done - self.start
        if ran <= 0:
            return None
        return (self.clock() - self.began) / ran * max(self.total - self.done, 0)

    def line(self, metric: str) -> str:
        """The bar as text, e.g. ``round 3/10 [#######.........] 30% · val
        acc 0.8123 · 0:12 elapsed · ETA 0:28``."""
        eta = self.eta() if self.total else None
        if self.total:
            frac = min(self.done / self.total, 1.0)
            filled = int(round(self.WIDTH * frac))
            head = f"round {self.done}/{self.total} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {100 * frac:3.0f}%"
        else:
            head = f"round {self.done}"
        parts = [
            head,
            metric,
            f"{_clock(self.clock() - self.began)} elapsed",
            "" if not self.total else "ETA " + ("?" if eta is None else _clock(eta)),
        ]
        return " · ".join(p for p in parts if p)

    def update(self, round: int, val_acc: Optional[float], val_mae: Optional[float], seconds: float) -> None:
        """One finished round (the callback the extension calls)."""
        self.done = int(round)
        if val_acc is not None:
            metric = f"val acc {val_acc:.4f}"
        elif val_mae is not None:
            metric = f"val MAE {val_mae:.4f}"
        else:
            metric = ""
        if self.bar is not None:
            self.bar.n = self.done
            if metric:
                self.bar.set_postfix_str(metric, refresh=False)
            self.bar.refresh()
            return
        if self.interactive:
            self.stream.write("\r" + self.line(metric) + "\x1b[K")
        else:
            self.stream.write(self.line(metric) + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends the bar (a newline after an in-place bar)."""
        if self.bar is not None:
            self.bar.close()
        elif self.interactive and self.done > self.start:
            self.stream.write("\n")
            self.stream.flush()
