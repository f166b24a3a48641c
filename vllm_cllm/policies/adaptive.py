"""Adaptive drafting: each request drafts the candidate whose tokens promise the most tokens
per step cost, and the batch's drafts are sized together.

Every token of every candidate is valued by how often tokens like it were accepted
(:mod:`vllm_cllm.policies.acceptance`); per request the candidate whose best prefix promises
the most tokens per step cost is chosen (:func:`best_candidate`), then every chosen
candidate is sized against the rest of the batch by the cost model
(:func:`vllm_cllm.policies.cost_model.draft_lengths`). A request without a Jacobi tail (its
last draft was accepted whole, or nothing was drafted) is offered a restart block, valued as
the tail it buys. The cost model weighs what drafts would be accepted against what they
cost at every batch size. In a batch that drains (:mod:`vllm_cllm.core.flow`) only the
requests that end last draft where drafts cost time, priced as a batch of only them
(:func:`drain_rooms`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from vllm_cllm.core.drafter import DraftSource
from vllm_cllm.core.grid import candidate_grid
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep, every_row_in_order
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.policies.acceptance import (
    HALVE_AT,
    HIT,
    LEVELS,
    MAX_VOTES,
    MISSED,
    NATIVE,
    UNDRAFTED,
    TokenAcceptance,
    add_ones_scalar,
)
from vllm_cllm.policies.candidate_log import CandidateLog
from vllm_cllm.policies.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    CostModel,
    batch_costs,
    beats_plain,
    draft_costs,
    draft_lengths_grid,
    step_cost,
)
from vllm_cllm.policies.fixed_order import gather

#: Steps of at most this many adaptive requests are valued in plain Python
#: (:meth:`Adaptive._draft_small`): below it the grid's fixed cost outweighs what the grid
#: saves per request; some forty numpy calls in numpy, one call of the C module where it is
#: built (there the grid costs what Python does at one request and less from two).
SMALL_STEP = 1 if NATIVE else 4


def drain_rooms(step: VerifyStep, knee_tokens: float, floor_tokens: float
                ) -> tuple[np.ndarray, int]:
    """[B] the draft tokens each request of ``step`` may take, and the batch size its drafts
    are priced at. Where the batch refills: every room, priced at the step's batch size.
    Where it drains (``step.remaining`` set) and a draft token costs time (the step without
    drafts already at or above the floor): none for a request that will end more than a
    draft's width before the last one (a token it gains shortens no step of the batch, and
    buys back only its own query token, which a draft token costs); the others, at most what
    they may still commit, priced as a batch of only them. Their tokens decide when the
    batch ends: one they gain saves a share of a step at its end, where only they run, not
    the share of this step that a token of a refilling batch of ``B`` saves."""
    remaining = step.remaining
    if remaining is None or len(step) < 2 or knee_tokens + len(step) * (
            1 + SPEC_STEP_OVERHEAD_PER_REQUEST) < floor_tokens:
        return step.rooms, len(step)
    slack = int(step.rooms.max(initial=0))
    last = remaining >= int(remaining.max()) - slack
    return (np.where(last, np.minimum(step.rooms, np.maximum(remaining - 1, 0)), 0),
            int(np.count_nonzero(last)))


def best_candidate(values: dict[str, np.ndarray], knee_tokens: float, floor_tokens: float,
                   token_margin: float = 0.0) -> str | None:
    """The candidate whose best prefix promises the most tokens per step cost for a request
    on its own; None if none beats drafting nothing (each value counting
    ``1 / (1 + token_margin)`` of itself). :func:`draft_lengths` then sizes the chosen one
    against the rest of the batch. :func:`best_candidates` is the same over a whole step."""
    plain = 1.0 / step_cost(1, knee_tokens, floor_tokens)
    best, best_rate = None, plain
    for name, value in values.items():
        if not len(value):
            continue
        drafted = np.arange(1, len(value) + 1)
        costs = step_cost(1 + SPEC_STEP_OVERHEAD_PER_REQUEST + drafted, knee_tokens,
                          floor_tokens)
        rate = float(((1 + np.cumsum(value) / (1 + token_margin)) / costs).max())
        if rate > best_rate:
            best, best_rate = name, rate
    return best


def best_candidates(values: np.ndarray, lengths: np.ndarray, knee_tokens: float,
                    floor_tokens: float, token_margin: float = 0.0) -> np.ndarray:
    """:func:`best_candidate` for every row at once: ``values`` [R, S, K] each candidate's
    values (valid up to ``lengths`` [R, S]), in the order the per-request function would see
    them; per row the chosen slot, -1 for none. The same float operations, the first of
    equal rates winning and having to beat drafting nothing strictly."""
    plain = 1.0 / step_cost(1, knee_tokens, floor_tokens)
    width = values.shape[-1]
    costs = draft_costs(width, knee_tokens, floor_tokens)
    rates = (1 + values.cumsum(axis=-1) / (1 + token_margin)) / costs
    rates = np.where(_columns(width) < lengths[:, :, None], rates, -np.inf).max(axis=-1)
    best = rates.argmax(axis=1)
    return np.where(rates.max(axis=1) > plain, best, -1)


@lru_cache(maxsize=32)
def _columns(width: int) -> np.ndarray:
    """[width] 0..width - 1 (cached, read-only)."""
    columns = np.arange(width)
    columns.flags.writeable = False
    return columns


@dataclass(slots=True)
class Outcome:
    """A request's record (state part ``adaptive``): its candidates of the last step (row
    ``row`` of that step's grid and its tokens' cells, ``batch``, -1 past each candidate),
    valued once vLLM has committed, and how its last draft fared."""

    #: ([R, S, K] grid, cells: TokenAcceptance.grid_cells, the outcome cell included)
    batch: tuple[np.ndarray, np.ndarray] | None = None
    row: int = 0
    #: instead of ``batch`` after a small step: per candidate its tokens and their vote
    #: cells (vote * LEVELS + level)
    small: tuple[list[list[int]], list[list[int]]] | None = None
    cell_previous: int = UNDRAFTED  # the outcome cell the small step valued them in
    previous: int = UNDRAFTED
    #: candidates of a step in which the request drafted nothing, kept until the tokens it
    #: commits afterwards decide every one of them (:class:`Shadow`)
    shadow: Shadow | None = None


@dataclass
class Shadow:
    """Candidates of a request that drafted nothing in the step after them: vLLM committed
    one token, which tells only their first position. They are counted once the tokens the
    request commits in later steps, from ``start`` on, decide each of them (a miss, or its
    whole length known), so that the cells past the first position learn without drafting."""

    grid: np.ndarray  # [S, K] the candidates' tokens, -1 past each
    cells: np.ndarray  # [S, K] their cells (TokenAcceptance.grid_cells)
    start: int  # where the candidates' first token lies in the request's context
    #: each candidate's tokens (``grid``'s rows as lists): what the committed tokens are
    #: compared with each step until they decide every candidate
    tokens: list[list[int]] = field(default_factory=list)

    @classmethod
    def of(cls, grid: np.ndarray, cells: np.ndarray, start: int) -> Shadow:
        return cls(grid, cells, start, [[t for t in row if t >= 0] for row in grid.tolist()])

    def decided(self, known: list[int]) -> bool:
        """Whether the tokens committed from ``start`` on (``known``, at most the grid's width)
        decide every candidate: each missed among them or is no longer than them."""
        n = len(known)
        if n >= self.grid.shape[1]:
            return True
        return all(len(mine) <= n or mine[:n] != known for mine in self.tokens)


class Adaptive:
    """Chooses among the candidates of ``names`` (the last being the model's tail, which a
    ``restart`` block stands in for) by learned acceptance and sizes them by the cost model
    ``max(floor_tokens, knee_tokens + N)`` (``cost``, which a measurement may refine).

    The whole step is valued at once: the candidates as one padded grid, the acceptance
    table read and updated for every row together (:mod:`vllm_cllm.policies.acceptance`),
    the same choices as valuing each request in turn."""

    part = "adaptive"

    def __init__(self, names: Sequence[str], cost: CostModel, token_margin: float,
                 tail: str = "tail", restart: str = "restart", drain: bool = True) -> None:
        self.names = tuple(names)
        #: whether only the requests that end last draft in a draining batch (drain_rooms)
        self.drain = drain
        self.tail, self.restart = tail, restart
        self.cost, self.token_margin = cost, token_margin
        #: how often each kind of candidate token gets accepted
        self.acceptance = TokenAcceptance(self.names)
        self._rows = np.array([self.acceptance.sources.index(n) for n in self.names])
        self._tail = self.names.index(self.tail)
        self._row_list: list[int] = self._rows.tolist()
        #: per grid width, the cells of a restart block in the tail's slot: valued as the
        #: tail it buys, drafted after a miss and agreeing with nothing
        self._restart_cells: dict[int, np.ndarray] = {}
        #: per row count: the slots that told levels and the [R, S] level and backed tables
        #: (:meth:`_level_table`)
        self._level_tables: dict[int, tuple[tuple[int, ...], np.ndarray, np.ndarray]] = {}
        #: per (batch, width, knee, floor): the arguments of the native choice that depend on
        #: those only (:meth:`_choose_native`)
        self._choose_constants: dict[tuple[int, int, float, float], tuple] = {}
        #: logs each step's candidates where set (:mod:`vllm_cllm.policies.candidate_log`)
        self.recorder: CandidateLog | None = None

    def observe(self, step: VerifyStep, rows: Sequence[int],
                states: Sequence[RequestState]) -> list[Outcome]:
        """Value last step's candidates against what vLLM committed: the shadows the tokens
        committed since them decide, then the records of last step, in order (a record of a
        request that drafted nothing becomes a shadow instead where this step's one token
        does not decide it). Every record counted here is replaced when the request drafts,
        later in the same step."""
        outcomes: list[Outcome] = []
        seen: list[tuple[int, Outcome]] = []
        shadows: list[tuple[int, Outcome]] = []
        undrafted: set[int] = set()
        part, committed = self.part, step.committed
        for i, state in zip(rows, states, strict=True):
            outcome = state.parts.get(part)
            if state.last_drafted:
                previous = HIT if len(committed[i]) > 1 else MISSED
            else:
                previous = UNDRAFTED
                undrafted.add(i)
            if outcome is None:
                outcome = state.parts[part] = Outcome()
            else:
                outcome.previous = previous
                if outcome.shadow is not None:
                    shadows.append((i, outcome))
                if outcome.batch is not None or outcome.small is not None:
                    seen.append((i, outcome))
            outcomes.append(outcome)
        done = self._decided(step, shadows) if shadows else []
        if seen and all(outcome.small is not None for _, outcome in seen):
            if undrafted:
                seen = self._defer(step, seen, undrafted)
            self._count_grid(step, done, [], set())
            self._count_small(step, seen)
        else:
            self._count_grid(step, done, seen, undrafted)
        return outcomes

    def _decided(self, step: VerifyStep, shadows: list[tuple[int, Outcome]]
                 ) -> list[tuple[Shadow, np.ndarray]]:
        """The shadows that the tokens committed since them decide (taken from their
        requests' records), in order, each with those tokens; the others are kept."""
        done = []
        for i, outcome in shadows:
            shadow = outcome.shadow
            assert shadow is not None
            known = step.token_ids[i, shadow.start:min(int(step.num_tokens[i]),
                                                       shadow.start + shadow.grid.shape[1])]
            if shadow.decided(known.tolist()):
                done.append((shadow, known))
                outcome.shadow = None
        return done

    def _defer(self, step: VerifyStep, seen: list[tuple[int, Outcome]], undrafted: set[int],
               records: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[int, Outcome]]:
        """Keep as a :class:`Shadow` the candidates of each request in ``undrafted`` (it drafted
        nothing, so vLLM committed one token) that this token does not decide, where the
        request has no shadow yet; the records left to count now. ``records``: the grid and
        cells of every record in ``seen`` where they are at hand (of one batch, its width)."""
        asked = [r for r, (i, outcome) in enumerate(seen)
                 if i in undrafted and outcome.shadow is None]
        if not asked:
            return seen
        outcomes = [seen[r][1] for r in asked]
        # the first committed token (-2, which no candidate holds, where there is none)
        firsts = np.array([(step.committed[seen[r][0]] or [-2])[0] for r in asked],
                          dtype=np.int64)
        own: list[tuple[np.ndarray, np.ndarray]] | None = None  # each record at its width
        if records is not None:
            grid = records[0][asked]
        else:
            own = [self._record_arrays(outcome) for outcome in outcomes]
            width = max(tokens.shape[1] for tokens, _ in own)
            grid = np.full((len(own), len(self.names), width), -1, dtype=np.int64)
            for u, (tokens, _) in enumerate(own):
                grid[u, :, :tokens.shape[1]] = tokens
        # open: a candidate that agrees with the first token and goes on past it
        if grid.shape[2] > 1:
            opened = ((grid[:, :, 1] >= 0) & (grid[:, :, 0] == firsts[:, None])).any(axis=1)
        else:
            opened = np.zeros(len(asked), dtype=bool)
        deferred = set()
        for u in opened.nonzero()[0].tolist():
            r = asked[u]
            i, outcome = seen[r]
            if own is None:
                assert records is not None
                tokens, cells = records[0][r], records[1][r]
            else:
                tokens, cells = own[u]
            outcome.shadow = Shadow.of(tokens, cells, step.prompt_end(i))
            outcome.batch = outcome.small = None
            deferred.add(r)
        return [pair for r, pair in enumerate(seen) if r not in deferred]

    def _count_grid(self, step: VerifyStep, done: list[tuple[Shadow, np.ndarray]],
                    seen: list[tuple[int, Outcome]], undrafted: set[int]) -> None:
        """Count, in order, the decided shadows ``done`` (each with the tokens committed since
        it) and then the records ``seen`` against what vLLM committed this step, those of
        ``undrafted`` requests that become shadows (:meth:`_defer`) left out. Counting goes
        request by request in order, so the two grids counted in turn count as one would."""
        if done:
            width = max(shadow.grid.shape[1] for shadow, _ in done)
            grid = np.full((len(done), len(self.names), width), -1, dtype=np.int64)
            cells = np.zeros(grid.shape, dtype=np.int64)
            known = np.full((len(done), width), -2, dtype=np.int64)
            num_known = np.zeros(len(done), dtype=np.int64)
            for r, (shadow, tokens) in enumerate(done):
                w = shadow.grid.shape[1]
                grid[r, :, :w], cells[r, :, :w] = shadow.grid, shadow.cells
                known[r, :len(tokens)], num_known[r] = tokens, len(tokens)
            self.acceptance.observe_grid(cells, grid, known, num_known)
        if seen:
            batch = seen[0][1].batch
            if batch is not None and all(outcome.batch is batch for _, outcome in seen):
                # all drafted last step, in one batch: its rows, at its width
                which = [outcome.row for _, outcome in seen]
                if every_row_in_order(which, len(batch[0])):
                    grid, cells = batch  # every request of that step, in its order
                else:
                    grid, cells = batch[0][which], batch[1][which]
                if undrafted:
                    seen = self._defer(step, seen, undrafted, (grid, cells))
                    if len(seen) < len(which):
                        left = [outcome.row for _, outcome in seen]
                        grid, cells = batch[0][left], batch[1][left]
            else:
                if undrafted:
                    seen = self._defer(step, seen, undrafted)
                width = max((_record_width(outcome) for _, outcome in seen), default=0)
                grid = np.full((len(seen), len(self.names), width), -1, dtype=np.int64)
                cells = np.zeros(grid.shape, dtype=np.int64)
                for r, (_, outcome) in enumerate(seen):
                    tokens, marks = self._record_arrays(outcome)
                    w = tokens.shape[1]
                    grid[r, :, :w], cells[r, :, :w] = tokens, marks
            if seen:
                known, num_known = step.committed_grid([i for i, _ in seen], grid.shape[2])
                self.acceptance.observe_grid(cells, grid, known, num_known)

    def _count_small(self, step: VerifyStep, seen: list[tuple[int, Outcome]]) -> None:
        """:meth:`_count` request by request in Python (a few requests: cheaper than the
        grid's numpy calls): the same cells, each +1 in turn (add_ones_scalar), and the
        cells a request crowded halved after it (only cells it touched can be crowded)."""
        table = self.acceptance
        trials, accepted = table.trials.reshape(-1), table.accepted.reshape(-1)
        _, positions, num_votes, num_previous = table.trials.shape
        for i, outcome in seen:
            assert outcome.small is not None
            known, previous = step.committed[i], outcome.cell_previous
            counts: dict[int, list[int]] = {}
            for row, tokens, marks in zip(self._row_list, *outcome.small, strict=True):
                n = min(len(tokens), len(known))
                tried, hits = n, n
                for p in range(n):
                    if tokens[p] != known[p]:
                        tried, hits = p + 1, p
                        break
                for p in range(tried):
                    cell = ((row * positions + min(p, positions - 1)) * num_votes
                            + marks[p]) * num_previous + previous
                    count = counts.get(cell)
                    if count is None:
                        count = counts[cell] = [0, 0]
                    count[0] += 1
                    count[1] += p < hits
            for cell, (tried, won) in counts.items():
                t = add_ones_scalar(float(trials[cell]), tried)
                a = add_ones_scalar(float(accepted[cell]), won)
                if t > HALVE_AT:
                    t, a = t / 2, a / 2
                trials[cell], accepted[cell] = t, a
            outcome.small = None

    def draft(self, step: VerifyStep, rows: Sequence[int], states: Sequence[RequestState],
              sources: Mapping[str, DraftSource]) -> list[np.ndarray]:
        outcomes = self.observe(step, rows, states)
        all_rooms, priced = drain_rooms(step, *self.cost.at(len(step))) if self.drain \
            else (step.rooms, len(step))
        subset = step.rows_index(rows)
        rooms = all_rooms if subset is None else all_rooms[subset]
        if not np.count_nonzero(rooms):  # (a drafting request has room unless drain took it)
            for outcome in outcomes:  # nothing to draft or record this step
                outcome.batch = outcome.small = None
            return [EMPTY] * len(rows)
        if len(rows) <= SMALL_STEP:
            return self._draft_small(step, rows, states, outcomes, sources, rooms, priced)
        grid, sizes = candidate_grid(sources, self.names, step, rows, rooms, states)
        found = sizes.copy() if self.recorder is not None else sizes  # before restarts
        previous = np.array([outcome.previous for outcome in outcomes], dtype=np.int64)
        tail = self._tail
        tail_sizes = sizes[:, tail].tolist()  # 0: offered a restart block instead
        choose = self._choose_native if self.acceptance.native is not None else self._choose
        cells, values, best, sized = choose(step, priced, grid, sizes, previous, subset, rooms,
                                            *self._level_table(sources, states, len(rows)))
        kept = (grid, cells)
        for r, outcome in enumerate(outcomes):
            outcome.batch, outcome.row = kept, r
            outcome.small = None
        drafts = [EMPTY] * len(rows)
        restarts: list[int] = []  # restart blocks: drawn for the requests that draft them
        restart_sizes: list[int] = []
        # (lists: a Python loop over a few scalars costs less than index arrays)
        drafting = []
        for j, (s, n) in enumerate(zip(best.tolist(), sized.tolist(), strict=True)):
            if not n:
                continue
            drafting.append(j)
            if s == tail and not tail_sizes[j]:
                restarts.append(j)
                restart_sizes.append(n)
            else:
                drafts[j] = grid[j, s, :n]
        drawn: list[np.ndarray] = []
        if restarts:
            drawn = sources[self.restart].propose(
                step, [rows[j] for j in restarts], rooms[restarts].tolist(),
                [states[j] for j in restarts])[self.restart]
            for j, block, n in zip(restarts, drawn, restart_sizes, strict=True):
                drafts[j] = block[:n]
        if self.recorder is not None:
            candidates = {name: [grid[j, s, :found[j, s]] for j in range(len(rows))]
                          for s, name in enumerate(self.names)}
            expected = {j: float(values[j, s, :len(drafts[j])].sum()) for j, s in
                        zip(drafting, best[drafting].tolist(), strict=True)}
            self._record(step, rows, candidates, drafts, restarts, drawn, expected)
        return drafts

    def _choose(self, step: VerifyStep, batch: int, grid: np.ndarray, sizes: np.ndarray,
                previous: np.ndarray, subset: np.ndarray | None, rooms: np.ndarray,
                level: np.ndarray | None, backed: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A step's grid valued, chosen and sized in numpy: each token's cells [R, S, K], the
        candidates' values [R, S, K], each request's chosen slot [R] (-1: none) and its draft
        tokens [R]. A request without a tail (``sizes``' tail slot 0) is offered a restart
        block of its room in that slot (its ``sizes`` entry is set). ``level`` and ``backed``:
        :meth:`_level_table`. ``batch``: the batch size the drafts are priced at
        (:func:`drain_rooms`)."""
        knee, floor = self.cost.at(batch)
        width = grid.shape[2]
        levels = None
        if level is not None and backed is not None:
            levels = np.where(_columns(width) < backed[:, :, None], level[:, :, None], 0)
        cells = self.acceptance.grid_cells(self._rows, grid, previous, levels)
        # a request without a tail is offered a restart block of its room, valued as the tail
        # it buys (drafted after a miss, agreeing with nothing); drawn only where chosen. Its
        # slot holds no token, so its cells are never counted: the grid's cells serve both.
        bare = (sizes[:, self._tail] == 0).nonzero()[0]
        if len(bare):
            cells[bare, self._tail] = self._restart_block_cells(width)
            lengths = step.num_tokens[bare if subset is None else subset[bare]]
            sizes[bare, self._tail] = np.where(lengths > 0, rooms[bare], 0)
        values = self.acceptance.grid_values(cells)
        best = best_candidates(values, sizes, knee, floor, self.token_margin)
        # the chosen candidates sized together; the rest of the step counts in the batch
        chosen = (best >= 0).nonzero()[0]
        slot = best[chosen]
        sized = np.zeros(len(grid), dtype=np.int64)
        sized[chosen] = draft_lengths_grid(values[chosen, slot],
                                           np.minimum(rooms[chosen], sizes[chosen, slot]),
                                           knee, floor, token_margin=self.token_margin,
                                           batch=batch)
        return cells, values, best, sized

    def _choose_native(self, step: VerifyStep, batch: int, grid: np.ndarray, sizes: np.ndarray,
                       previous: np.ndarray, subset: np.ndarray | None, rooms: np.ndarray,
                       level: np.ndarray | None, backed: np.ndarray | None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_choose` in one call of the C module (``_grid_native.choose``): the same
        cells, values, choices and sizes, to the bit."""
        num_rows, num_slots, width = grid.shape
        knee, floor = self.cost.at(batch)
        table = self.acceptance
        num_previous = table.trials.shape[-1]
        cells = np.empty(grid.shape, dtype=np.int64)
        values = np.empty(grid.shape, dtype=np.float64)
        best = np.empty(num_rows, dtype=np.int64)
        sized = np.empty(num_rows, dtype=np.int64)
        num_tokens = step.num_tokens if subset is None else step.num_tokens[subset]
        key = (batch, width, knee, floor)
        constants = self._choose_constants.get(key)
        if constants is None:  # what depends on the step's shape and cost only
            if len(self._choose_constants) >= 64:  # a measured cost moves: keep a few
                self._choose_constants.clear()
            constants = self._choose_constants[key] = (
                table._base(self._rows, width), self._restart_block_cells(width),
                draft_costs(width, knee, floor), 1.0 / step_cost(1, knee, floor),
                batch_costs(batch, width, knee, floor))
        base, restart_cells, costs, plain, step_costs = constants
        gain, cost = table.native.choose(
            num_rows, num_slots, width, grid, sizes, previous, base, level, backed,
            restart_cells, self._tail, np.ascontiguousarray(rooms, dtype=np.int64), num_tokens,
            table.counts, LEVELS * num_previous, num_previous, MAX_VOTES, costs, plain,
            1 + self.token_margin, batch, 1.0 / (1.0 + self.token_margin), step_costs, cells,
            values, best, sized)
        if not beats_plain(gain, cost, batch, knee, floor):
            sized[:] = 0
        return cells, values, best, sized

    def _draft_small(self, step: VerifyStep, rows: Sequence[int],
                     states: Sequence[RequestState], outcomes: list[Outcome],
                     sources: Mapping[str, DraftSource], rooms: np.ndarray, batch: int
                     ) -> list[np.ndarray]:
        """:meth:`draft` for a step of a few requests, in plain Python: the same votes,
        values (sequential products and sums, as numpy's cumprod and cumsum), choices and
        sizing (:func:`draft_lengths_grid`'s merge as a sort of the same keys), to the bit.
        ``rooms``: each request's room (of ``rows``); ``batch``: the batch size the drafts are
        priced at."""
        knee, floor = self.cost.at(batch)
        table = self.acceptance
        lengths = rooms.tolist()
        candidates = gather(sources, self.names, step, rows, lengths, states)
        names, tail = self.names, self._tail
        _, positions, num_votes, num_previous = table.trials.shape
        last = positions - 1
        rates = (table.accepted / table.trials).reshape(-1).tolist()
        width = max(lengths)
        costs = [max(floor, knee + (1 + SPEC_STEP_OVERHEAD_PER_REQUEST + d))
                 for d in range(1, width + 1)]
        plain = 1.0 / step_cost(1, knee, floor)
        margin = 1 + self.token_margin
        chosen: list[tuple[int, int, list[float]]] = []  # (j, slot, values up to its cap)
        levels = {s: (level.tolist(), backed.tolist())
                  for s, (level, backed) in self._levels(sources, states).items()}
        for j, outcome in enumerate(outcomes):
            tokens = [candidates[name][j].tolist() for name in names]
            marks = []  # each token's vote cell: its vote and its source's backing
            for s, mine in enumerate(tokens):
                level, backed = (levels[s][0][j], levels[s][1][j]) if s in levels else (0, 0)
                marks.append([min(sum(1 for other in tokens
                                      if len(other) > p and other[p] == t) - 1, MAX_VOTES)
                              * LEVELS + (level if p < backed else 0)
                              for p, t in enumerate(mine)])
            previous = outcome.previous
            outcome.small, outcome.cell_previous = (tokens, marks), previous
            outcome.batch = None
            best, best_rate, best_values = -1, plain, None
            for s, row in enumerate(self._row_list):
                mine, cell_previous = marks[s], previous
                if s == tail and not tokens[s]:  # a restart block, valued as the tail
                    mine = [0] * (lengths[j] if step.num_tokens[rows[j]] > 0 else 0)
                    cell_previous = MISSED
                if not mine:
                    continue
                values, value, total, rate = [], 1.0, 0.0, -np.inf
                for p, vote in enumerate(mine):
                    value *= rates[((row * positions + min(p, last)) * num_votes + vote)
                                   * num_previous + cell_previous]
                    values.append(value)
                    total += value
                    rate = max(rate, (1 + total / margin) / costs[p])
                if rate > best_rate:
                    best, best_rate, best_values = s, rate, values
            if best >= 0:
                assert best_values is not None
                chosen.append((j, best, best_values))
        sized = _sized_small(rows, lengths, chosen, knee, floor, self.token_margin, batch)
        drafts = [EMPTY] * len(rows)
        restarts = [j for j, s, _ in chosen if s == tail and not len(candidates[names[tail]][j])
                    and sized.get(j)]
        drawn: list[np.ndarray] = []
        if restarts:
            drawn = sources[self.restart].propose(
                step, [rows[j] for j in restarts], [lengths[j] for j in restarts],
                [states[j] for j in restarts])[self.restart]
            for j, block in zip(restarts, drawn, strict=True):
                drafts[j] = block[:sized[j]]
        for j, s, _ in chosen:
            n = sized.get(j, 0)
            if n and j not in restarts:
                drafts[j] = candidates[names[s]][j][:n]
        if self.recorder is not None:
            expected = {j: float(sum(values[:len(drafts[j])])) for j, _, values in chosen
                        if len(drafts[j])}
            self._record(step, rows, candidates, drafts, restarts, drawn, expected)
        return drafts

    def _level_table(self, sources: Mapping[str, DraftSource],
                     states: Sequence[RequestState], num_rows: int
                     ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """:meth:`_levels` as two [R, S] tables (each candidate's level and how many of its
        leading tokens are at it, 0 for a slot whose source tells none); None where no
        source tells."""
        found = self._levels(sources, states)
        if not found:
            return None, None
        # one pair of tables per row count, reused: the same slots tell their levels every
        # step (the others stay 0), and the tables are read within the step only
        tables = self._level_tables.get(num_rows)
        if tables is None or tables[0] != tuple(found):
            shape = (num_rows, len(self.names))
            tables = self._level_tables[num_rows] = (
                tuple(found), np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64))
        _, level, backed = tables
        for s, (mine, at) in found.items():
            level[:, s], backed[:, s] = mine, at
        return level, backed

    def _levels(self, sources: Mapping[str, DraftSource], states: Sequence[RequestState]
                ) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per slot whose source tells how strongly it backs its candidates (the optional
        ``levels`` hook of :class:`DraftSource`), each request's level and how many leading
        tokens are at it."""
        found = {}
        for s, name in enumerate(self.names):
            levels = getattr(sources[name], "levels", None)
            if levels is not None:
                found[s] = levels(states)
        return found

    def _record_arrays(self, outcome: Outcome) -> tuple[np.ndarray, np.ndarray]:
        """A request's record of last step's candidates as ([S, K] tokens, -1 past each;
        their cells)."""
        if outcome.batch is not None:
            return outcome.batch[0][outcome.row], outcome.batch[1][outcome.row]
        assert outcome.small is not None
        tokens, marks = outcome.small
        width = max((len(t) for t in tokens), default=0)
        grid = np.full((len(tokens), width), -1, dtype=np.int64)
        votes = np.zeros(grid.shape, dtype=np.int64)
        for s, (mine, vote) in enumerate(zip(tokens, marks, strict=True)):
            grid[s, :len(mine)], votes[s, :len(vote)] = mine, vote
        previous = np.array([outcome.cell_previous], dtype=np.int64)
        return grid, self.acceptance.cell_index(self._rows, votes[None], previous)[0]

    def _restart_block_cells(self, width: int) -> np.ndarray:
        """[width] the cells of a restart block in the tail's slot (no votes, after a miss)."""
        cells = self._restart_cells.get(width)
        if cells is None:
            cells = self._restart_cells[width] = self.acceptance.cell_index(
                self._rows[self._tail:self._tail + 1], np.zeros((1, 1, width), dtype=np.int64),
                np.array([MISSED]))[0, 0]
        return cells

    def _record(self, step: VerifyStep, rows: Sequence[int], candidates: Mapping[str, list],
                drafts: list[np.ndarray], restarts: list[int], drawn: list[np.ndarray],
                expected: Mapping[int, float]) -> None:
        """Log the step's candidates, the restart blocks drawn among them and each draft's
        expected accepted tokens (``recorder``)."""
        assert self.recorder is not None
        self.recorder.record(step, rows, candidates, drafts,
                             self.cost.at(len(step)),
                             dict(zip(restarts, drawn, strict=True)), self.restart, expected)

def _sized_small(rows: Sequence[int], lengths: list[int],
                 chosen: list[tuple[int, int, list[float]]], knee: float, floor: float,
                 token_margin: float, batch: int) -> dict[int, int]:
    """:func:`draft_lengths_grid` for the chosen candidates of a few requests (``chosen``:
    the request's index in ``rows``, its slot, its values), priced in a batch of ``batch``:
    draft tokens per request index (missing: none)."""
    items = []
    for j, _, values in chosen:
        if values[0] > 0:
            i = rows[j]
            items.extend((-v, i, p, j) for p, v in enumerate(values[:min(lengths[j],
                                                                          len(values))]))
    if not items:
        return {}
    items.sort()
    trust = 1.0 / (1.0 + token_margin)
    gain, tokens = float(batch), batch * (1 + SPEC_STEP_OVERHEAD_PER_REQUEST)
    rate = gain / max(floor, knee + tokens)
    taken: dict[int, int] = {}
    for negative, _, _, j in items:
        more_gain, more_tokens = gain + (-negative) * trust, tokens + 1.0
        more = more_gain / max(floor, knee + more_tokens)
        if more <= rate:
            break
        gain, tokens, rate = more_gain, more_tokens, more
        taken[j] = taken.get(j, 0) + 1
    return taken if beats_plain(gain, step_cost(tokens, knee, floor), batch, knee, floor) \
        else {}


def _record_width(outcome: Outcome) -> int:
    """The widest candidate a request's record holds."""
    if outcome.batch is not None:
        return int(outcome.batch[0].shape[2])
    assert outcome.small is not None
    return max((len(tokens) for tokens in outcome.small[0]), default=0)

