"""``space``: a SPACE checkpoint verifies and drafts in one forward pass, its mask rows
predicting the tokens after each fully accepted draft (:mod:`vllm_cllm.policies.mask_slots`).
The ``fill`` decides what is drafted when the mask rows cannot be used: ``hybrid`` (the
default) scores the block against the request's n-grams, ``ngram`` drafts n-grams, ``tail``
the Jacobi tail completed by n-grams, ``masks`` nothing but masks (always fully accepted, so
the next step has mask rows again). Greedy requests' n-grams fall back to earlier outputs.
"""

from __future__ import annotations

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.core.requests import RequestTable
from vllm_cllm.options import ProposerOptions
from vllm_cllm.policies.mask_slots import MaskSlots
from vllm_cllm.sources.history import HistoryFill, HistorySource, OutputHistory
from vllm_cllm.sources.masks import SpaceCandidates
from vllm_cllm.sources.ngram import Fill, NgramFill, NoFill


def space_drafter(options: ProposerOptions, max_model_len: int) -> Drafter:
    k, fill = options.num_speculative_tokens, options.fill
    ngrams = NgramFill(options.ngram_min, options.ngram_max, max_model_len)
    history = OutputHistory(options.history_in_use)
    own: Fill = NoFill() if fill == "masks" else ngrams
    greedy = own if fill == "masks" else HistoryFill(ngrams, history)
    table = RequestTable()
    table.subscribe(HistorySource(history), wants_output=history.size > 0)
    candidates = SpaceCandidates(k, fill in ("tail", "hybrid"), own, greedy,
                                 fill_alone=fill == "hybrid")
    return Drafter([candidates], [MaskSlots(k, int(options.mask_token_id), fill == "hybrid")],
                   table=table)
