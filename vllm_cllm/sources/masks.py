"""SPACE's mask rows as a draft source.

A SPACE checkpoint verifies ``[c_1..c_m] + [MASK]×k`` in one forward pass: vLLM verifies the
candidates with plain causal attention, so they never see the masks, and the predictions at
the mask rows are the checkpoint's guesses for the tokens after the bonus token — when every
candidate was accepted. Otherwise the masks saw a rejected candidate, and the next
candidates are the Jacobi tail completed by a fill (:func:`next_candidates`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vllm_cllm.core.drafter import Candidates
from vllm_cllm.core.predictions import shifted_block
from vllm_cllm.core.requests import RequestState
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.core.tokens import EMPTY
from vllm_cllm.sources.ngram import Fill, NoFill
from vllm_cllm.sources.tail import completed_block


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
        return completed_block(EMPTY, context, fill_tokens, fill, NoFill())
    if block is None:
        block = shifted_block(row, num_sampled, drafts - min(last_candidates, drafts))
    if mask_rows_ready(drafts, num_sampled, last_candidates):
        return np.asarray(block[:k], dtype=np.int64)
    return completed_block(block if use_tail else EMPTY, context, fill_tokens, fill, NoFill())


def mask_rows_ready(drafts: int, num_sampled: int, last_candidates: int | None) -> bool:
    """Whether last step's mask rows predict the tokens after the bonus: every candidate
    was accepted and mask slots followed them."""
    if drafts == 0 or last_candidates is None:
        return False
    m = min(last_candidates, drafts)
    return num_sampled - 1 >= m and drafts > m


class SpaceCandidates:
    """Sources ``masks`` (the mask rows, after a full acceptance), ``block`` (otherwise: the
    Jacobi tail of the candidates completed by the fill, or the fill alone on the first step)
    and ``ngram`` (the fill alone, where the request has drafted before). Each request's
    candidates among last step's drafts are read from its state (``last_candidates``, part
    :attr:`part`: None before its first draft)."""

    names = ("masks", "block", "ngram")
    part = "space"

    def __init__(self, k: int, use_tail: bool, fill: Fill, greedy_fill: Fill,
                 fill_alone: bool = True) -> None:
        self.k, self.use_tail, self.fill_alone = k, use_tail, fill_alone
        #: the fill of a sampled request, and of a greedy one (which may also draft from
        #: earlier requests' outputs)
        self.fill, self.greedy_fill = fill, greedy_fill

    def propose(self, step: VerifyStep, rows: Sequence[int], lengths: Sequence[int],
                states: Sequence[RequestState]) -> Candidates:
        found: Candidates = {name: [] for name in self.names}
        for i, room, state in zip(rows, lengths, states, strict=True):
            predictions = step.predictions
            row = predictions.row(i) if predictions is not None else np.zeros(1, np.int64)
            block = predictions.next_block(i, len(step.committed[i])) \
                if predictions is not None else None
            record = state.parts.get(self.part)
            last = record.last_candidates if record is not None else None
            fill = self.greedy_fill if step.greedy[i] else self.fill
            context, num_sampled = step.context(i), len(step.committed[i])
            candidates = next_candidates(row, num_sampled, last, min(self.k, room), context,
                                         fill, self.use_tail, block, fill_tokens=room)
            ready = mask_rows_ready(len(row) - 1, num_sampled, last)
            first = last is None or len(row) == 1
            found["masks"].append(candidates if ready else EMPTY)
            found["block"].append(EMPTY if ready else candidates)
            found["ngram"].append(EMPTY if first or not self.fill_alone else
                                  np.asarray(fill(context, room), np.int64))
        return found
