"""The ``space`` proposer: a SPACE checkpoint verifies and drafts in one forward pass.

Each step the draft is ``[c_1..c_m] + [MASK]×min(k, 2k − m)``, in the 2k draft slots vLLM
gives ``space``. vLLM verifies it with plain causal attention, so candidates never see the
masks and verification is exactly the model's; the masks are never accepted (the mask logit
is set to −inf before sampling, so MASK is never emitted) and their KV is overwritten by the
next step.

Next candidates, from the shared capture (row ``j`` = the target's prediction after the
j-th scheduled token, ``t0`` being 0):

* all ``m`` candidates accepted: ``M_1`` sits at the bonus token's position, so the
  predictions at ``M_1..M_k`` are SPACE's guesses for the k tokens after the bonus —
  exactly the semi-autoregressive training target (:mod:`vllm_cllm.training.space`);
* otherwise (``a < m``): the masks saw a rejected candidate. ``fill`` decides: ``ngram``
  an n-gram continuation from the request's own tokens, else from earlier requests' outputs
  (``history_size``), else no candidates; ``masks`` no
  candidates — a masks-only draft is always fully accepted, so the next step has mask
  candidates again; ``tail`` the Jacobi tail (predictions behind ``c_{a+1}..c_m``) completed
  by n-grams;
* no draft last step (first decode step after prefill): as after a rejection.

Candidates from the mask rows are k; those from the tail and the n-gram/history lookup may
fill all 2k slots (m up to 2k, masks only in the slots left): an answer that repeats an
earlier phrase is drafted as far as the match goes, at no extra verify width.

``hybrid`` (the default) scores three sources per request on how well each matched the
committed tokens, as ``jacobi``'s hybrid fill does: the mask rows (after a full acceptance),
the Jacobi tail completed by n-grams (after a rejection) and an n-gram lookup alone; the
best-scoring source that has a draft is drafted. The n-gram lookup falls back to earlier
requests' outputs (``history_size``). Why these rules: docs/decisions.md.

vLLM's acceptance *rate* counters count the mask slots as drafts; acceptance *length*
(1 + accepted / drafts) is unaffected and is the tokens per verify step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_cllm.proposers.capture import SelfDraftingProposer, shifted_block
from vllm_cllm.proposers.drafting import EMPTY, MODEL_SOURCE, SourceScores, next_draft
from vllm_cllm.sources.history import HistoryFill
from vllm_cllm.sources.ngram import Fill, NgramFill, NoFill


def next_candidates(row: np.ndarray, num_sampled: int, last_candidates: int | None, k: int,
                    context: np.ndarray, fill: Fill, use_tail: bool = True,
                    block: np.ndarray | None = None, fill_tokens: int | None = None
                    ) -> np.ndarray:
    """The next step's candidates from last step's predictions (see the module docstring):
    k from the mask rows, else up to ``fill_tokens`` (default k) from the tail and ``fill``.

    ``row``: predictions after each scheduled token (length = drafts + 1); ``num_sampled``:
    tokens vLLM committed (accepted + 1); ``last_candidates``: candidates among last step's
    drafts (None: not drafted by us, e.g. vLLM's placeholder drafts). ``block``: the
    fixed-point step's next block for this request (mask rows after a full acceptance, else
    the Jacobi tail of the candidates), computed on the device by the capture; derived from
    ``row`` when not given. When the mask slots cannot be used: the Jacobi tail (if
    ``use_tail``) completed by ``fill``; empty means a masks-only draft, which is always fully
    accepted and so re-synchronises the masks.
    """
    drafts = len(row) - 1
    fill_tokens = k if fill_tokens is None else fill_tokens
    if drafts == 0 or last_candidates is None:
        return next_draft(EMPTY, context, fill_tokens, fill, NoFill())
    if block is None:
        block = shifted_block(row, num_sampled, drafts - min(last_candidates, drafts))
    if mask_rows_ready(drafts, num_sampled, last_candidates):
        return np.asarray(block[:k], dtype=np.int64)
    return next_draft(block if use_tail else EMPTY, context, fill_tokens, fill, NoFill())


def mask_rows_ready(drafts: int, num_sampled: int, last_candidates: int | None) -> bool:
    """Whether last step's mask rows predict the tokens after the bonus: every candidate
    was accepted and mask slots followed them."""
    if drafts == 0 or last_candidates is None:
        return False
    m = min(last_candidates, drafts)
    return num_sampled - 1 >= m and drafts > m


@dataclass
class SpaceRequest:
    """Per-request state, dropped when the request leaves the batch: how many candidates
    (before the masks) were drafted last step, the ``hybrid`` fill's source scores, and
    (with a history) the tokens committed so far, which join the proposer's history once it
    leaves."""

    last_candidates: int
    scores: SourceScores | None  # only with fill=hybrid
    output: list[int] = field(default_factory=list)


class SpaceProposer(SelfDraftingProposer):
    """vLLM ``custom_class`` proposer for SPACE checkpoints (``Class(vllm_config)`` per worker)."""

    method = "space"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.mask_id = int(self.options.mask_token_id)
        # when the mask slots cannot be used (see next_candidates): masks only (masks),
        # n-grams alone (ngram) or the Jacobi tail completed by n-grams (tail, hybrid); hybrid
        # also scores, per request, those candidates against n-grams alone
        policy = self.options.fill
        self.use_tail = policy in ("tail", "hybrid")
        ngram = NgramFill(self.options.ngram_min, self.options.ngram_max, self.max_model_len)
        #: the fill of a sampled request, and of a greedy one (which may also draft from
        #: earlier requests' outputs: see ``uses_history``)
        self.own_fill: Fill = NoFill() if policy == "masks" else ngram
        self.greedy_fill: Fill = self.own_fill if policy == "masks" else HistoryFill(
            ngram, self.history)
        self.scored = policy == "hybrid"

    def mask_slots(self, req_ids: list[str], num_drafts: list[int]) -> list[int]:
        """Each request's trailing mask slots: its drafts beyond last step's candidates."""
        slots = []
        for req_id, n in zip(req_ids, num_drafts, strict=True):
            state = self.request_state.get(req_id)
            slots.append(max(n - state.last_candidates, 0) if state is not None else 0)
        return slots

    def _sources(self, candidates: np.ndarray, row: np.ndarray, num_sampled: int,
                 last_candidates: int | None, context: np.ndarray, fill: Fill,
                 fill_tokens: int) -> dict[str, np.ndarray]:
        """The ``hybrid`` rule's named sources: this step's candidates are the mask rows
        (``model``) or the Jacobi tail completed by n-grams (``tail``), each against the
        n-gram lookup alone; on the first step after prefill the candidates already are
        that lookup."""
        if last_candidates is None or len(row) == 1:
            return {"ngram": candidates}
        name = MODEL_SOURCE if mask_rows_ready(len(row) - 1, num_sampled,
                                               last_candidates) else "tail"
        return {name: candidates, "ngram": np.asarray(fill(context, fill_tokens), np.int64)}

    def observe_verification(self, logits: Any, spec_decode_metadata: Any,
                             req_ids: list[str]) -> None:
        """Never emit MASK: its logit is −inf at every verified position, then capture."""
        if logits.shape[-1] > self.mask_id:
            logits[:, self.mask_id] = float("-inf")
        super().observe_verification(logits, spec_decode_metadata, req_ids)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, *args: Any, **kwargs: Any) -> list[list[int]]:
        predictions = self.take_predictions()
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            num_tokens = int(num_tokens_no_spec[i])
            room = self.draft_room(sampled, num_tokens, 2 * self.k, self.max_model_len)
            req_id = predictions.req_ids[i] if predictions is not None else None
            if room == 0:
                drafts.append([])  # partial prefill, or nothing fits before max_model_len
                continue
            row = predictions.row(i) if predictions is not None else np.zeros(1, np.int64)
            context = token_ids_cpu[i, :num_tokens]
            state = self.request_state.get(req_id)
            k = min(self.k, room)
            block = predictions.next_block(i, len(sampled)) if predictions is not None else None
            last_candidates = state.last_candidates if state else None
            fill = self.greedy_fill if self.uses_history(req_id) else self.own_fill
            candidates = next_candidates(row, len(sampled), last_candidates, k, context,
                                         fill, self.use_tail, block, fill_tokens=room)
            if state is None:
                state = SpaceRequest(0, SourceScores() if self.scored else None)
            elif state.scores is not None:
                state.scores.update(sampled)
            if state.scores is not None:
                candidates = state.scores.choose(self._sources(
                    candidates, row, len(sampled), last_candidates, context, fill, room))
            state.last_candidates = len(candidates)
            if self.history.size:
                state.output.extend(sampled)
            if req_id is not None:
                self.request_state[req_id] = state
            # a lookup or the tail may have used every slot (room); masks take what is left
            masks = min(self.k, room - len(candidates))
            drafts.append(candidates.tolist() + [self.mask_id] * masks)
        return drafts
