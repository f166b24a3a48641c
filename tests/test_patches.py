"""Patches wrap (never copy), are idempotent, and are applied all-or-nothing."""

from __future__ import annotations

import pytest

from vllm_cllm.errors import UnsupportedVllmError
from vllm_cllm.patches import PatchGroup, Wrap


class Toy:
    def method(self, x, **kwargs):
        return ("orig", x, kwargs)

    @staticmethod
    def static(x):
        return x + 1


def _tagging(original):
    def wrapper(*args, **kwargs):
        return ("wrapped", original(*args, **kwargs))
    return wrapper


def test_wrap_calls_original_and_passes_unknown_kwargs():
    class T(Toy):
        pass
    T.method = Toy.method
    group = PatchGroup("toy", wraps=[Wrap(T, "method", _tagging)])
    group.apply()
    assert T().method(1, new_kwarg=2) == ("wrapped", ("orig", 1, {"new_kwarg": 2}))


def test_wrap_is_idempotent_and_keeps_staticmethods():
    class T:
        static = Toy.__dict__["static"]
    group = PatchGroup("toy", wraps=[Wrap(T, "static", _tagging)])
    group.apply()
    group.apply()
    assert T.static(1) == ("wrapped", 2)  # wrapped once, still callable on the class
    assert isinstance(T.__dict__["static"], staticmethod)


def test_failed_probe_patches_nothing_and_names_version_and_piece():
    class T:
        def method(self):
            return "orig"
    group = PatchGroup("toy", probes=[("ok", lambda: True), ("Toy.missing_hook", lambda: False)],
                       wraps=[Wrap(T, "method", _tagging)])
    with pytest.raises(UnsupportedVllmError) as err:
        group.apply()
    assert "Toy.missing_hook" in str(err.value) and "vLLM" in str(err.value)
    assert T().method() == "orig"
    assert not group.is_applied()


def test_register_twice_wraps_vllm_once():
    from vllm.engine.arg_utils import EngineArgs

    from vllm_cllm.patches.worker import apply_worker_patches
    from vllm_cllm.plugin import register

    register()
    register()
    apply_worker_patches()
    apply_worker_patches()
    wrapped = EngineArgs.create_speculative_config
    assert getattr(wrapped, "__vllm_cllm_patch__", False)
    assert not getattr(wrapped.__wrapped__, "__vllm_cllm_patch__", False)
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    assert not getattr(GPUModelRunner._sample.__wrapped__, "__vllm_cllm_patch__", False)


def test_entry_point_is_registered():
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("vllm_cllm") == "vllm_cllm.plugin:register"


def test_ray_on_cpu_is_opt_in_and_keeps_the_users_runtime_env(monkeypatch):
    from vllm_cllm.patches import ray_cpu

    monkeypatch.delenv(ray_cpu.ENV_FLAG, raising=False)
    assert not ray_cpu.enabled()
    monkeypatch.setenv(ray_cpu.ENV_FLAG, "1")
    assert ray_cpu.enabled()  # this machine runs the CPU platform
    env = ray_cpu._with_setup_hook({"env_vars": {"A": "1"}})
    assert env == {"env_vars": {"A": "1"}, "worker_process_setup_hook": ray_cpu.SETUP_HOOK}
    mine = {"worker_process_setup_hook": "my.hook"}
    assert ray_cpu._with_setup_hook(mine) == mine
    assert ray_cpu.patch_group().missing() == []


def test_a_step_without_drafts_is_sampled_plainly_only_for_our_drafters():
    """``patches/undrafted_step.py``: no draft token in the step and one of our drafters →
    no spec-decode metadata (vLLM's plain sampler); otherwise vLLM's result untouched."""
    from types import SimpleNamespace

    from fakes import jacobi

    from vllm_cllm.patches import undrafted_step

    assert undrafted_step.patch_group().missing() == []  # the installed vLLM has the hooks
    metadata = SimpleNamespace(num_draft_tokens=[0, 0])
    wrapped = undrafted_step._wrap_prepare_inputs(
        lambda self, scheduler_output, n: ("indices", metadata, 1, n))
    ours, theirs = SimpleNamespace(drafter=jacobi()), SimpleNamespace(drafter=object())
    undrafted = SimpleNamespace(scheduled_spec_decode_tokens={})
    drafted = SimpleNamespace(scheduled_spec_decode_tokens={"r0": [5, 6]})
    assert wrapped(ours, undrafted, 2) == ("indices", None, 1, 2)
    assert wrapped(ours, drafted, 2) == ("indices", metadata, 1, 2)
    assert wrapped(theirs, undrafted, 2) == ("indices", metadata, 1, 2)


def _greedy_batch(drafts: list[list[int]], vocab: int, seed: int, **overrides):
    """A verify step as vLLM's runner hands it to the rejection sampler: random logits whose
    argmax each draft follows for a random number of positions, the spec-decode metadata of
    ``drafts`` (rows request after request, its drafts then its bonus row) and all-greedy
    sampling metadata (``overrides`` replace its fields)."""
    from dataclasses import replace

    import numpy as np
    import torch
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    rng = np.random.default_rng(seed)
    rows = sum(len(d) + 1 for d in drafts)
    logits = torch.from_numpy(rng.standard_normal((rows, vocab)).astype(np.float32))
    argmax = logits.argmax(-1).numpy()
    target, bonus, row = [], [], 0
    for d in drafts:
        follows = rng.integers(0, len(d) + 1)  # drafts up to here are the target's argmax
        for j in range(len(d)):
            d[j] = int(argmax[row + j]) if j < follows else int((argmax[row + j] + 1) % vocab)
            target.append(row + j)
        bonus.append(row + len(d))
        row += len(d) + 1
    num = [len(d) for d in drafts]
    as_tensor = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    metadata = SpecDecodeMetadata(
        draft_token_ids=as_tensor([t for d in drafts for t in d]), num_draft_tokens=num,
        cu_num_draft_tokens=as_tensor(np.cumsum(num)),
        cu_num_sampled_tokens=as_tensor(np.cumsum([n + 1 for n in num])),
        target_logits_indices=as_tensor(target), bonus_logits_indices=as_tensor(bonus),
        logits_indices=as_tensor(range(rows)))
    batch = len(drafts)
    sampling = SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in drafts],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    return logits, metadata, replace(sampling, **overrides)


def test_an_all_greedy_step_is_verified_from_the_captured_argmax_as_vllm_verifies_it():
    """``patches/greedy_verify.py``: with the capture's argmax handed over, every request
    commits what vLLM's rejection sampler commits (rejected at the first draft, in the
    middle, accepted whole with its bonus token, no drafts); without it, or where the batch
    is not verified against the raw logits, vLLM's sampler runs (same output)."""
    import numpy as np
    import torch
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from vllm_cllm.kernels.fixed_point import row_argmax
    from vllm_cllm.patches import greedy_verify

    assert greedy_verify.patch_group().missing() == []
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.register_triton_kernel_overrides()  # vLLM's CPU kernels, as its worker does
    calls = []

    def original(self, *args):
        calls.append(args)
        return RejectionSampler.forward(self, *args)

    forward = greedy_verify._wrap_forward(original)
    sampler = RejectionSampler(Sampler())
    for seed in range(20):
        rng = np.random.default_rng(seed)
        drafts = [[0] * int(rng.integers(0, 7)) for _ in range(int(rng.integers(1, 6)))]
        logits, metadata, sampling = _greedy_batch(drafts, vocab=64, seed=seed)
        expected = RejectionSampler.forward(sampler, metadata, None, logits.clone(), sampling)
        with greedy_verify.handing(sampler, row_argmax(logits).numpy()):
            calls.clear()
            got = forward(sampler, metadata, None, logits.clone(), sampling)
            assert calls == []  # verified from the argmax
            assert got.logprobs_tensors is None
            assert torch.equal(got.sampled_token_ids, expected.sampled_token_ids)
            assert got.sampled_token_ids.dtype == expected.sampled_token_ids.dtype
    # a batch not verified against the raw logits, or no argmax handed: vLLM's own path
    to_vllm = greedy_verify._wrap_forward(lambda self, *args: "vllm")
    logits, metadata, _ = _greedy_batch([[0, 0, 0], [0]], vocab=64, seed=1)
    for overrides in ({"all_greedy": False, "temperature": torch.zeros(2)},
                      {"no_penalties": False}, {"max_num_logprobs": 0},
                      {"bad_words_token_ids": {0: [[3]]}}):
        sampling = _greedy_batch([[0, 0, 0], [0]], vocab=64, seed=1, **overrides)[2]
        assert not greedy_verify.raw_targets(sampling)
        with greedy_verify.handing(sampler, row_argmax(logits).numpy()):
            assert to_vllm(sampler, metadata, None, logits, sampling) == "vllm"
    sampling = _greedy_batch([[0, 0, 0], [0]], vocab=64, seed=1)[2]
    assert sampler.__dict__.get(greedy_verify._ARGMAX) is None
    assert to_vllm(sampler, metadata, None, logits, sampling) == "vllm"


def test_the_capture_hands_over_an_argmax_only_for_a_step_with_drafts():
    """``host_argmax``: the capture's host argmax of every row of a drafting step; nothing for
    a step without drafts (its predictions hold no argmax) or for another step's row count."""
    from fakes import jacobi, logits_for, metadata

    proposer = jacobi()
    logits = logits_for([5, 6, 7, 8, 9])
    proposer.observe_verification(logits, metadata([[5, 1], [8]]), ["a", "b"])
    assert proposer.host_argmax(5).tolist() == [5, 6, 7, 8, 9]
    assert proposer.host_argmax(4) is None
    proposer.observe_verification(logits_for([3, 4]), metadata([[], []]), ["a", "b"])
    assert proposer.host_argmax(2) is None
