"""Worker patches: hand the verify step's logits to our proposers, and tell them who left.

``GPUModelRunner._sample`` (the V1 runner; vLLM's CPU runner inherits it) sees the logits of
every draft position of every request. Before calling the original we pass them, with the
``SpecDecodeMetadata`` and the row order, to the runner's drafter if it is one of ours
(:class:`vllm_cllm.proposers.base.SelfDraftingProposer`, marked ``vllm_cllm_observer``), then
call the original (where the capture's argmax is in host memory, handed to the rejection
sampler: :mod:`vllm_cllm.patches.greedy_verify`); other drafters are untouched.
``GPUModelRunner._update_states`` removes finished, aborted and preempted requests from the
input batch; after it runs, our drafter drops state of every request no longer in the batch
and learns which of the rest decode greedily (``InputBatch.greedy_reqs``), how many tokens
the step scheduled (``SchedulerOutput.total_num_scheduled_tokens``, for the measured step
cost) and, for a new request, its prompt length and ``max_tokens`` (the runner's
``CachedRequestState``, for a batch that drains).
"""

from __future__ import annotations

from typing import Any

from . import PatchGroup, Wrap, has_params
from .greedy_verify import handing


def observer_of(runner: Any) -> Any | None:
    """The runner's drafter if it is one of this project's proposers, else None (told by
    its class attribute ``vllm_cllm_observer``: the patches import no proposer)."""
    drafter = getattr(runner, "drafter", None)
    return drafter if getattr(type(drafter), "vllm_cllm_observer", False) else None


def _wrap_sample(original):
    def _sample(self, logits, spec_decode_metadata, *args: Any, **kwargs: Any):
        observer = observer_of(self)
        if observer is not None and logits is not None:
            # Before the original: sampling may rewrite the logits in place (temperature,
            # top-k/p masks, noise), and the draft must not depend on the sampler's randomness.
            observer.observe_verification(logits, spec_decode_metadata,
                                          list(self.input_batch.req_ids))
            # the argmax the capture took on the host verifies an all-greedy step
            # (patches/greedy_verify.py)
            with handing(getattr(self, "rejection_sampler", None),
                         observer.host_argmax(logits.shape[0])):
                return original(self, logits, spec_decode_metadata, *args, **kwargs)
        return original(self, logits, spec_decode_metadata, *args, **kwargs)

    return _sample


def _wrap_update_states(original):
    def _update_states(self, scheduler_output, *args: Any, **kwargs: Any):
        result = original(self, scheduler_output, *args, **kwargs)
        observer = observer_of(self)
        if observer is not None:
            observer.retain_requests(set(self.input_batch.req_ids),
                                     set(self.input_batch.greedy_reqs),
                                     scheduled_tokens=scheduler_output.total_num_scheduled_tokens,
                                     output_limit=lambda req_id: _output_limit(self, req_id))
        return result

    return _update_states


def _output_limit(runner: Any, req_id: str) -> tuple[int, int] | None:
    """The request's prompt tokens and ``max_tokens`` (None where it has none)."""
    state = runner.requests.get(req_id)
    params = getattr(state, "sampling_params", None)
    max_tokens = getattr(params, "max_tokens", None)
    if state is None or max_tokens is None:
        return None
    return int(state.num_prompt_tokens), int(max_tokens)


def patch_group() -> PatchGroup:
    import inspect

    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.spec_decode import metadata
    from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    fields = getattr(metadata.SpecDecodeMetadata, "__dataclass_fields__", {})
    return PatchGroup(
        name="verify-capture",
        probes=[
            ("GPUModelRunner._sample(logits, spec_decode_metadata)",
             lambda: has_params(GPUModelRunner._sample, "logits", "spec_decode_metadata")),
            ("GPUModelRunner._update_states(scheduler_output)",
             lambda: has_params(GPUModelRunner._update_states, "scheduler_output")),
            ("SpecDecodeMetadata.num_draft_tokens", lambda: "num_draft_tokens" in fields),
            ("SchedulerOutput.total_num_scheduled_tokens", lambda: "total_num_scheduled_tokens"
             in getattr(SchedulerOutput, "__dataclass_fields__", {})),
            ("InputBatch.greedy_reqs",
             lambda: "self.greedy_reqs" in inspect.getsource(InputBatch.__init__)),
            ("GPUModelRunner.requests of CachedRequestState(sampling_params, "
             "num_prompt_tokens)",
             lambda: "self.requests" in inspect.getsource(GPUModelRunner.__init__)
             and "sampling_params" in getattr(CachedRequestState, "__dataclass_fields__", {})
             and "self.num_prompt_tokens" in inspect.getsource(CachedRequestState)),
        ],
        wraps=[
            Wrap(GPUModelRunner, "_sample", _wrap_sample),
            Wrap(GPUModelRunner, "_update_states", _wrap_update_states),
        ],
    )
