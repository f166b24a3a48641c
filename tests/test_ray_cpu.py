"""vLLM's own Ray executor on the CPU build with `jacobi` (opt-in ``VLLM_CLLM_RAY_ON_CPU=1``).

A local Ray cluster on 127.0.0.1 declares ``vllm_cpu_worker`` slots; engines run in their own
interpreter with ``distributed_executor_backend="ray"``, TP=1 and TP=2, and must equal plain
TP=1 greedy with the proposer drafting exactly as it does without Ray.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_cllm.bench.lossless import compare
from vllm_cllm.bench.measure import measure_in_subprocess
from vllm_cllm.patches.ray_cpu import ENV_FLAG, RESOURCE

pytest.importorskip("ray")
pytestmark = pytest.mark.engine

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,"]
# fixed k: the tiny random model gives the adaptive rule nothing worth drafting
JACOBI = {"method": "jacobi", "num_speculative_tokens": 4, "adaptive": False}
PORT = 6391


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = str(Path(sys.executable).with_name("ray"))
    if not Path(ray).exists():
        ray = shutil.which("ray") or "ray"
    temp = tmp_path_factory.mktemp("ray")
    subprocess.run([ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port",
                    str(PORT), "--num-cpus", "2", "--resources", json.dumps({RESOURCE: 2}),
                    "--include-dashboard=false", "--disable-usage-stats",
                    f"--temp-dir={temp}"], check=True, capture_output=True)
    try:
        yield f"127.0.0.1:{PORT}"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True)


@pytest.fixture(scope="module")
def runs(tiny_path, ray_cluster):
    def run(spec, ray_tp: int | None = None):
        kwargs = {}
        if ray_tp is not None:
            kwargs = {"engine_overrides": {"distributed_executor_backend": "ray",
                                           "tensor_parallel_size": ray_tp},
                      "env": {ENV_FLAG: "1", "RAY_ADDRESS": ray_cluster,
                              "VLLM_CPU_OMP_THREADS_BIND": "|".join(["0-1"] if ray_tp == 1
                                                                    else ["0", "1"])}}
        return measure_in_subprocess(tiny_path, spec, {3: PROMPTS}, 32, **kwargs)[0]

    return {"plain": run(None), "jacobi": run(JACOBI),
            "ray tp1": run(JACOBI, ray_tp=1), "ray tp2": run(JACOBI, ray_tp=2)}


@pytest.mark.parametrize("config", ["ray tp1", "ray tp2"])
def test_jacobi_on_ray_equals_plain_greedy(runs, config):
    mismatches = compare(runs["plain"]["tokens"], runs[config]["tokens"])
    assert not mismatches, f"{config}: first mismatch {mismatches[0]}"
    assert runs[config]["num_drafts"] == runs["jacobi"]["num_drafts"] > 0


def test_trajectory_answers_on_ray_equal_the_single_machine_dataset(tiny_path, ray_cluster,
                                                                    tmp_path, monkeypatch):
    import ray

    from vllm_cllm.training.answers import generate_answers
    from vllm_cllm.training.trajectories import write_trajectories

    prompts = [f"Question {i}: what is {i} + {2 * i}?" for i in range(5)]
    local = generate_answers(tiny_path, prompts, 24, tmp_path / "local.answers.jsonl")
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster)
    try:
        on_ray = generate_answers(tiny_path, prompts, 24, tmp_path / "ray.answers.jsonl",
                                  ray_workers=2)
    finally:
        ray.shutdown()
    assert on_ray == local
    for name, items in (("local", local), ("ray", on_ray)):
        write_trajectories(tmp_path / f"{name}.jsonl", items, n=8, mode="noise", seed=1,
                           max_states=4)
    assert (tmp_path / "ray.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()
