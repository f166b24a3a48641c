"""The step cost model measured on the machine the engine runs on.

The adaptive policy prices a verify step of ``B`` requests over ``N`` query tokens as
``p·B + max(floor, knee + N)`` one-query-token units (:mod:`vllm_cllm.policies.cost_model`).
Here its parameters are fitted to the engine's own verify steps: each step's forward time
(from its start to its predictions on the host) against the tokens it scheduled and the
requests it ran, plus the rest of a step (from the predictions to the next step's start:
sampling, this proposer, output, scheduling), which a draft token must pay back too but which
does not grow with the draft tokens. Seconds of the forward are
``t = c·B + max(F, a + b·N)``: a flat part ``F`` (a device bound by reading the weights), a
line ``a + b·N`` and a part ``c`` per request on top of its token (its own context to attend
to, its own sampling); ``knee = a / b``, ``floor = F / b``, ``p = c / b``. Where every step
ran the same number of requests, ``c`` cannot be told from ``a`` and is 0. The rest is a line
in the requests too, through the per-batch-size medians of the last steps: a step followed
by a pause (the engine waiting for requests, or taking turns with other engines) does not
move it. Only ratios matter.

The curve is only piecewise a line (a step of 1 request and one of 16 sit on different
parts of it), so a fit is first tried on the steps whose batch size is near the current one
(within a factor :data:`REGIME`): when the batch size moves out of that range, early fits
follow as they do at the engine's start, and where the nearby steps do not make a fit, all
of the window's steps are fitted. A fit is used only where the samples span a range of token
counts and the fit explains them; a fit whose slope is zero or negative, whose parameters are
out of range, or whose error is large is dropped with a log line, and the model keeps what it
had (the platform's defaults at first). A fit whose slope is far from the one in use (a few
bins of steps that lie almost flat can fit a line of a tiny slope, and a tiny slope makes
every draft token look free) is taken only once the next fit confirms it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vllm_cllm.policies.cost_model import CostModel

#: Steps kept for the fit, and how often (in steps) the fit is redone.
WINDOW, REFIT_EVERY = 1024, 64
#: The timed steps after which a first fit is tried before the first regular one, so that an
#: engine started from wrong parameters leaves them early; one that finds no fit yet is quiet.
#: Counted from the engine's start and again from each change of the batch size's range.
FIRST_FITS = (16, 32)
#: Steps whose batch size is within this factor of the current range's are fitted on their
#: own first; a step outside it starts a new range.
REGIME = 2.0
#: The token-count bins such a fit needs: more than a fit of all steps, since it replaces a
#: broader one (three bins fit a line and a part per request exactly, whatever they are).
REGIME_MIN_BINS = 5
#: A fit needs samples in at least this many distinct token-count bins, spanning this ratio.
MIN_BINS, MIN_SPAN = 3, 2.0
#: A bin (token count and request count) is fitted only with at least this many steps in it.
MIN_BIN_STEPS = 3
#: A fit is used only if its median relative error over the bins is below this.
MAX_ERROR = 0.25
#: The range a fitted knee, floor or per-request part must fall in (query tokens).
MAX_TOKENS = 1 << 20
#: A fit whose seconds per query token differ from the fit in use by more than this factor
#: is taken only when the next fit's are within :data:`SLOPE_AGREE` of its own.
SLOPE_JUMP, SLOPE_AGREE = 3.0, 1.5


@dataclass(frozen=True)
class Fit:
    """One fit: knee, floor and the part per request in query tokens, the seconds per query
    token ``b`` and the median relative error over the bins it was fitted to."""

    knee_tokens: float
    floor_tokens: float
    seconds_per_token: float
    error: float
    bins: int
    per_request_tokens: float = 0.0
    #: the rest of a step (seconds): its fixed part and its part per request, in the above
    rest_seconds: float = 0.0
    rest_per_request_seconds: float = 0.0

    def with_rest(self, seconds: float, per_request: float = 0.0) -> Fit:
        """The fit with the rest of a step, ``seconds`` plus ``per_request`` a request,
        added to its cost."""
        seconds, per_request = max(0.0, seconds), max(0.0, per_request)
        extra = seconds / self.seconds_per_token
        return Fit(self.knee_tokens + extra,
                   self.floor_tokens + extra if self.floor_tokens else 0.0,
                   self.seconds_per_token, self.error, self.bins,
                   self.per_request_tokens + per_request / self.seconds_per_token,
                   seconds, per_request)


def _binned(columns: list[np.ndarray], values: np.ndarray
            ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    """Per bin of the ``columns`` (quarter octaves of each) with at least
    :data:`MIN_BIN_STEPS` samples: its key (one per column), the columns' and ``values``'
    medians and the number of samples."""
    keys = np.stack([np.round(np.log2(c) * 4) for c in columns], axis=1)
    bins, which, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    which = which.reshape(-1)
    full = (counts >= MIN_BIN_STEPS).nonzero()[0]
    medians = [np.array([np.median(c[which == k]) for k in full]) for c in columns]
    return (bins[full], medians, np.array([np.median(values[which == k]) for k in full]),
            counts[full])


def _least_squares(columns: dict[str, np.ndarray], t: np.ndarray, weight: np.ndarray
                   ) -> dict[str, float] | None:
    """The weighted least-squares coefficients of ``t`` on the named columns, None where the
    columns cannot be told apart (a rank below their number)."""
    design = np.stack(list(columns.values()), axis=1)
    solved, _, rank, _ = np.linalg.lstsq(design * weight[:, None], t * weight, rcond=None)
    if rank < design.shape[1]:
        return None
    return dict(zip(columns, solved.tolist(), strict=True))


def fit_step_cost(tokens: np.ndarray, seconds: np.ndarray,
                  requests: np.ndarray | None = None, min_bins: int = MIN_BINS) -> Fit | str:
    """``c·B + max(F, a + b·N)`` through the per-bin medians of the samples (``requests``:
    each step's ``B``, None: all alike), or why none can be trusted (fewer than ``min_bins``
    token-count bins, a zero or negative slope, parameters out of range, a large error)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    requests = np.ones_like(tokens) if requests is None else np.asarray(requests, np.float64)
    keep = np.isfinite(seconds) & (seconds > 0) & (tokens > 0) & (requests > 0)
    tokens, seconds, requests = tokens[keep], seconds[keep], requests[keep]
    if not len(tokens):
        return "no timed steps"
    keys, (n, r), t, counts = _binned([tokens, requests], seconds)
    if len(np.unique(keys[:, 0])) < min_bins or n.max() < MIN_SPAN * n.min():
        return (f"{len(n)} token-count bins spanning {n.min():.0f}-{n.max():.0f} tokens"
                if len(n) else "no token-count bin with enough steps")
    order = n.argsort(kind="stable")
    n, r, t, weight = n[order], r[order], t[order], np.sqrt(counts[order])
    best: tuple[float, float, float, float, float] | None = None  # (error, F, a, b, c)
    for flat in range(0, len(n) - 1):  # the first ``flat`` bins on the floor, the rest on the line
        on_floor = np.arange(len(n)) < flat
        # t = F + c·r on the floor, a + b·n + c·r on the line; c dropped where it cannot be
        # told from the rest or comes out negative (a request costs at least its token)
        columns = {"F": on_floor * 1.0, "a": ~on_floor * 1.0, "b": np.where(on_floor, 0.0, n),
                   "c": r}
        if not flat:
            del columns["F"]
        fitted = _least_squares(columns, t, weight)
        if fitted is None or fitted["c"] < 0:
            del columns["c"]
            fitted = _least_squares(columns, t, weight)
            if fitted is None:
                continue
        floor, a, b, c = (fitted.get(name, 0.0) for name in "Fabc")
        model = c * r + np.maximum(floor, a + b * n)
        error = float(np.median(np.abs(model - t) / t))
        if best is None or error < best[0]:
            best = (error, floor, a, b, c)
    if best is None:
        return "no fit of the bins"
    error, floor, a, b, c = best
    if error > MAX_ERROR:
        return f"a median error of {error:.0%}"
    if not b > 0:
        return f"a slope of {b:.3g} s per token"
    knee, floor_tokens, per_request = a / b, floor / b, c / b
    if floor_tokens <= (knee + n.min()) * 1.05:
        floor_tokens = 0.0  # a floor below every observed step's cost says nothing
    if not (1 <= knee <= MAX_TOKENS and 0 <= floor_tokens <= MAX_TOKENS
            and per_request <= MAX_TOKENS):
        return f"knee {knee:.3g}, floor {floor_tokens:.3g} tokens"
    return Fit(knee, floor_tokens, b, error, len(n), per_request)


def _within(value: float, other: float, factor: float) -> bool:
    """Whether ``value`` is within ``factor`` of ``other`` (both positive), either way."""
    return other / factor <= value <= other * factor


def fit_rest(requests: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """The rest of a step as ``fixed + per_request·B`` (seconds), through the per-batch-size
    medians: one batch size gives its median, a line that falls with the batch the medians'
    mean, and no part per request."""
    seconds = np.asarray(seconds, dtype=np.float64)
    _, (r,), t, counts = _binned([np.asarray(requests, dtype=np.float64)], seconds)
    if len(r) < 2:
        return float(np.median(seconds)), 0.0
    per_request, fixed = np.polyfit(r, t, 1, w=np.sqrt(counts))
    if per_request < 0:
        return float(np.average(t, weights=counts)), 0.0
    return max(0.0, float(fixed)), float(per_request)


class CostMeasurement:
    """Refines ``cost`` from timed verify steps (:meth:`add`), every :data:`REFIT_EVERY`
    steps over the last :data:`WINDOW` (tried first after :data:`FIRST_FITS` steps); ``log``
    is told each fit taken or dropped."""

    def __init__(self, cost: CostModel, log: Callable[[str], None] | None = None,
                 window: int = WINDOW, refit_every: int = REFIT_EVERY) -> None:
        self.cost = cost
        self.prior = (cost.knee_tokens, cost.floor_tokens)
        #: (query tokens, seconds, requests) of each timed step's forward
        self.samples: deque[tuple[int, float, int]] = deque(maxlen=window)
        #: (requests, seconds) of each step's rest
        self.rests: deque[tuple[int, float]] = deque(maxlen=window)
        self.refit_every = refit_every
        self.log = log or (lambda message: None)
        self.fits: list[Fit] = []
        self._since_fit = 0
        self._early = {n for n in FIRST_FITS if n < refit_every}
        #: the batch size the current range is centred on (0: none yet), its timed steps
        self._regime = 0
        self._in_regime = 0
        self._dropped = 0
        self._last_reason = ""
        #: the seconds per query token of a fit far from the one in use, not yet confirmed
        self._unconfirmed: float | None = None

    def add(self, query_tokens: int, seconds: float, rest: float | None = None,
            requests: int = 1) -> None:
        """One verify step of ``requests`` requests over ``query_tokens`` took ``seconds``
        to its predictions and ``rest`` more to the next step's start (None: not known)."""
        if rest is not None and np.isfinite(rest) and rest >= 0:
            self.rests.append((int(requests), float(rest)))
        if query_tokens <= 0 or not np.isfinite(seconds) or seconds <= 0:
            if not self._dropped:
                self.log(f"dropped a verify step timed at {seconds!r} s over {query_tokens} "
                         f"tokens; keeping knee {self.cost.knee_tokens:.0f}, floor "
                         f"{self.cost.floor_tokens:.0f}")
            self._dropped += 1
            return
        self.samples.append((int(query_tokens), float(seconds), int(requests)))
        if not self._near(requests):
            self._regime, self._in_regime = int(requests), 0
        self._since_fit += 1
        self._in_regime += 1
        if self._since_fit >= self.refit_every:
            self._since_fit = 0
            self.refit()
        elif self._in_regime in self._early:  # (the regular fits keep their own count)
            self.refit(quiet=True)

    def _near(self, requests: int | np.ndarray) -> bool | np.ndarray:
        """Whether the batch size (each, of an array) is in the current range
        (:data:`REGIME`)."""
        return (requests * REGIME >= self._regime) & (requests <= self._regime * REGIME)

    def _waits(self, slope: float, fitted: int) -> bool:
        """Whether a fit of ``slope`` seconds per query token waits for confirmation (with a
        log line): it is more than :data:`SLOPE_JUMP` from the fit in use, and the last such
        fit (if any) was not within :data:`SLOPE_AGREE` of it."""
        unconfirmed, self._unconfirmed = self._unconfirmed, None
        if not self.fits:
            return False
        in_use = self.fits[-1].seconds_per_token
        if _within(slope, in_use, SLOPE_JUMP) or (
                unconfirmed is not None and _within(slope, unconfirmed, SLOPE_AGREE)):
            return False
        self._unconfirmed = slope
        self.log(f"a fit over {fitted} steps of {slope * 1e6:.1f} us per query token, "
                 f"{slope / in_use:.2g}x the {in_use * 1e6:.1f} in use, waits for the next fit "
                 f"to confirm it; keeping knee {self.cost.knee_tokens:.0f}, floor "
                 f"{self.cost.floor_tokens:.0f}")
        return True

    def refit(self, quiet: bool = False) -> Fit | None:
        """Fit the samples; a fit is taken and logged, none is logged with why (unless
        ``quiet``: an early try, before the steps could span the token counts)."""
        tokens, seconds, requests = np.array(self.samples, dtype=np.float64).T
        near = self._near(requests)  # (the last step's range: never empty)
        # the nearby steps' own fit where some steps lie outside their range, else all steps'
        nearby = None if near.all() else fit_step_cost(
            tokens[near], seconds[near], requests[near], REGIME_MIN_BINS)
        if isinstance(nearby, Fit):
            found, fitted = nearby, int(near.sum())
        else:
            found, fitted = fit_step_cost(tokens, seconds, requests), len(tokens)
        if isinstance(found, str):
            if not quiet and found != self._last_reason:
                self._last_reason = found
                self.log(f"no step-cost fit from {len(tokens)} steps ({found}); keeping knee "
                         f"{self.cost.knee_tokens:.0f}, floor {self.cost.floor_tokens:.0f}")
            return None
        if self._waits(found.seconds_per_token, fitted):
            return None
        if self.rests:
            rests = np.array(self.rests, dtype=np.float64)
            found = found.with_rest(*fit_rest(rests[:, 0], rests[:, 1]))
        self.fits.append(found)
        self.cost.knee_tokens, self.cost.floor_tokens, self.cost.per_request_tokens = \
            found.knee_tokens, found.floor_tokens, found.per_request_tokens
        per_request = (f"; each request adds {found.per_request_tokens:.2f} query tokens "
                       f"({found.rest_per_request_seconds * 1e3:.2f} ms of them besides the "
                       f"forward)" if found.per_request_tokens else "")
        self.log(f"step cost measured over {fitted} steps: knee {found.knee_tokens:.0f}, "
                 f"floor {found.floor_tokens:.0f} query tokens, "
                 f"{found.seconds_per_token * 1e6:.1f} us per query token, "
                 f"{found.rest_seconds * 1e3:.2f} ms per step besides the forward{per_request} "
                 f"(median error {found.error:.0%} over {found.bins} bins)")
        return found
