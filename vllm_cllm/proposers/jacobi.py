"""The ``jacobi`` proposer: a CLLM drafts its own next block by fixed-point iteration.

In a verify step over drafts ``d_1..d_n`` the target predicts ``g_1..g_{n+1}``; vLLM commits
``g_1..g_{a+1}`` (a = accepted drafts). ``g_{a+2}..g_{n+1}`` were predicted behind the
rejected ``d_{a+1}`` — the unconverged part of the Jacobi iterate — and become the next
draft, completed up to k by the fill policy. vLLM's rejection sampler decides what is
emitted, so greedy output equals plain decoding and sampling keeps the model's distribution.

Three ways to draft a step (:meth:`JacobiProposer.propose`):

* **adaptive** (the default with ``fill: hybrid``): every request values the tokens of three
  candidates — the lookup of earlier text, its own n-gram continuation and the Jacobi tail —
  by learned acceptance (:mod:`vllm_cllm.sizing.acceptance`), picks the one that promises
  the most tokens per step cost, and the batch's drafts are sized together by the cost model
  (:mod:`vllm_cllm.sizing.cost_model`);
* **nothing**, adaptive at a batch where the device is compute-bound: a draft token there
  costs a good part of a request's step, and in a closed batch only the slowest request's
  gain ends it sooner, so no request drafts and vLLM samples the step plainly;
* **fixed k** (``adaptive: false``, any other fill, and every sampled request): the tail
  completed by the fill up to k; ``hybrid`` drafts the first source of :data:`JACOBI_ORDER`
  that has a draft. A sampled request's drafts depend on its own tokens only, so a seeded
  request samples the same whatever runs beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_cllm.proposers.capture import SelfDraftingProposer, VerifyPredictions
from vllm_cllm.proposers.drafting import (
    EMPTY,
    MODEL_SOURCE,
    SourceScores,
    next_draft,
)
from vllm_cllm.sizing.acceptance import HIT, MISSED, UNDRAFTED, Cells, TokenAcceptance
from vllm_cllm.sizing.cost_model import (
    SPEC_STEP_OVERHEAD_PER_REQUEST,
    draft_lengths,
    drafts_cost_time,
    step_cost,
)
from vllm_cllm.sources.ngram import Fill, NgramFill, RandomContextFill, make_fill
from vllm_cllm.sources.pool import pool_continuation
from vllm_cllm.sources.suffix_trees import SuffixTreeLookup

#: The order in which ``hybrid`` drafts its sources at a fixed k: the first that has a draft
#: this step is drafted. A lookup's match (the request's own n-grams, then the ``lookup`` of
#: earlier text) guesses the next token right more often than a small CLLM's tail does, so it
#: goes first; the pool of recent iterates before the tail (docs/decisions.md).
JACOBI_ORDER = ("ngram", "lookup", "pool", MODEL_SOURCE)
#: The candidates of adaptive drafting, each token valued by how often tokens like it were
#: accepted: the lookup, the request's own n-gram continuation and the model's Jacobi tail.
LEARNED_SOURCES = ("lookup", "ngram", MODEL_SOURCE)
#: The n-gram lookup's two continuations, scored separately per request: the usual one (the
#: most frequent next token, its first occurrence) and the latest occurrence's. Worked
#: solutions reuse a phrase with new numbers, and there the latest occurrence is right more
#: often; in code and chat the usual one is.
NGRAM_VARIANTS = ("ngram", "ngram_latest")


@dataclass
class JacobiSources(SourceScores):
    """``hybrid`` at a fixed k: source scores plus the pool of the request's recent Jacobi
    iterates; drafts in :data:`JACOBI_ORDER`, the model's score deciding only its probe."""

    #: recent model predictions, each a stream starting at the then last committed token
    pool: list[np.ndarray] = field(default_factory=list)

    def first_in_order(self, candidates: dict[str, np.ndarray]) -> np.ndarray:
        """The draft of the first source in :data:`JACOBI_ORDER` that has one, probe rule
        applied; every source is still scored. The n-gram's slot goes to whichever of its
        two continuations (:data:`NGRAM_VARIANTS`) has matched better in this request, the
        usual one on a tie."""
        self.proposed = candidates
        usual, latest = NGRAM_VARIANTS
        if self.scores.get(latest, 0.0) > self.scores.get(usual, 0.0) and \
                len(candidates.get(latest, EMPTY)):
            candidates = {**candidates, usual: candidates[latest]}
        name = next((n for n in JACOBI_ORDER if len(candidates.get(n, EMPTY))), None)
        return EMPTY if name is None else self.probed(name, candidates[name])

    def draft(self, model: np.ndarray, ngram: np.ndarray, context: np.ndarray,
              block: np.ndarray, room: int, pool_size: int, ngram_max: int,
              lookup: np.ndarray = EMPTY, ngram_latest: np.ndarray = EMPTY) -> np.ndarray:
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
    the fixed-k hybrid's source scores and pool, the adaptive rule's candidates of the last
    step (valued once vLLM has committed) and how its last draft fared, and (with the numpy
    history) the tokens committed so far, which join the history once it leaves."""

    output: list[int] = field(default_factory=list)
    sources: JacobiSources = field(default_factory=JacobiSources)
    candidates: dict[str, np.ndarray] = field(default_factory=dict)
    cells: Cells = field(default_factory=dict)
    #: draft tokens proposed for it last step
    last_drafted: int = 0
    #: how its last draft fared (:mod:`vllm_cllm.sizing.acceptance`: MISSED, HIT, UNDRAFTED)
    previous: int = UNDRAFTED


def best_candidate(values: dict[str, np.ndarray], knee_tokens: float, floor_tokens: float,
                   token_margin: float = 0.0) -> str | None:
    """The candidate whose best prefix promises the most tokens per step cost for a request
    on its own (the cost model of :mod:`vllm_cllm.sizing.cost_model`); None if none beats
    drafting nothing (each value counting ``1 / (1 + token_margin)`` of itself, as there).
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
        self.hybrid = self.options.fill == "hybrid"
        self.fill: Fill = self.lookup if self.hybrid else \
            make_fill(self.options, self.max_model_len)
        #: arctic-inference's suffix trees (``lookup: suffix``); else the numpy history
        self.suffix = SuffixTreeLookup(self.options.history_size) \
            if self.options.uses_suffix_tree else None
        if self.hybrid:
            _log_lookup(self.options.lookup)
        #: adaptive drafting: how often each kind of candidate token gets accepted
        self.acceptance = TokenAcceptance(LEARNED_SOURCES)
        self.token_margin = self.options.token_margin_pct / 100

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, *args: Any, **kwargs: Any) -> list[list[int]]:
        # sampled_token_ids: [B][a_i + 1] committed this step; num_tokens_no_spec: [B];
        # token_ids_cpu: [B, max_model_len], row i valid up to num_tokens_no_spec[i]
        predictions = self.take_predictions()
        rooms = [self.draft_room(sampled, int(num_tokens_no_spec[i]), self.k, self.max_model_len)
                 for i, sampled in enumerate(sampled_token_ids)]  # 0: partial prefill, or full
        states: list[JacobiRequest | None] = [None] * len(rooms)
        if predictions is not None and self.hybrid:
            states = [self._request(predictions.req_ids[i], sampled) if rooms[i] else None
                      for i, sampled in enumerate(sampled_token_ids)]
        # sampled requests draft a fixed k from their own tokens: their samples depend on
        # their drafts, and a seeded request must sample the same whatever runs beside it
        fixed = [not self.options.adaptive or predictions is None
                 or predictions.req_ids[i] not in self.greedy for i in range(len(rooms))]
        drafts = [self._draft_fixed(i, sampled, room, state, predictions, num_tokens_no_spec,
                                    token_ids_cpu) if room and fixed[i] else EMPTY
                  for i, (sampled, room, state) in enumerate(
                      zip(sampled_token_ids, rooms, states, strict=True))]
        if not all(fixed):
            adaptive = [None if fixed[i] else state for i, state in enumerate(states)]
            if drafts_cost_time(len(rooms), self.options.knee_tokens, self.options.floor_tokens):
                self._draft_nothing(sampled_token_ids, adaptive, predictions,
                                    num_tokens_no_spec, token_ids_cpu)
            else:
                sized = self._draft_adaptive(sampled_token_ids, rooms, adaptive, predictions,
                                             num_tokens_no_spec, token_ids_cpu)
                drafts = [d if fixed[i] else sized[i] for i, d in enumerate(drafts)]
        for state, draft in zip(states, drafts, strict=True):
            if state is not None:
                state.last_drafted = len(draft)
        return [draft.tolist() for draft in drafts]

    def _draft_nothing(self, sampled_token_ids: list[list[int]],
                       states: list[JacobiRequest | None], predictions: VerifyPredictions,
                       num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray) -> None:
        """Adaptive drafting where drafts cost time
        (:func:`~vllm_cllm.sizing.cost_model.drafts_cost_time`): no drafts, and no candidates
        built for them. The suffix trees still take each request's committed tokens
        (:meth:`SuffixTreeLookup.follow`), so that its output is there for later requests
        (the numpy history gets them through :meth:`_request`)."""
        for i, (sampled, state) in enumerate(zip(sampled_token_ids, states, strict=True)):
            req_id = predictions.req_ids[i]
            if state is None or self.suffix is None or req_id is None:
                continue
            context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
            self.suffix.follow(req_id, req_id in self.greedy, context,
                               len(context) - len(sampled))

    def _draft_adaptive(self, sampled_token_ids: list[list[int]], rooms: list[int],
                        states: list[JacobiRequest | None], predictions: VerifyPredictions,
                        num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
                        ) -> list[np.ndarray]:
        """Per request the candidate whose tokens promise the most (:func:`best_candidate`),
        each token valued by :attr:`acceptance`; then every chosen candidate sized against
        the batch by the cost model (:func:`draft_lengths`)."""
        knee, floor = self.options.knee_tokens, self.options.floor_tokens
        chosen, values = [], []
        for i, (sampled, room, state) in enumerate(zip(sampled_token_ids, rooms, states,
                                                       strict=True)):
            if not room or state is None:
                chosen.append(EMPTY)
                values.append(())
                continue
            context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
            candidates, restart = self._candidates(i, sampled, room, predictions, context)
            cells = self.acceptance.cells(candidates, state.previous)
            state.candidates, state.cells = candidates, cells
            if len(restart):  # valued as the tail it buys (drafted after a miss); never counted
                candidates = {**candidates, MODEL_SOURCE: restart}
                cells = {**cells, **self.acceptance.cells({MODEL_SOURCE: restart}, MISSED)}
            value = self.acceptance.values(cells)
            name = best_candidate(value, knee, floor, self.token_margin)
            chosen.append(EMPTY if name is None else candidates[name])
            values.append(() if name is None else value[name])
        lengths = draft_lengths(values, rooms, knee, floor, token_margin=self.token_margin)
        return [draft[:n] for draft, n in zip(chosen, lengths, strict=True)]

    def _candidates(self, i: int, sampled: list[int], room: int, predictions: VerifyPredictions,
                    context: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Request ``i``'s candidates of :data:`LEARNED_SOURCES`, each at most ``room`` long,
        and, where it has no Jacobi tail, a restart block for the model.

        Without a tail (its last draft was accepted whole, or nothing was drafted) the model's
        block is restarted from the request's own tokens, as CLLM starts a block: never
        accepted itself, but the model's predictions behind it are next step's tail. It is
        valued as that tail (a tail of its length, drafted after a missed draft), and neither
        counted nor allowed to vote. Without it a checkpoint whose tail beats every lookup
        would stop drafting the first time a tail was accepted whole.
        """
        req_id = predictions.req_ids[i]
        tail = predictions.next_block(i, len(sampled))[:room]
        candidates = {"lookup": self._lookup(req_id, sampled, context, room),
                      "ngram": np.asarray(self.lookup(context, room), dtype=np.int64)}
        if len(tail):
            return {**candidates, MODEL_SOURCE: tail}, EMPTY
        return candidates, self.restart(context, room)

    def _lookup(self, req_id: str | None, sampled: list[int], context: np.ndarray, room: int
                ) -> np.ndarray:
        """What followed the context elsewhere: in the suffix trees (every request), or in the
        numpy history of earlier outputs (greedy requests only; see ``uses_history``)."""
        if self.suffix is not None and req_id is not None:
            return self.suffix.draft(req_id, req_id in self.greedy, context,
                                     len(context) - len(sampled), room)
        if self.uses_history(req_id):
            return self.history.continuation(context, room)
        return EMPTY

    def _draft_fixed(self, i: int, sampled: list[int], room: int, state: JacobiRequest | None,
                     predictions: VerifyPredictions | None, num_tokens_no_spec: np.ndarray,
                     token_ids_cpu: np.ndarray) -> np.ndarray:
        """Request ``i``'s draft of at most ``room`` tokens at a fixed k: the Jacobi tail plus
        the fill (``hybrid``: or the first other source in :data:`JACOBI_ORDER`)."""
        tail = predictions.next_block(i, len(sampled)) if predictions is not None else EMPTY
        context = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
        draft = next_draft(tail, context, room, self.fill, self.restart)
        if state is None:
            return draft
        req_id = predictions.req_ids[i] if predictions is not None else None
        usual, latest = (np.asarray(c, dtype=np.int64) for c in self.lookup.both(context, room))
        return state.sources.draft(draft, usual, context, tail, room, self.options.pool_size,
                                   self.options.ngram_max,
                                   self._lookup(req_id, sampled, context, room), latest)

    def _request(self, req_id: str, sampled: list[int]) -> JacobiRequest:
        """The request's state, updated with what the last step committed (``sampled``)."""
        state = self.request_state.get(req_id)
        if state is None:  # first step after prefill: nothing drafted yet, nothing to score
            state = self.request_state[req_id] = JacobiRequest()
        else:
            state.sources.update(sampled)
            state.previous = (HIT if len(sampled) > 1 else MISSED) if state.last_drafted \
                else UNDRAFTED
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
