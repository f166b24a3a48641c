"""The worker patches, applied by this project's proposers when a worker builds one (the only
place they matter), all-or-nothing."""

from __future__ import annotations


def apply_worker_patches() -> None:
    """Route verify logits to our proposers; raises UnsupportedVllmError if vLLM lacks a hook."""
    from . import apply_groups, cpu_expand_dtype, greedy_verify, undrafted_step, verify_capture

    groups = [verify_capture.patch_group(), undrafted_step.patch_group(),
              greedy_verify.patch_group()]
    if cpu_expand_dtype.needed():
        groups.append(cpu_expand_dtype.patch_group())
    apply_groups(groups)
