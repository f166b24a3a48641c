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
