"""Worker patch: a step in which no request drafted is sampled as plain decoding is.

vLLM 0.32 sends every step of an engine with a speculative config through the rejection
sampler, also when no request has a draft (its ``_prepare_inputs`` tests for the config, not
for drafts). Adaptive ``jacobi`` at a large batch drafts in few steps, and there the spec-decode
path is pure overhead (docs/results.md, step profile). After the original
``_prepare_inputs`` has run, a step with no draft token in it gets
``spec_decode_metadata = None``, which sends ``_sample`` to vLLM's plain sampler.

Lossless: with no drafts, the rejection sampler's output is its bonus tokens, drawn by the
same ``Sampler`` on the same rows (the logits indices of a zero-draft step are each request's
last position in both paths; spec tokens, which the bonus path would add to penalties, are
empty), so greedy and seeded outputs are unchanged. Only engines whose drafter is one of this
project's are affected.
"""

from __future__ import annotations

from typing import Any

from . import PatchGroup, Wrap, has_params
from .verify_capture import observer_of


def _wrap_prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, *args: Any, **kwargs: Any):
        result = original(self, scheduler_output, *args, **kwargs)
        metadata = result[1]
        if metadata is not None and not scheduler_output.scheduled_spec_decode_tokens \
                and observer_of(self) is not None:
            return (result[0], None, *result[2:])
        return result

    return _prepare_inputs


def patch_group() -> PatchGroup:
    import inspect

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def returns_metadata_second() -> bool:
        """``_prepare_inputs`` returns (logits_indices, spec_decode_metadata, ...)."""
        source = inspect.getsource(GPUModelRunner._prepare_inputs)
        return "tuple[logits_indices, spec_decode_metadata" in source

    def samples_plain_without_metadata() -> bool:
        return "if spec_decode_metadata is None:" in inspect.getsource(GPUModelRunner._sample)

    return PatchGroup(
        name="undrafted-step",
        probes=[
            ("GPUModelRunner._prepare_inputs(scheduler_output)",
             lambda: has_params(GPUModelRunner._prepare_inputs, "scheduler_output")),
            ("GPUModelRunner._prepare_inputs returns spec_decode_metadata second",
             returns_metadata_second),
            ("GPUModelRunner._sample samples plainly without spec_decode_metadata",
             samples_plain_without_metadata),
        ],
        wraps=[Wrap(GPUModelRunner, "_prepare_inputs", _wrap_prepare_inputs)],
    )
