"""The step cost model measured on the machine the engine runs on.

The adaptive policy prices a verify step over ``N`` query tokens as
``max(floor, knee + N)`` one-query-token units (:mod:`vllm_cllm.policies.cost_model`). Here
its two parameters are fitted to the engine's own verify steps: each step's forward time
(from its start to its predictions on the host) against the tokens it scheduled, plus the
rest of a step (from the predictions to the next step's start: sampling, this proposer,
output, scheduling), which a draft token must pay back too but which does not grow with
the draft tokens. Seconds of the forward are ``t = c · max(floor, knee + N)``, i.e. a flat
part ``F = c·floor`` and a line ``a + b·N`` with ``knee = a / b``, ``floor = F / b``; the
median rest ``r`` adds ``r / c`` to both (where there is a floor); only ratios matter. The
rest is a median over the last steps: a step followed by a pause (the engine waiting for
requests, or taking turns with other engines) does not move it.

A fit is used only where the samples span a range of token counts and the fit explains
them; a fit whose slope is zero or negative, whose parameters are out of range, or whose
error is large is dropped with a log line, and the model keeps what it had (the platform's
defaults at first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vllm_cllm.policies.cost_model import CostModel

#: Steps kept for the fit, and how often (in steps) the fit is redone.
WINDOW, REFIT_EVERY = 1024, 64
#: A fit needs samples in at least this many distinct token-count bins, spanning this ratio.
MIN_BINS, MIN_SPAN = 3, 2.0
#: A fit is used only if its median relative error over the bins is below this.
MAX_ERROR = 0.25
#: The range a fitted knee or floor must fall in (query tokens).
MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class Fit:
    """One fit: knee and floor in query tokens, the seconds per query token ``c`` and the
    median relative error over the bins it was fitted to."""

    knee_tokens: float
    floor_tokens: float
    seconds_per_token: float
    error: float
    bins: int
    #: the median rest of a step (seconds), in ``knee_tokens`` and ``floor_tokens``
    rest_seconds: float = 0.0

    def with_rest(self, seconds: float) -> Fit:
        """The fit with the rest of a step, ``seconds``, added to its cost."""
        extra = max(0.0, seconds) / self.seconds_per_token
        return Fit(self.knee_tokens + extra, self.floor_tokens + extra if self.floor_tokens
                   else 0.0, self.seconds_per_token, self.error, self.bins, max(0.0, seconds))


def fit_step_cost(tokens: np.ndarray, seconds: np.ndarray) -> Fit | str:
    """The hinge ``max(F, a + b·N)`` through the per-bin medians of the samples, or why none
    can be trusted (too few bins, a zero or negative slope, parameters out of range, a large
    error)."""
    tokens, seconds = np.asarray(tokens, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    keep = np.isfinite(seconds) & (seconds > 0) & (tokens > 0)
    tokens, seconds = tokens[keep], seconds[keep]
    if not len(tokens):
        return "no timed steps"
    edges = np.unique(np.round(np.log2(tokens) * 4))  # quarter-octave bins
    bins = np.round(np.log2(tokens) * 4)
    n = np.array([np.median(tokens[bins == e]) for e in edges])
    t = np.array([np.median(seconds[bins == e]) for e in edges])
    if len(n) < MIN_BINS or n.max() < MIN_SPAN * n.min():
        return f"{len(n)} token-count bins spanning {n.min():.0f}-{n.max():.0f} tokens"
    best: tuple[float, float, float, float] | None = None  # (error, F, a, b)
    for flat in range(0, len(n) - 1):  # the first ``flat`` bins on the floor, the rest on the line
        line_n, line_t = n[flat:], t[flat:]
        b, a = np.polyfit(line_n, line_t, 1)
        floor = float(np.median(t[:flat])) if flat else 0.0
        model = np.maximum(floor, a + b * n)
        error = float(np.median(np.abs(model - t) / t))
        if best is None or error < best[0]:
            best = (error, floor, float(a), float(b))
    error, floor, a, b = best  # type: ignore[misc]
    if error > MAX_ERROR:
        return f"a median error of {error:.0%}"
    if not b > 0:
        return f"a slope of {b:.3g} s per token"
    knee, floor_tokens = a / b, floor / b
    if floor_tokens <= (knee + n.min()) * 1.05:
        floor_tokens = 0.0  # a floor below every observed step's cost says nothing
    if not (1 <= knee <= MAX_TOKENS and 0 <= floor_tokens <= MAX_TOKENS):
        return f"knee {knee:.3g}, floor {floor_tokens:.3g} tokens"
    return Fit(knee, floor_tokens, b, error, len(n))


class CostMeasurement:
    """Refines ``cost`` from timed verify steps (:meth:`add`), every :data:`REFIT_EVERY`
    steps over the last :data:`WINDOW`; ``log`` is told each fit taken or dropped."""

    def __init__(self, cost: CostModel, log: Callable[[str], None] | None = None,
                 window: int = WINDOW, refit_every: int = REFIT_EVERY) -> None:
        self.cost = cost
        self.prior = (cost.knee_tokens, cost.floor_tokens)
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.rests: deque[float] = deque(maxlen=window)
        self.refit_every = refit_every
        self.log = log or (lambda message: None)
        self.fits: list[Fit] = []
        self._since_fit = 0
        self._dropped = 0
        self._last_reason = ""

    def add(self, query_tokens: int, seconds: float, rest: float | None = None) -> None:
        """One verify step over ``query_tokens`` took ``seconds`` to its predictions and
        ``rest`` more to the next step's start (None: not known)."""
        if rest is not None and np.isfinite(rest) and rest >= 0:
            self.rests.append(float(rest))
        if query_tokens <= 0 or not np.isfinite(seconds) or seconds <= 0:
            if not self._dropped:
                self.log(f"dropped a verify step timed at {seconds!r} s over {query_tokens} "
                         f"tokens; keeping knee {self.cost.knee_tokens:.0f}, floor "
                         f"{self.cost.floor_tokens:.0f}")
            self._dropped += 1
            return
        self.samples.append((int(query_tokens), float(seconds)))
        self._since_fit += 1
        if self._since_fit >= self.refit_every:
            self._since_fit = 0
            self.refit()

    def refit(self) -> Fit | None:
        tokens = np.array([n for n, _ in self.samples])
        seconds = np.array([s for _, s in self.samples])
        found = fit_step_cost(tokens, seconds)
        if isinstance(found, str):
            if found != self._last_reason:
                self._last_reason = found
                self.log(f"no step-cost fit from {len(tokens)} steps ({found}); keeping knee "
                         f"{self.cost.knee_tokens:.0f}, floor {self.cost.floor_tokens:.0f}")
            return None
        if self.rests:
            found = found.with_rest(float(np.median(self.rests)))
        self.fits.append(found)
        self.cost.knee_tokens, self.cost.floor_tokens = found.knee_tokens, found.floor_tokens
        self.log(f"step cost measured over {len(tokens)} steps: knee {found.knee_tokens:.0f}, "
                 f"floor {found.floor_tokens:.0f} query tokens, "
                 f"{found.seconds_per_token * 1e6:.1f} us per query token, "
                 f"{found.rest_seconds * 1e3:.2f} ms per step besides the forward "
                 f"(median error {found.error:.0%} over {found.bins} bins)")
        return found
