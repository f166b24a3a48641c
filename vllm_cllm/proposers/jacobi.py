"""The ``jacobi`` method's ``custom_class`` proposer (:mod:`vllm_cllm.methods.jacobi`)."""

from __future__ import annotations

from vllm_cllm.core.drafter import Drafter
from vllm_cllm.methods.jacobi import jacobi_drafter
from vllm_cllm.options import ProposerOptions
from vllm_cllm.policies.candidate_log import CandidateLog
from vllm_cllm.proposers.base import SelfDraftingProposer


class JacobiProposer(SelfDraftingProposer):
    method = "jacobi"

    def build_drafter(self, options: ProposerOptions, max_model_len: int) -> Drafter:
        if options.fill == "hybrid":
            _log_lookup(options.lookup)
        drafter = jacobi_drafter(options, max_model_len)
        log = CandidateLog.from_env()  # VLLM_CLLM_CANDIDATE_LOG: every policy logs its steps
        if log is not None:
            for policy in drafter.policies:
                if hasattr(policy, "recorder"):
                    policy.recorder = log
        return drafter


def _log_lookup(lookup: str) -> None:
    """Say where ``hybrid`` looks up earlier text: the default depends on what is installed."""
    from vllm_cllm.proposers.base import _info
    from vllm_cllm.sources.suffix_trees import suffix_tree_missing

    if lookup == "suffix":
        _info("jacobi looks up earlier text in arctic-inference's suffix trees")
    else:
        _info(f"jacobi looks up earlier text in its numpy output history "
              f"({suffix_tree_missing() or 'as configured'})")
