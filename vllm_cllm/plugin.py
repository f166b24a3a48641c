"""Entry point of the ``vllm.general_plugins`` group: vLLM calls :func:`register` in every process.

Only front-end patches are applied here (cheap, no model-runner import). Worker patches are
applied by our proposers when a worker builds one (:mod:`vllm_cllm.patches.worker`). Both are
idempotent and all-or-nothing.
"""

from __future__ import annotations


def register() -> None:
    """Make ``"method": "jacobi"`` and ``--speculative-model "[jacobi]"`` known to vLLM."""
    from vllm_cllm.patches import ray_cpu, speculative_config

    speculative_config.patch_group().apply()
    if ray_cpu.enabled():  # opt-in: vLLM's Ray executor on the CPU build
        ray_cpu.patch_group().apply()
