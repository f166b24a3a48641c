"""The ``jacobi`` proposer: a CLLM drafts its own next block by fixed-point iteration.

In a verify step over drafts ``d_1..d_n`` the target predicts ``g_1..g_{n+1}``; vLLM commits
``g_1..g_{a+1}`` (a = accepted drafts). ``g_{a+2}..g_{n+1}`` were predicted behind the
rejected ``d_{a+1}`` — the unconverged part of the Jacobi iterate — and become the next
draft, completed up to k by the fill policy. vLLM's rejection sampler decides what is
emitted, so greedy output equals plain decoding and sampling keeps the model's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_cllm.sizing.acceptance import HIT, MISSED, UNDRAFTED, Cells, TokenAcceptance
from vllm_cllm.sizing.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    AcceptanceRate,
    draft_lengths,
    drafts_cost_time,
    step_cost,
)
from vllm_cllm.proposers.capture import SelfDraftingProposer, VerifyPredictions
from vllm_cllm.sources.ngram import Fill, NgramFill, RandomContextFill, make_fill, pool_continuation
from vllm_cllm.sources.suffix_trees import SuffixTreeLookup

_EMPTY = np.empty(0, dtype=np.int64)


def next_draft(tail: np.ndarray, context: np.ndarray, k: int, fill: Fill, restart: Fill
               ) -> np.ndarray:
    """``tail`` then ``fill`` up to ``k`` tokens; ``restart`` supplies a block when both are empty.

    ``context`` is the request's committed tokens; the fill sees them followed by the tail.
    """
    tail = tail[:k]
    extra = fill(np.concatenate([context, tail]) if len(tail) else context, k - len(tail))
    draft = np.concatenate([tail, extra]) if len(extra) else tail
    if len(draft) == 0:
        draft = restart(context, k)  # never stall: e.g. the first decode step after prefill
    return np.asarray(draft[:k], dtype=np.int64)


def matched_prefix(candidate: np.ndarray, committed: list[int]) -> int:
    """How many leading tokens of ``candidate`` equal the tokens vLLM committed."""
    n = min(len(candidate), len(committed))
    mismatch = np.flatnonzero(candidate[:n] != np.asarray(committed[:n]))
    return int(mismatch[0]) if len(mismatch) else n


#: Below this expected match length the model's own draft is cut to a short probe: verifying
#: k tokens that are almost never accepted costs time (the base model's tail is ~5 % right),
#: while a probe keeps measuring the tail (a CLLM's tail scores far above it).
PROBE_BELOW = 0.5
PROBE_TOKENS = 2
#: The model's own draft (Jacobi tail + fill, or SPACE's candidates) is the source named
#: here; it starts optimistic so that a CLLM's tail is drafted in full at once.
MODEL_SOURCE = "model"


#: The order in which ``jacobi``'s ``hybrid`` drafts its sources at a fixed k: the first that
#: has a draft this step is drafted. A lookup's match (the request's own n-grams, then the
#: ``lookup``: the suffix trees or the history of earlier outputs) guesses the next token right
#: more often than the CLLM's tail does (60 % and 56 % against 28 % on gsm_symbolic), so it
#: goes first; the pool of recent iterates before the tail. Measured against choosing by score
#: (tokens per step, CLLM demo, k = 15, batch 1, 128 tokens): gsm 2.57 vs 2.23, HumanEval 2.93
#: vs 2.52, MT-bench 2.58 vs 2.48, ShareGPT 2.29 vs 2.40 (README, "Which source jacobi drafts").
JACOBI_ORDER = ("ngram", "lookup", "pool", MODEL_SOURCE)
#: The candidates of adaptive ``hybrid`` drafting, each token valued by how often tokens like
#: it were accepted (vllm_cllm/sizing/acceptance.py): the lookup, the request's own n-gram
#: continuation and the model's Jacobi tail. The pool is left out there: it measured no gain
#: over these three (README, "Sizing drafts by learned acceptance").
LEARNED_SOURCES = ("lookup", "ngram", MODEL_SOURCE)
#: The n-gram lookup's two continuations, scored separately per request: the usual one (the
#: most frequent next token, its first occurrence) and the latest occurrence's. Worked
#: solutions reuse a phrase with new numbers, and there the latest occurrence is right more
#: often; in code and chat the usual one is (README, "Which source jacobi drafts").
NGRAM_VARIANTS = ("ngram", "ngram_latest")


def _initial_scores() -> dict[str, float]:
    return {MODEL_SOURCE: 1.0}


@dataclass
class HybridState:
    """Per-request record of how well each draft source has predicted committed tokens.

    Sources are named (``model``, ``ngram``, ``pool``, ``history``; ``space`` adds ``tail``);
    a source seen for the first time starts at 0. ``space`` drafts the best-scoring source that
    has a draft (:meth:`choose`; ties go to the source listed first); ``jacobi`` at a fixed k
    drafts in a fixed order (:meth:`first_in_order`), the model's score deciding only its probe.
    """

    scores: dict[str, float] = field(default_factory=_initial_scores)
    proposed: dict[str, np.ndarray] = field(default_factory=dict)
    #: recent model predictions, each a stream starting at the then last committed token
    pool: list[np.ndarray] = field(default_factory=list)

    def update(self, committed: list[int], decay: float = 0.7) -> None:
        """Score each source on the steps where it proposed something.

        A step where the n-gram lookup found no match says nothing about how good its matches
        are; counting it as 0 would hand the draft to the Jacobi tail right when a match shows up.
        """
        for name, draft in self.proposed.items():
            if len(draft):
                self.scores[name] = decay * self.scores.get(name, 0.0) + (1 - decay) * \
                    matched_prefix(draft, committed)
        self.proposed = {}

    def choose(self, candidates: dict[str, np.ndarray]) -> np.ndarray:
        """The draft of the best source (``space``'s rule), probe rule applied."""
        self.proposed = candidates
        ranked = [name for name, draft in candidates.items() if len(draft)]
        if not ranked:
            return _EMPTY
        best = max(ranked, key=lambda name: (self.scores.get(name, 0.0), -ranked.index(name)))
        return self._probed(best, candidates[best])

    def first_in_order(self, candidates: dict[str, np.ndarray]) -> np.ndarray:
        """The draft of the first source in :data:`JACOBI_ORDER` that has one (``jacobi``'s
        rule), probe rule applied; every source is still scored. The n-gram's slot goes to
        whichever of its two continuations (:data:`NGRAM_VARIANTS`) has matched better in
        this request, the usual one on a tie."""
        self.proposed = candidates
        usual, latest = NGRAM_VARIANTS
        if self.scores.get(latest, 0.0) > self.scores.get(usual, 0.0) and \
                len(candidates.get(latest, _EMPTY)):
            candidates = {**candidates, usual: candidates[latest]}
        name = next((n for n in JACOBI_ORDER if len(candidates.get(n, _EMPTY))), None)
        return _EMPTY if name is None else self._probed(name, candidates[name])

    def _probed(self, name: str, draft: np.ndarray) -> np.ndarray:
        """``draft`` of source ``name``; the model's own is cut to a probe while it misses."""
        if name == MODEL_SOURCE and self.scores[MODEL_SOURCE] < PROBE_BELOW:
            return draft[:PROBE_TOKENS]
        return draft

    def draft(self, model: np.ndarray, ngram: np.ndarray, context: np.ndarray,
              block: np.ndarray, room: int, pool_size: int, ngram_max: int,
              lookup: np.ndarray = _EMPTY, ngram_latest: np.ndarray = _EMPTY) -> np.ndarray:
        """Draft the first of, in :data:`JACOBI_ORDER`: the n-gram continuation (``ngram`` or
        ``ngram_latest``, whichever has matched better), the ``lookup``'s continuation,
        (``pool_size`` > 0) the pool's continuation, the model's draft; then remember this
        step's ``block`` (the model's predictions past the committed tokens) in the pool."""
        candidates = {MODEL_SOURCE: model, "ngram": ngram, "ngram_latest": ngram_latest}
        if pool_size:
            candidates["pool"] = np.asarray(pool_continuation(
                context, self.pool, ngram_max, room), dtype=np.int64)
            if len(block):
                self.pool.append(np.concatenate([context[-1:], block]))
                del self.pool[:-pool_size]
        if len(lookup):
            candidates["lookup"] = lookup
        return self.first_in_order(candidates)


@dataclass
class JacobiRequest:
    """What the proposer remembers about one running request (dropped when it leaves):
    the hybrid fill's state, its acceptance rate (adaptive k with another fill), last step's
    candidates (adaptive ``hybrid``: scored once vLLM has committed), and (with the numpy
    history) the tokens committed so far, which join the history once it leaves."""

    output: list[int] = field(default_factory=list)
    hybrid: HybridState = field(default_factory=HybridState)
    rate: AcceptanceRate = field(default_factory=AcceptanceRate)
    candidates: dict[str, np.ndarray] = field(default_factory=dict)
    cells: Cells = field(default_factory=dict)
    #: how its last draft fared (vllm_cllm/sizing/acceptance.py: MISSED, HIT, UNDRAFTED)
    previous: int = UNDRAFTED


def best_candidate(values: dict[str, np.ndarray], knee_tokens: float, floor_tokens: float,
                   token_margin: float = 0.0) -> str | None:
    """The candidate whose best prefix promises the most tokens per step cost for a request
    on its own (the cost model of vllm_cllm/sizing/cost_model.py); None if none beats drafting
    nothing (each value counting ``1 / (1 + token_margin)`` of itself, as there).
    :func:`draft_lengths` then sizes the chosen one against the rest of the batch."""
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


def _log_lookup(lookup: str) -> None:
    """Say which lookup ``hybrid`` drafts from: the default depends on what is installed."""
    from vllm.logger import init_logger

    from vllm_cllm.sources.suffix_trees import suffix_tree_missing

    why = "" if lookup == "suffix" else f" ({suffix_tree_missing() or 'as configured'})"
    where = "arctic-inference's suffix trees" if lookup == "suffix" else "numpy n-gram lookups"
    init_logger(__name__).info("vllm-cllm: jacobi looks up earlier text in %s%s", where, why)


class JacobiProposer(SelfDraftingProposer):
    """The ``jacobi`` method's proposer (see the module docstring); ``hybrid`` also drafts
    from a lookup of earlier text (:attr:`suffix`, or the numpy :attr:`history`)."""

    method = "jacobi"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.restart = RandomContextFill(self.options.seed)
        #: the n-gram lookup: ``hybrid``'s fill, and its n-gram source in both continuations
        self.lookup = NgramFill(self.options.ngram_min, self.options.ngram_max,
                                self.max_model_len)
        self.fill: Fill = self.lookup if self.options.fill == "hybrid" else \
            make_fill(self.options, self.max_model_len)
        #: arctic-inference's suffix trees (``lookup: suffix``); else the numpy history
        self.suffix = SuffixTreeLookup(self.options.history_size) \
            if self.options.uses_suffix_tree else None
        if self.options.fill == "hybrid":
            _log_lookup(self.options.lookup)
        #: adaptive ``hybrid``: how often each kind of candidate token gets accepted
        self.acceptance = TokenAcceptance(LEARNED_SOURCES)
        self.learned = self.options.adaptive and self.options.fill == "hybrid"
        self.token_margin = self.options.token_margin_pct / 100

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, *args: Any, **kwargs: Any) -> list[list[int]]:
        predictions = self.take_predictions()
        rooms = [self.draft_room(sampled, int(num_tokens_no_spec[i]), self.k, self.max_model_len)
                 for i, sampled in enumerate(sampled_token_ids)]  # 0: partial prefill, or full
        states: list[JacobiRequest | None] = [None] * len(rooms)
        if predictions is not None and (self.options.fill == "hybrid" or self.options.adaptive):
            states = [self._request(predictions.req_ids[i], sampled) if rooms[i] else None
                      for i, sampled in enumerate(sampled_token_ids)]
        if self.options.adaptive and predictions is not None and drafts_cost_time(
                len(rooms), self.options.knee_tokens, self.options.floor_tokens):
            return self._propose_nothing(sampled_token_ids, states, predictions,
                                         num_tokens_no_spec, token_ids_cpu)
        if self.learned and predictions is not None:
            drafts = self._propose_learned(sampled_token_ids, rooms, states, predictions,
                                           num_tokens_no_spec, token_ids_cpu)
            return [draft.tolist() for draft in drafts]
        sizing = self.options.adaptive and predictions is not None
        if sizing:  # who would draft if every draft were k long: nobody else makes one
            rates = [s.rate if s else AcceptanceRate(0.0) for s in states]
            rooms = [room if n else 0 for room, n in zip(rooms, self._lengths(rates, rooms),
                                                         strict=True)]
        drafts = [self._draft(i, sampled, room, state, predictions, num_tokens_no_spec,
                              token_ids_cpu) if room else _EMPTY
                  for i, (sampled, room, state) in enumerate(zip(sampled_token_ids, rooms, states,
                                                                 strict=True))]
        if sizing:  # sized again as drafted: a probe or a short lookup is not k positions
            drafts = [draft[:n] for draft, n in zip(
                drafts, self._lengths(rates, [len(d) for d in drafts]), strict=True)]
        for state, draft in zip(states, drafts, strict=True):
            if state is not None:
                state.rate.last_drafted = len(draft)
        return [draft.tolist() for draft in drafts]

    def _lengths(self, rates: list[AcceptanceRate], rooms: list[int]) -> list[int]:
        return draft_lengths([rate.values(room) for rate, room in zip(rates, rooms, strict=True)],
                             rooms, self.options.knee_tokens, self.options.floor_tokens,
                             token_margin=self.token_margin)

    def _propose_nothing(self, sampled_token_ids: list[list[int]],
                         states: list[JacobiRequest | None], predictions: VerifyPredictions,
                         num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
                         ) -> list[list[int]]:
        """Adaptive k where drafts cost time (:func:`~vllm_cllm.sizing.cost_model.drafts_cost_time`:
        batch 8 and 16 on this CPU): no drafts, and no candidates built for them. There a
        draft token costs a good part of a request's step (all 16 requests drafting one token
        each: +42-70 % a step, benchmarks/draft_shape.py), while in a closed batch only the
        slowest request's gain ends it sooner: in lock step, steps drafted on promises of
        10-25 % more tokens per cost ran 0.96-0.99x of plain decoding (README, "Batch 16: no
        drafts where drafts cost time"). The suffix trees still take each request's committed
        tokens (:meth:`SuffixTreeLookup.follow`), so that its output is there for later
        requests (the numpy history gets them through :meth:`_request`)."""
        for i, (sampled, state) in enumerate(zip(sampled_token_ids, states, strict=True)):
            if state is None:
                continue
            state.rate.last_drafted = 0
            req_id = predictions.req_ids[i]
            if self.suffix is not None and req_id is not None:
                context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
                self.suffix.follow(req_id, req_id in self.greedy, context,
                                   len(context) - len(sampled))
        return [[] for _ in sampled_token_ids]

    def _propose_learned(self, sampled_token_ids: list[list[int]], rooms: list[int],
                         states: list[JacobiRequest | None], predictions: VerifyPredictions,
                         num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
                         ) -> list[np.ndarray]:
        """Adaptive ``hybrid``: per request the candidate whose tokens promise the most
        (:func:`best_candidate`), each token valued by :attr:`acceptance`; then every chosen
        candidate sized against the batch by the cost model (:func:`draft_lengths`)."""
        knee, floor = self.options.knee_tokens, self.options.floor_tokens
        chosen, values = [], []
        for i, (sampled, room, state) in enumerate(zip(sampled_token_ids, rooms, states,
                                                       strict=True)):
            if not room or state is None:
                chosen.append(_EMPTY)
                values.append(())
                continue
            context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
            state.candidates = self._candidates(i, sampled, room, predictions, context)
            state.cells = self.acceptance.cells(state.candidates, state.previous)
            value = self.acceptance.values(state.cells)
            name = best_candidate(value, knee, floor, self.token_margin)
            chosen.append(_EMPTY if name is None else state.candidates[name])
            values.append(() if name is None else value[name])
        lengths = draft_lengths(values, rooms, knee, floor, token_margin=self.token_margin)
        for state, n in zip(states, lengths, strict=True):
            if state is not None:
                state.rate.last_drafted = n
        return [draft[:n] for draft, n in zip(chosen, lengths, strict=True)]

    def _candidates(self, i: int, sampled: list[int], room: int, predictions: VerifyPredictions,
                    context: np.ndarray) -> dict[str, np.ndarray]:
        """Request ``i``'s candidates of :data:`LEARNED_SOURCES`, each at most ``room`` long."""
        req_id = predictions.req_ids[i]
        return {"lookup": self._lookup(req_id, sampled, context, room),
                "ngram": np.asarray(self.lookup(context, room), dtype=np.int64),
                MODEL_SOURCE: predictions.next_block(i, len(sampled))[:room]}

    def _lookup(self, req_id: str | None, sampled: list[int], context: np.ndarray, room: int
                ) -> np.ndarray:
        """What followed the context elsewhere: in the suffix trees (every request), or in the
        numpy history of earlier outputs (greedy requests only; see ``uses_history``)."""
        if self.suffix is not None and req_id is not None:
            return self.suffix.draft(req_id, req_id in self.greedy, context,
                                     len(context) - len(sampled), room)
        if self.uses_history(req_id):
            return self.history.continuation(context, room)
        return _EMPTY

    def _draft(self, i: int, sampled: list[int], room: int, state: JacobiRequest | None,
               predictions: VerifyPredictions | None, num_tokens_no_spec: np.ndarray,
               token_ids_cpu: np.ndarray) -> np.ndarray:
        """Request ``i``'s draft of at most ``room`` tokens at a fixed k: the Jacobi tail plus
        the fill (``hybrid``: or the first other source in :data:`JACOBI_ORDER`)."""
        tail = predictions.next_block(i, len(sampled)) if predictions is not None else _EMPTY
        context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
        draft = next_draft(tail, context, room, self.fill, self.restart)
        if state is None or self.options.fill != "hybrid":
            return draft
        req_id = predictions.req_ids[i] if predictions is not None else None
        usual, latest = (np.asarray(c, dtype=np.int64) for c in self.lookup.both(context, room))
        return state.hybrid.draft(draft, usual, context, tail, room, self.options.pool_size,
                                  self.options.ngram_max,
                                  self._lookup(req_id, sampled, context, room), latest)

    def _request(self, req_id: str, sampled: list[int]) -> JacobiRequest:
        """The request's state, updated with what the last step committed (``sampled``)."""
        state = self.request_state.get(req_id)
        if state is None:  # first step after prefill: nothing drafted yet, nothing to score
            state = self.request_state[req_id] = JacobiRequest()
        else:
            state.hybrid.update(sampled)
            state.previous = (HIT if len(sampled) > 1 else MISSED) if state.rate.last_drafted \
                else UNDRAFTED
            state.rate.observe(len(sampled) - 1)
            if state.candidates:
                self.acceptance.observe(state.candidates, state.cells, sampled)
                state.candidates, state.cells = {}, {}
        if self.history.size:
            state.output.extend(sampled)
        return state

    def drop_departed(self, live_req_ids: set[str]) -> None:
        super().drop_departed(live_req_ids)
        if self.suffix is not None:
            for req_id in [r for r in self.suffix.active if r not in live_req_ids]:
                self.suffix.drop(req_id)

    def tracked_requests(self) -> set[str]:
        held = super().tracked_requests()
        return held | set(self.suffix.active) if self.suffix is not None else held
