"""Selecting the proposer: three spellings, and bad input refused before any engine starts."""

from __future__ import annotations

import pytest

from vllm_cllm.errors import ConfigError
from vllm_cllm.options import ProposerOptions, parse_options


def test_defaults_and_valid_options():
    opts = parse_options({"method": "jacobi", "num_speculative_tokens": 8, "fill": "random",
                          "seed": 3}, max_k=128)
    assert opts == ProposerOptions(
        method="jacobi", num_speculative_tokens=8, fill="random", ngram_min=2, ngram_max=4,
        seed=3, adaptive=False, knee_tokens=24, floor_tokens=28, token_margin_pct=30,
        pool_size=8, history_size=16, lookup="history", mask_token_id=None,
        measure_cost=False, ngram_candidate=True, drain=True)
    assert not opts.adaptive  # other fills draft a fixed k
    adaptive = parse_options({"method": "jacobi", "num_speculative_tokens": 8,
                              "adaptive": True, "knee_tokens": 64}, max_k=128)
    assert adaptive.adaptive and adaptive.knee_tokens == 64
    defaults = parse_options({"method": "jacobi", "num_speculative_tokens": 8}, max_k=128)
    assert defaults.adaptive and defaults.fill == "hybrid"  # the recommended default
    fixed = parse_options({"method": "jacobi", "num_speculative_tokens": 8, "adaptive": False,
                           "pool_size": 4}, max_k=128)
    assert not fixed.adaptive and fixed.pool_size == 4
    assert (defaults.knee_tokens, defaults.floor_tokens) == (24, 28)  # the CPU platform's
    assert defaults.token_margin_pct == 30 and parse_options(
        {"method": "jacobi", "num_speculative_tokens": 8, "adaptive": True,
         "token_margin_pct": 0}, max_k=128).token_margin_pct == 0
    # the numpy history is kept only where the fill drafts from it
    assert opts.history_in_use == 0
    for name in ("history", "ngram"):  # "ngram": the earlier name of "history"
        assert parse_options({"method": "jacobi", "num_speculative_tokens": 8,
                              "lookup": name}, max_k=128).history_in_use == 16
    # arctic-inference is installed here: hybrid looks earlier text up in its suffix trees,
    # which keep the last 1024 outputs; the numpy history then keeps nothing
    assert (defaults.lookup, defaults.history_size, defaults.history_in_use) == \
        ("suffix", 1024, 0)
    assert parse_options({"method": "jacobi", "num_speculative_tokens": 8,
                          "history_size": 100000}, max_k=128).history_size == 100000
    masks = parse_options({"method": "space", "num_speculative_tokens": 4, "fill": "masks",
                           "mask_token_id": 3}, max_k=128)
    assert masks.history_in_use == 0


@pytest.mark.parametrize("spec, words", [
    ({"method": "jacobi", "num_speculative_tokens": 4, "fil": "ngram"},
     ["'fil'", "allowed", "fill"]),
    ({"method": "jacobi", "num_speculative_tokens": 0}, ["num_speculative_tokens", "[1, 128]"]),
    ({"method": "jacobi", "num_speculative_tokens": 129}, ["num_speculative_tokens", "[1, 128]"]),
    ({"method": "jacobi"}, ["needs num_speculative_tokens"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "magic"}, ["fill", "hybrid"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "ngram_min": 5, "ngram_max": 3},
     ["ngram_max", "[5, 64]"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "model": "some/draft"}, ["'model'"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": "yes"},
     ["adaptive", "true or false"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": True, "knee_tokens": 0},
     ["knee_tokens", "[1,"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": True, "floor_tokens": -1},
     ["floor_tokens", "[0,"]),
    # the cost model's options mean nothing without the adaptive rule: refused, not ignored
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": False, "knee_tokens": 32},
     ["knee_tokens", "adaptive"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "tail", "floor_tokens": 8},
     ["floor_tokens", "adaptive"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": False,
      "token_margin_pct": 50}, ["token_margin_pct", "adaptive"]),
    # adaptive drafting chooses among hybrid's candidates; the pool is a fixed-k source
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "ngram", "adaptive": True},
     ["adaptive", "'ngram'", "fixed k"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "pool_size": 4},
     ["pool_size", "fixed-k", "\"adaptive\": false"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "adaptive": True,
      "token_margin_pct": 1001}, ["token_margin_pct", "[0, 1000]"]),
    ({"method": "space", "num_speculative_tokens": 4, "adaptive": True,
      "mask_token_id": 3}, ["'adaptive'", "allowed"]),
    # options a fill does not use are refused, not silently dropped
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "ngram", "history_size": 8},
     ["history_size", "fill hybrid", "'ngram'"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "tail", "pool_size": 4},
     ["pool_size", "fill hybrid", "'tail'"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "fill": "ngram", "lookup": "suffix"},
     ["lookup", "fill hybrid", "'ngram'"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "lookup": "tree"},
     ["lookup", "suffix, history", "'tree'"]),
    ({"method": "jacobi", "num_speculative_tokens": 4, "lookup": "ngram", "history_size": 1000},
     ["history_size", "[0, 256]"]),
    ({"method": "space", "num_speculative_tokens": 4, "lookup": "suffix", "mask_token_id": 3},
     ["'lookup'", "allowed"]),
    ({"method": "space", "num_speculative_tokens": 4, "fill": "masks", "history_size": 8,
      "mask_token_id": 3}, ["history_size", "hybrid or ngram or tail", "'masks'"]),
])
def test_bad_options_name_the_option_and_allowed_values(spec, words):
    with pytest.raises(ConfigError) as err:
        parse_options(spec, max_k=128)
    for word in words:
        assert word in str(err.value)


def test_the_suffix_lookup_without_arctic_inference(monkeypatch):
    """Where arctic-inference is missing, hybrid falls back to the numpy lookups, and a user
    who asked for the suffix trees by name is told what to install."""
    from vllm_cllm.sources import suffix_trees as suffix_lookup

    monkeypatch.setattr(suffix_lookup, "suffix_tree_missing", lambda: "not installed (test)")
    fallback = parse_options({"method": "jacobi", "num_speculative_tokens": 8}, max_k=128)
    assert (fallback.lookup, fallback.history_in_use) == ("history", 16)
    with pytest.raises(ConfigError, match="lookup 'suffix' needs arctic-inference"):
        parse_options({"method": "jacobi", "num_speculative_tokens": 8, "lookup": "suffix"},
                      max_k=128)


def _engine_config(model: str, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, dtype="float32", max_model_len=512, enforce_eager=True,
                      **kwargs).create_engine_config()


def test_python_dict_selects_custom_class_with_options(tiny_path):
    config = _engine_config(tiny_path, speculative_config={
        "method": "jacobi", "num_speculative_tokens": 6, "fill": "tail"})
    spec = config.speculative_config
    assert spec.method == "custom_class" and spec.num_speculative_tokens == 6
    assert spec.model == "vllm_cllm.proposers.jacobi.JacobiProposer"
    assert config.additional_config["vllm_cllm"]["fill"] == "tail"


def test_bad_option_fails_at_config_time(tiny_path):
    with pytest.raises(ConfigError, match="unknown option"):
        _engine_config(tiny_path, speculative_config={"method": "jacobi",
                                                      "num_speculative_tokens": 4, "k": 3})


def test_vllm_keys_pass_through_or_are_refused_by_name(tiny_path):
    """Fields of this vLLM's SpeculativeConfig reach it untouched; a key it does not have
    (``disable_by_batch_size``, gone since vLLM 0.x) is refused before the engine starts."""
    config = _engine_config(tiny_path, speculative_config={
        "method": "jacobi", "num_speculative_tokens": 4, "max_model_len": 256})
    assert config.speculative_config.max_model_len == 256
    with pytest.raises(ConfigError, match=r"unknown option.*'disable_by_batch_size'.*"
                                          r"SpeculativeConfig"):
        _engine_config(tiny_path, speculative_config={
            "method": "jacobi", "num_speculative_tokens": 4, "disable_by_batch_size": 4})


def test_other_methods_are_untouched(tiny_path):
    config = _engine_config(tiny_path, speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
    assert config.speculative_config.method == "ngram"
    assert "vllm_cllm" not in (config.additional_config or {})


def _cli_engine_config(argv: list[str]):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(argv)
    return AsyncEngineArgs.from_cli_args(args).create_engine_config()


@pytest.mark.parametrize("flags", [
    ["--speculative-config", '{"method": "jacobi", "num_speculative_tokens": 5}'],
    ["--speculative-model", "[jacobi]", "--num-speculative-tokens", "5"],
    ["--spec-method", "jacobi", "--spec-tokens", "5"],
])
def test_cli_spellings(tiny_path, flags):
    config = _cli_engine_config(["--model", tiny_path, "--dtype", "float32",
                                 "--max-model-len", "512", *flags])
    assert config.speculative_config.method == "custom_class"
    assert config.speculative_config.num_speculative_tokens == 5
    assert config.additional_config["vllm_cllm"]["method"] == "jacobi"


def test_cli_k_out_of_range(tiny_path):
    with pytest.raises(ConfigError, match=r"\[1, 128\]"):
        _cli_engine_config(["--model", tiny_path, "--speculative-model", "[jacobi]",
                            "--num-speculative-tokens", "500"])


def test_model_runner_v2_is_refused_by_name(tiny_path, monkeypatch):
    """vLLM runs custom_class proposers only on its V1 model runner: with V2 selected the
    engine is refused before it starts, naming the setting."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ConfigError, match="VLLM_USE_V2_MODEL_RUNNER"):
        _engine_config(tiny_path, speculative_config={"method": "jacobi",
                                                      "num_speculative_tokens": 4})


def test_engine_helpers_use_float32_on_cpu_and_the_tests_dtype_everywhere(monkeypatch):
    """The helpers' platform settings: CPU-friendly here; the suite's dtype override (set by
    conftest for every engine, in-process or not) wins on any platform."""
    from vllm_cllm.runtime import engine

    monkeypatch.delenv(engine.DTYPE_ENV, raising=False)
    assert engine.platform_settings() == {"dtype": "float32", "enforce_eager": True,
                                          "distributed_executor_backend": "uni"}
    monkeypatch.setattr(engine, "on_cpu", lambda: False)
    assert engine.platform_settings() == {}  # vLLM's own defaults on a GPU
    monkeypatch.setenv(engine.DTYPE_ENV, "float32")
    assert engine.platform_settings() == {"dtype": "float32"}
