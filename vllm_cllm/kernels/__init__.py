"""Device kernels of the verify step; torch and (optionally) Triton only, never vLLM.

Kept free of vLLM imports so they can be tested and timed on a machine with just torch/Triton.
"""

from vllm_cllm.kernels.fixed_point import (
    fixed_point_step,
    fixed_point_step_torch,
    resolve_backend,
    triton_available,
    warm_up,
)
from vllm_cllm.kernels.result import FixedPointResult

__all__ = [
    "FixedPointResult",
    "fixed_point_step",
    "fixed_point_step_torch",
    "resolve_backend",
    "triton_available",
    "warm_up",
]
