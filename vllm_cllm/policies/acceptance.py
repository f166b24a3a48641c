"""How likely each draft token is to be accepted, learned online from what vLLM commits.

``jacobi``'s adaptive drafting has several candidate drafts per request and step (the suffix
lookup, the request's own n-gram continuation, the model's Jacobi tail). Each token of each
candidate falls into a cell — its source, its position in the draft (0..3, 4 and later
together), how many of the *other* candidates put the same token at the same position, how
strongly its source backs it (the suffix trees: how long a match of the context it
continues), and how the request's previous draft fared (nothing accepted, something
accepted, nothing drafted) —, and each cell holds how often a token in it was accepted
given that the tokens before it were. Agreement is a strong signal: a lookup token that the
Jacobi tail also predicts is accepted far more often than one it contradicts
(docs/decisions.md); so is a long match of the context behind a lookup.

The estimates are learned from every candidate (drafted or not) on the positions whose
outcome the committed tokens reveal, so a source that is not being drafted is still measured;
a request that drafts nothing has its candidates counted once the tokens it commits over the
next steps decide them (:class:`vllm_cllm.policies.adaptive.Shadow`), so that positions past
the first learn without drafting.
Counts start at a prior of 30 % and are halved when they grow large, so the estimates follow
the workload. Every tensor-parallel rank sees the same committed tokens in the same order and
so holds the same estimates.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import accumulate

import numpy as np

try:  # the grid arithmetic in C (_grid_native.c), built by setup.py where a compiler is
    from vllm_cllm.policies import _grid_native
except ImportError:  # not built: numpy, the same results to the bit
    _grid_native = None
#: Whether the C module is built.
NATIVE = _grid_native is not None

#: Draft positions with a cell of their own; later positions share the last cell.
POSITIONS = 5
#: Agreement counts with a cell of their own; more agreeing candidates share the last cell.
MAX_VOTES = 2
#: How strongly a source backs a token, where it says (:func:`vllm_cllm.sources.suffix_trees
#: .match_level`: how long a match of the context the lookup continues); 0 where it does not.
#: A token's vote cell is ``vote * LEVELS + level``.
LEVELS = 4
#: How the request's previous draft fared: a cell of its own each.
MISSED, HIT, UNDRAFTED = 0, 1, 2
#: The prior: this many observations at a 30 % acceptance. Low enough that a fresh engine
#: under load drafts nothing until its cells show better, high enough that at batch 1 it
#: drafts from the first step (its first verify steps fill the cells of position 0 whether
#: anything is drafted or not).
PRIOR_TRIALS, PRIOR_RATE = 4.0, 0.3
#: A cell's counts are halved once it has seen this many tokens, so that recent evidence
#: weighs more: the table follows a change of workload within a few hundred tokens per cell.
HALVE_AT = 512.0

#: Per candidate: its source's row, each token's position and vote cells, the outcome cell.
Cells = dict[str, tuple[int, np.ndarray, np.ndarray, int]]


class TokenAcceptance:
    """Per-cell acceptance counts for the candidate sources named at construction."""

    def __init__(self, sources: tuple[str, ...]) -> None:
        self.sources = sources
        self._row = {name: i for i, name in enumerate(sources)}
        shape = (len(sources), POSITIONS, (MAX_VOTES + 1) * LEVELS, 3)
        #: trials and acceptances side by side, so that a step adds to both at once
        #: (:meth:`observe_grid`); ``trials`` and ``accepted`` are its two halves
        self.counts = np.empty((2, *shape))
        self.trials, self.accepted = self.counts[0], self.counts[1]
        self.trials[...] = PRIOR_TRIALS
        self.accepted[...] = PRIOR_TRIALS * PRIOR_RATE
        #: per slots' source rows and grid width, each token's cell without its vote and
        #: outcome (:meth:`cell_index`)
        self._cell_base: dict[tuple[bytes, int], np.ndarray] = {}
        #: the C module that counts and values whole grids (None: numpy; tests switch it)
        self.native = _grid_native

    def cells(self, candidates: dict[str, np.ndarray], previous: int = UNDRAFTED) -> Cells:
        """Each non-empty candidate's (source row, position cells, vote cells, ``previous``:
        how the request's last draft fared, :data:`MISSED` / :data:`HIT` / :data:`UNDRAFTED`)."""
        names = [name for name, draft in candidates.items() if len(draft)]
        if not names:
            return {}
        width = max(len(candidates[name]) for name in names)
        grid = np.full((len(names), width), -1, dtype=np.int64)
        for r, name in enumerate(names):
            grid[r, :len(candidates[name])] = candidates[name]
        present = grid >= 0
        votes = ((grid[:, None, :] == grid[None, :, :]) & present[None, :, :]).sum(axis=1) - 1
        positions = np.minimum(np.arange(width), POSITIONS - 1)
        return {name: (self._row[name], positions[:len(candidates[name])],
                       np.minimum(votes[r, :len(candidates[name])], MAX_VOTES) * LEVELS,
                       previous)
                for r, name in enumerate(names)}

    def values(self, cells: Cells) -> dict[str, np.ndarray]:
        """Per candidate (its :meth:`cells`), the expected number of tokens each of its
        positions adds: the probability that it and every token before it are accepted
        (non-increasing)."""
        rates = self.accepted / self.trials
        return {name: np.cumprod(rates[row, pos, votes, previous])
                for name, (row, pos, votes, previous) in cells.items()}

    def observe(self, candidates: dict[str, np.ndarray], cells: Cells,
                committed: list[int]) -> None:
        """Count each candidate's tokens (``cells``: theirs) up to its first miss, as far as
        ``committed`` (what vLLM committed in the step that verified them) reveals."""
        known = np.asarray(committed, dtype=np.int64)
        for name, (row, pos, votes, previous) in cells.items():
            draft = candidates[name]
            n = min(len(draft), len(known))
            if n == 0:
                continue
            misses = np.flatnonzero(draft[:n] != known[:n])
            seen = int(misses[0]) + 1 if len(misses) else n
            np.add.at(self.trials, (row, pos[:seen], votes[:seen], previous), 1.0)
            hits = seen - 1 if len(misses) else seen
            np.add.at(self.accepted, (row, pos[:hits], votes[:hits], previous), 1.0)
        crowded = self.trials > HALVE_AT
        if crowded.any():
            self.trials[crowded] /= 2
            self.accepted[crowded] /= 2

    # The whole step at once: candidates as a padded [rows, sources, width] grid (-1 past a
    # candidate's length), the same cells and the same float operations as the per-request
    # methods above, so that the estimates, and so the drafts, are the same to the last bit.

    def grid_cells(self, rows: np.ndarray, grid: np.ndarray, previous: np.ndarray,
                   levels: np.ndarray | None = None) -> np.ndarray:
        """Each token's cell of a grid ([R, S, K], -1 where a candidate has no token; ``rows``
        [S] each slot's source row, ``previous`` [R] each row's outcome cell) as one flat
        index into the table (``trials.reshape(-1)``): its source, position, how many of
        the row's *other* candidates put the same token there (capped at :data:`MAX_VOTES`),
        its source's backing (``levels`` [R, S, K], none: 0) and the outcome, as
        :meth:`cells`. Where a candidate has no token the cell is
        meaningless (but one of the table's). A request's cells are worked out once, when it
        drafts: they value its candidates then and count them once vLLM has committed
        (:meth:`observe_grid`)."""
        num_previous = self.trials.shape[-1]
        # candidates with the same token at the same position, the candidate itself included
        same = (grid[:, :, None, :] == grid[:, None, :, :]).sum(axis=2)
        vote = np.minimum(np.arange(grid.shape[1] + 1) - 1, MAX_VOTES) * (LEVELS
                                                                        * num_previous)
        cells = self._base(rows, grid.shape[2]) + vote[same] + previous[:, None, None]
        if levels is not None:
            cells += levels * num_previous
        return cells

    def cell_index(self, rows: np.ndarray, votes: np.ndarray,
                   previous: np.ndarray) -> np.ndarray:
        """:meth:`grid_cells` from given vote cells ([R, S, K], ``vote * LEVELS + level``;
        ``previous`` [R] or [R, S])."""
        _, _, _, num_previous = self.trials.shape
        prev = previous[:, None, None] if previous.ndim == 1 else previous[:, :, None]
        return self._base(rows, votes.shape[-1]) + votes * num_previous + prev

    def _base(self, rows: np.ndarray, width: int) -> np.ndarray:
        """[S, width] each slot's and column's cell without its vote and outcome (cached per
        slots' source rows and width)."""
        key = (rows.tobytes(), width)
        base = self._cell_base.get(key)
        if base is None:
            _, positions, num_votes, num_previous = self.trials.shape
            position = np.minimum(np.arange(width), positions - 1)
            base = self._cell_base[key] = \
                (rows[:, None] * positions + position) * num_votes * num_previous
        return base

    def grid_values(self, cells: np.ndarray) -> np.ndarray:
        """:meth:`values` for every candidate of a grid whose tokens are in ``cells`` [R, S, K]
        (:meth:`grid_cells`); valid up to each candidate's length (a prefix of the cumulative
        product does not depend on what lies past it)."""
        rates = (self.accepted / self.trials).reshape(-1)
        return rates[cells].cumprod(axis=-1)

    def observe_grid(self, cells: np.ndarray, grid: np.ndarray, known: np.ndarray,
                     num_known: np.ndarray) -> None:
        """:meth:`observe` for R requests in order: ``grid`` [R, S, K] their candidates of the
        last step (-1 past each), ``cells`` [R, S, K] their tokens' cells (:meth:`grid_cells`),
        ``known`` [R, K] what vLLM committed (-2 past it; ``num_known`` [R] tokens of it, which
        may go on past K). Counts are added a request at a time as the per-request method
        does (each +1 in turn: :func:`_add_ones`), and crowded cells are halved after exactly
        the request after which the per-request method halves them."""
        num_rows, num_slots, width = grid.shape
        if not num_rows:
            return
        if self.native is not None:  # the per-request counting itself, in C
            self.native.count(self.counts, np.ascontiguousarray(cells),
                              np.ascontiguousarray(grid), np.ascontiguousarray(known),
                              np.ascontiguousarray(num_known), num_rows, num_slots, width,
                              HALVE_AT)
            return
        # A token is accepted where it and every token before it equal what was committed
        # (-1 past a candidate and -2 past the committed tokens never equal anything); one
        # trial more where the first miss lies within both.
        won_at = np.logical_and.accumulate(grid == known[:, None, :], axis=-1)
        hits = won_at.sum(axis=-1)
        lengths = (grid >= 0).sum(axis=-1)  # [R, S]; a candidate's tokens are a prefix
        seen = hits + (hits < np.minimum(lengths, num_known[:, None]))
        tried_at = np.arange(width) < seen[:, :, None]
        tried_cells, won_cells = cells[tried_at], cells[won_at]
        size = self.trials.size
        counted = np.bincount(np.concatenate([tried_cells, won_cells + size]),
                              minlength=2 * size)
        flat = self.counts.reshape(-1)  # trials, then accepted
        # Cells are independent (a cell is halved when its own trials pass HALVE_AT), so the
        # cells that stay below it all step long take the step's counts at once, and only the
        # few crowded ones are followed request by request (add_cell_counts).
        after = _add_ones(flat, counted)
        crowded = (after[:size] > HALVE_AT).nonzero()[0].tolist()
        before = [(float(flat[c]), float(flat[size + c])) for c in crowded]
        flat[:] = after
        if not crowded:
            return
        # each crowded cell's counts request by request: the request of every counted token
        tried_rows, won_rows = tried_at.nonzero()[0], won_at.nonzero()[0]
        for c, (trials, accepted) in zip(crowded, before, strict=True):
            mine = np.bincount(tried_rows[tried_cells == c], minlength=num_rows).tolist()
            wins = np.bincount(won_rows[won_cells == c], minlength=num_rows).tolist()
            flat[c], flat[size + c] = add_cell_counts(trials, accepted, mine, wins)


def add_ones_scalar(value: float, count: int) -> float:
    """:func:`_add_ones` of one value: ``value`` with 1.0 added ``count`` times in turn."""
    direct = value + count
    if direct - count == value:  # no rounding on the way, as _add_ones decides
        return direct
    return _add_ones_binades(value, float(count))


def add_cell_counts(trials: float, accepted: float, tried: list[int], won: list[int]
                    ) -> tuple[float, float]:
    """One cell's counts after requests that added ``tried[r]`` trials and ``won[r]``
    acceptances each, in order, the cell halved after each request that takes its trials
    past :data:`HALVE_AT` (as :meth:`TokenAcceptance.observe` does request by request).
    Between two halvings the requests' counts add up at once: the request that crosses is
    found by bisection on the running sums (where the sum is exact, see add_ones_scalar)."""
    tried_sum, won_sum = list(accumulate(tried)), list(accumulate(won))
    start, base, base_won, end = 0, 0, 0, len(tried)
    while start < end:
        left = tried_sum[-1] - base
        total = trials + left
        if total - left != trials:  # rounding on the way: one request at a time
            return _cell_counts_by_request(trials, accepted, tried[start:], won[start:])
        if total <= HALVE_AT:  # no further halving (adding ones never lowers the value)
            return (add_ones_scalar(trials, left),
                    add_ones_scalar(accepted, won_sum[-1] - base_won))
        t0, b0 = trials, base
        r = bisect_left(range(end), True, lo=start,
                        key=lambda j: t0 + (tried_sum[j] - b0) > HALVE_AT)
        crossed = trials + (tried_sum[r] - base)  # exact: no larger than total
        trials = crossed / 2
        accepted = add_ones_scalar(accepted, won_sum[r] - base_won) / 2
        base, base_won, start = tried_sum[r], won_sum[r], r + 1
    return trials, accepted


def _cell_counts_by_request(trials: float, accepted: float, tried: list[int],
                            won: list[int]) -> tuple[float, float]:
    """:func:`add_cell_counts` one request at a time."""
    for n, w in zip(tried, won, strict=True):
        if n:
            trials = add_ones_scalar(trials, n)
            accepted = add_ones_scalar(accepted, w)
            if trials > HALVE_AT:
                trials /= 2
                accepted /= 2
    return trials, accepted


def _add_ones(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``values`` with 1.0 added ``counts`` times, one addition at a time in floating point
    (what ``np.add.at`` does for repeated indices), without a loop per addition: additions
    that stay below the next power of two are exact, so each binade costs one addition of
    many ones and one rounded addition that crosses into the next (:func:`_add_ones_binades`,
    for the few values whose additions round: a prior such as 1.2 does)."""
    counts = np.asarray(counts, dtype=np.float64)
    direct = values + counts
    exact = direct - counts == values  # no rounding on the way (see the loop's argument)
    if exact.all():  # the usual case: counts far below the next power of two
        return direct
    out = np.where(exact, direct, values)
    todo = np.flatnonzero(~exact)
    flat, left = out.reshape(-1), counts.reshape(-1)
    flat[todo] = [_add_ones_binades(a, n)
                  for a, n in zip(flat[todo].tolist(), left[todo].tolist(), strict=True)]
    return out


def _add_ones_binades(value: float, count: float) -> float:
    """``value`` with 1.0 added ``count`` times in turn, a binade at a time: the ones that
    keep it below its next power of two add exactly at once, the one that crosses rounds."""
    while count > 0:
        _, exponent = math.frexp(value)
        below = float(math.ceil(math.ldexp(1.0, exponent) - value)) - 1  # stay below 2**e
        step = min(count, below)
        value, count = value + step, count - step
        if count > 0:
            value += 1.0
            count -= 1
    return value
