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

from vllm_cllm.capture import VerifyObserver
from vllm_cllm.fill import Fill, NgramFill, RandomContextFill, make_fill
from vllm_cllm.options import ProposerOptions, options_from_vllm_config

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


#: Below this expected match length the Jacobi draft is cut to a short probe: verifying k
#: tokens that are almost never accepted costs time (the base model's tail is ~5 % right),
#: while a probe keeps measuring the tail (a CLLM's tail scores far above it).
PROBE_BELOW = 0.5
PROBE_TOKENS = 2


@dataclass
class HybridState:
    """Per-request record of how well each draft source has predicted committed tokens.

    The Jacobi score starts optimistic so that a CLLM's tail is drafted in full at once.
    """

    jacobi_score: float = 1.0
    ngram_score: float = 0.0
    last_jacobi: np.ndarray = field(default_factory=lambda: _EMPTY)
    last_ngram: np.ndarray = field(default_factory=lambda: _EMPTY)

    def update(self, committed: list[int], decay: float = 0.7) -> None:
        """Score each source on the steps where it proposed something.

        A step where the n-gram lookup found no match says nothing about how good its matches
        are; counting it as 0 would hand the draft to the Jacobi tail right when a match shows up.
        """
        if len(self.last_jacobi):
            self.jacobi_score = decay * self.jacobi_score + (1 - decay) * matched_prefix(
                self.last_jacobi, committed)
        if len(self.last_ngram):
            self.ngram_score = decay * self.ngram_score + (1 - decay) * matched_prefix(
                self.last_ngram, committed)

    def choose(self, jacobi: np.ndarray, ngram: np.ndarray) -> np.ndarray:
        self.last_jacobi, self.last_ngram = jacobi, ngram
        if len(ngram) and self.ngram_score >= self.jacobi_score:
            return ngram
        return jacobi if self.jacobi_score >= PROBE_BELOW else jacobi[:PROBE_TOKENS]


class JacobiProposer(VerifyObserver):
    """vLLM ``custom_class`` proposer; constructed in each worker as ``Class(vllm_config)``."""

    def __init__(self, vllm_config: Any) -> None:
        super().__init__()
        from vllm_cllm.plugin import apply_worker_patches

        apply_worker_patches()
        self.options: ProposerOptions = options_from_vllm_config(vllm_config, "jacobi")
        self.k = self.options.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.restart = RandomContextFill(self.options.seed)
        if self.options.fill == "hybrid":
            self.fill: Fill = NgramFill(self.options.ngram_min, self.options.ngram_max,
                                        self.max_model_len)
        else:
            self.fill = make_fill(self.options, self.max_model_len)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, *args: Any, **kwargs: Any) -> list[list[int]]:
        predictions = self.take_predictions()
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            num_tokens = int(num_tokens_no_spec[i])
            room = self.draft_room(sampled, num_tokens, self.k, self.max_model_len)
            if room == 0:
                drafts.append([])  # partial prefill, or nothing fits before max_model_len
                continue
            tail = predictions.row(i)[len(sampled):] if predictions is not None else _EMPTY
            context = token_ids_cpu[i, :num_tokens]
            draft = next_draft(tail, context, room, self.fill, self.restart)
            if self.options.fill == "hybrid" and predictions is not None:
                draft = self._hybrid(predictions.req_ids[i], sampled, draft, context, room)
            drafts.append(draft.tolist())
        return drafts

    def _hybrid(self, req_id: str, sampled: list[int], jacobi: np.ndarray,
                context: np.ndarray, room: int) -> np.ndarray:
        state = self.request_state.get(req_id)
        if state is None:
            state = self.request_state[req_id] = HybridState()
        else:
            state.update(sampled)
        return state.choose(jacobi, np.asarray(self.fill(context, room), dtype=np.int64))
