"""SPACE's drafts: candidates, then mask slots, in the 2k draft slots vLLM verifies.

Each step the draft is ``[c_1..c_m] + [MASK]×min(k, room − m)``. vLLM verifies it with plain
causal attention, so candidates never see the masks and verification is exactly the model's;
the masks are never accepted (the capture sets the mask logit to −inf before sampling) and
their KV is overwritten by the next step. The candidates are the mask rows after a full
acceptance, else the block (:class:`vllm_cllm.sources.masks.SpaceCandidates`); with
``scored``, each request drafts whichever of those and the fill alone has matched better
(:class:`vllm_cllm.policies.scores.SourceScores`, the mask rows starting optimistic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vllm_cllm.core.drafter import DraftSource
from vllm_cllm.core.requests import RequestState, RequestTable
from vllm_cllm.core.step import VerifyStep
from vllm_cllm.policies.fixed_order import gather
from vllm_cllm.policies.scores import SourceScores


@dataclass
class Slots:
    """A request's record (state part ``space``): its candidates among last step's drafts,
    and (``scored``) its source scores."""

    last_candidates: int
    scores: SourceScores | None


class MaskSlots:
    """Candidates of ``masks``/``block`` (and, ``scored``, ``ngram``), then up to ``k``
    masks of ``mask_id``."""

    part = "space"

    def __init__(self, k: int, mask_id: int, scored: bool) -> None:
        self.k, self.mask_id, self.scored = k, mask_id, scored

    def draft(self, step: VerifyStep, rows: Sequence[int], states: Sequence[RequestState],
              sources: Mapping[str, DraftSource]) -> list[np.ndarray]:
        rooms = [int(step.rooms[i]) for i in rows]
        found = gather(sources, ("masks", "block", "ngram"), step, rows, rooms, states)
        drafts = []
        for j, (i, state) in enumerate(zip(rows, states, strict=True)):
            ready = len(found["masks"][j]) > 0
            candidates = found["masks"][j] if ready else found["block"][j]
            record: Slots | None = state.parts.get(self.part)
            first = record is None or step.predictions is None or \
                len(step.predictions.row(i)) == 1
            if record is None:
                record = state.parts[self.part] = Slots(
                    0, SourceScores("masks") if self.scored else None)
            elif record.scores is not None:
                record.scores.update(step.committed[i])
            if record.scores is not None:
                # on the first step the candidates already are the fill alone
                named = {"ngram": candidates} if first else \
                    {"masks" if ready else "block": candidates, "ngram": found["ngram"][j]}
                candidates = record.scores.choose(named)
            record.last_candidates = len(candidates)
            masks = min(self.k, rooms[j] - len(candidates))
            drafts.append(np.concatenate([candidates, np.full(masks, self.mask_id,
                                                              dtype=np.int64)]))
        return drafts

    def mask_slots(self, req_ids: list[str], num_drafts: list[int], table: RequestTable
                   ) -> list[int]:
        """Each request's trailing mask slots in the step being verified: its drafts beyond
        last step's candidates."""
        slots = []
        for req_id, n in zip(req_ids, num_drafts, strict=True):
            state = table.get(req_id)
            record = state.parts.get(self.part) if state is not None else None
            slots.append(max(n - record.last_candidates, 0) if record is not None else 0)
        return slots
