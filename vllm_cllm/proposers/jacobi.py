"""The ``jacobi`` method's ``custom_class`` proposer (:mod:`vllm_cllm.methods.jacobi`)."""

from __future__ import annotations

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.methods.jacobi import jacobi_drafter
from vllm_cllm.options import ProposerOptions
from vllm_cllm.proposers.base import SelfDraftingProposer


class JacobiProposer(SelfDraftingProposer):
    method = "jacobi"

    def build_drafter(self, options: ProposerOptions, max_model_len: int) -> Drafter:
        return jacobi_drafter(options, max_model_len)
