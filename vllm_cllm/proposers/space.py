"""The ``space`` method's ``custom_class`` proposer (:mod:`vllm_cllm.methods.space`)."""

from __future__ import annotations

from typing import Any

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.methods.space import space_drafter
from vllm_cllm.options import ProposerOptions
from vllm_cllm.policies.mask_slots import MaskSlots
from vllm_cllm.proposers.base import SelfDraftingProposer


class SpaceProposer(SelfDraftingProposer):
    method = "space"

    def build_drafter(self, options: ProposerOptions, max_model_len: int) -> Drafter:
        self.mask_id = int(options.mask_token_id)
        return space_drafter(options, max_model_len)

    def mask_slots(self, req_ids: list[str], num_drafts: list[int]) -> list[int]:
        slots: MaskSlots = self.drafter.policies[0]  # type: ignore[assignment]
        return slots.mask_slots(req_ids, num_drafts, self.drafter.table)

    def observe_verification(self, logits: Any, spec_decode_metadata: Any,
                             req_ids: list[str]) -> None:
        """Never emit MASK: its logit is −inf at every verified position, then capture."""
        if logits.shape[-1] > self.mask_id:
            logits[:, self.mask_id] = float("-inf")
        super().observe_verification(logits, spec_decode_metadata, req_ids)
