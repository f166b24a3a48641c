"""Front-end patches: ``"method": "jacobi"`` and ``--speculative-model "[jacobi]"`` in vLLM.

vLLM has no proposer registry; its ``custom_class`` hook is the supported entry. We wrap
``EngineArgs.create_speculative_config`` to rewrite our method names into ``custom_class`` +
class path (after validating our options), and ``EngineArgs.add_cli_args`` to accept the
design card's spelling and our names in ``--spec-method``. Runs in the front-end process,
before any engine exists, so bad input fails there with a clear message.
"""

from __future__ import annotations

import argparse
import re
import typing
from dataclasses import dataclass
from typing import Any

from vllm_cllm.errors import ConfigError
from vllm_cllm.options import ADDITIONAL_CONFIG_KEY, METHODS, OWN_KEYS, parse_options

from . import PatchGroup, Wrap, has_params

_BRACKETED = re.compile(r"^\[(?P<name>[A-Za-z_][\w-]*)\]$")


@dataclass(frozen=True)
class Refusal:
    """Why a vLLM ``SpeculativeConfig`` field is refused with our methods, which of its values
    are fine (vLLM's lossless defaults; empty: any explicit value is refused), and a value that
    is refused (for tests and ``benchmarks/vllm_compat.py``)."""

    reason: str
    allowed: tuple[Any, ...]
    example: Any


_FLY = ("it tunes FLy, the lossy rejection_sample_method 'fly', which vllm-cllm refuses "
        "(remove it)")
_SYNTHETIC = ("it sets the acceptance rates of rejection_sample_method 'synthetic', which "
              "vllm-cllm refuses (remove it)")

#: vLLM fields that would make the output differ from the model's own, or that do nothing or
#: fail for a ``custom_class`` proposer, refused before any engine starts. Only the fields the
#: installed vLLM has are refused (:func:`refused_fields`); a field not listed passes through.
REFUSED_FIELDS: dict[str, Refusal] = {
    "rejection_sample_method": Refusal(
        "'synthetic' accepts drafts at set rates and 'fly' accepts some tokens the model "
        "would not emit, greedy requests included: the output would not be the model's own; "
        "use 'standard' (the default)", ("standard", "block"), "fly"),
    "synthetic_acceptance_rates": Refusal(_SYNTHETIC, (None,), [0.5]),
    "synthetic_acceptance_length": Refusal(_SYNTHETIC, (None,), 1.5),
    "fly_window_size": Refusal(_FLY, (), 2),
    "fly_entropy_threshold": Refusal(_FLY, (), 0.3),
    "fly_entropy_top_k": Refusal(_FLY, (), 3),
    "xpress_topc": Refusal(
        "it narrows the scoring of XPress drafters; vLLM ignores it for custom_class "
        "proposers, which jacobi and space are (remove it)", (None,), 8),
    "disable_lookahead_block_hashes": Refusal(
        "it changes prefix-cache hashes of EAGLE-like drafters only; vLLM ignores it for "
        "custom_class proposers, which jacobi and space are (remove it)", (False,), True),
    "draft_lm_head_quantization": Refusal(
        "it quantises the lm_head copy of EAGLE/MTP drafters (Model Runner V2 only); vLLM "
        "refuses it for custom_class proposers, which jacobi and space are (remove it)",
        (None,), "fp8"),
}


def refused_fields() -> dict[str, tuple[Any, str]]:
    """The refused fields this vLLM's ``SpeculativeConfig`` has: name -> (a refused value,
    the reason)."""
    present = speculative_config_fields()
    return {name: (r.example, r.reason) for name, r in REFUSED_FIELDS.items() if name in present}


def refuse_lossy_fields(spec: dict[str, Any], present: set[str] | None = None) -> None:
    """Raise ConfigError for the first field of ``spec`` in :data:`REFUSED_FIELDS` that the
    installed vLLM has (``present``: its SpeculativeConfig fields) and whose value is not
    one of the allowed ones."""
    present = speculative_config_fields() if present is None else present
    for name, refusal in REFUSED_FIELDS.items():
        if name in spec and name in present and not any(
                spec[name] == ok and type(spec[name]) is type(ok) for ok in refusal.allowed):
            raise ConfigError(
                f"vllm-cllm: {name}={spec[name]!r} is refused with method {spec['method']!r}: "
                f"{refusal.reason}")


def max_draft_tokens() -> int:
    """vLLM's per-request limit on verified draft tokens (MAX_SPEC_LEN of the rejection sampler)."""
    from vllm.v1.sample import rejection_sampler

    return int(rejection_sampler.MAX_SPEC_LEN)


def speculative_config_fields() -> set[str]:
    """The fields of this vLLM's ``SpeculativeConfig`` (our pass-through keys must be among
    them: vLLM's set changes between versions)."""
    from vllm.config.speculative import SpeculativeConfig

    fields = getattr(SpeculativeConfig, "__dataclass_fields__", None) or getattr(
        SpeculativeConfig, "model_fields", {})
    return set(fields)


def model_runner_v2() -> bool:
    """Whether this vLLM is told to use Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER``), which
    has no ``custom_class`` proposers."""
    import vllm.envs as envs

    return bool(getattr(envs, "VLLM_USE_V2_MODEL_RUNNER", False))


def _method_from_model(model: Any) -> str | None:
    """``"[jacobi]"`` → ``"jacobi"`` (the legacy spelling); anything else → None."""
    if isinstance(model, str):
        match = _BRACKETED.match(model.strip())
        if match and match.group("name") in METHODS:
            return match.group("name")
    return None


def rewrite_speculative_args(engine_args: Any, target_model_config: Any = None) -> None:
    """Turn our method names into vLLM's custom_class form, in place, or raise ConfigError.

    Handles ``speculative_config={"method": "jacobi", ...}``, ``--spec-method jacobi``,
    ``--speculative-model "[jacobi]"`` (stored as spec_model) and ``{"model": "[jacobi]"}``.
    """
    spec = dict(engine_args.speculative_config or {})
    spec = {k.replace("-", "_"): v for k, v in spec.items()}
    if engine_args.spec_method in METHODS:
        spec.setdefault("method", engine_args.spec_method)
        engine_args.spec_method = None
    legacy = _method_from_model(engine_args.spec_model)
    if legacy:
        spec.setdefault("method", legacy)
        engine_args.spec_model = None
    legacy = _method_from_model(spec.get("model"))
    if legacy:
        spec.setdefault("method", legacy)
        spec.pop("model")
    if spec.get("method") not in METHODS:
        return
    if model_runner_v2():
        from . import vllm_version

        raise ConfigError(
            f"vllm-cllm: method {spec['method']!r} is a custom_class proposer, which vLLM "
            f"{vllm_version()} runs only on its V1 model runner, but VLLM_USE_V2_MODEL_RUNNER=1 "
            f"selects Model Runner V2; unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)")
    if engine_args.spec_tokens is not None and "num_speculative_tokens" not in spec:
        spec["num_speculative_tokens"] = engine_args.spec_tokens
        engine_args.spec_tokens = None
    present = speculative_config_fields()
    refuse_lossy_fields(spec, present)
    vllm_keys = present - OWN_KEYS
    options = parse_options(spec, max_draft_tokens(),
                            getattr(target_model_config, "hf_config", None), vllm_keys)
    vllm_spec = {k: v for k, v in spec.items() if k in vllm_keys}
    vllm_spec.update(method="custom_class", model=METHODS[options.method],
                     num_speculative_tokens=options.vllm_draft_tokens)
    engine_args.speculative_config = vllm_spec
    extra = dict(engine_args.additional_config or {})
    extra[ADDITIONAL_CONFIG_KEY] = options.to_dict()
    engine_args.additional_config = extra


def _wrap_create_speculative_config(original):
    def create_speculative_config(self, *args: Any, **kwargs: Any):
        model_config = kwargs.get("target_model_config", args[0] if args else None)
        rewrite_speculative_args(self, model_config)
        return original(self, *args, **kwargs)

    return create_speculative_config


def _extend_parser(parser: argparse.ArgumentParser) -> None:
    """Add our names to --spec-method and the design card's legacy flags, if absent."""
    for action in parser._actions:
        if action.dest == "spec_method" and action.choices is not None:
            choices = list(action.choices)
            action.choices = choices + [m for m in METHODS if m not in choices]
    existing = {s for a in parser._actions for s in a.option_strings}
    if "--speculative-model" not in existing:
        parser.add_argument(
            "--speculative-model", dest="spec_model", default=None,
            help='vllm-cllm: legacy spelling of the speculative method, e.g. "[jacobi]"')
    if "--num-speculative-tokens" not in existing:
        parser.add_argument(
            "--num-speculative-tokens", dest="spec_tokens", type=int, default=None,
            help="vllm-cllm: legacy spelling of num_speculative_tokens")


def _wrap_add_cli_args(original):
    def add_cli_args(parser, *args: Any, **kwargs: Any):
        parser = original(parser, *args, **kwargs)
        _extend_parser(parser)
        return parser

    return add_cli_args


def _method_literal_has_custom_class() -> bool:
    from vllm.config.speculative import SpeculativeMethod

    def flat(tp: Any) -> set[Any]:
        args = typing.get_args(tp)
        return set().union(*(flat(a) for a in args)) if args else {tp}

    return "custom_class" in flat(SpeculativeMethod)


def patch_group() -> PatchGroup:
    from vllm.engine.arg_utils import EngineArgs

    return PatchGroup(
        name="speculative-config",
        probes=[
            ("EngineArgs.create_speculative_config(target_model_config, target_parallel_config)",
             lambda: has_params(EngineArgs.create_speculative_config, "target_model_config")),
            ("EngineArgs.add_cli_args", lambda: callable(EngineArgs.add_cli_args)),
            ("EngineArgs fields spec_method/spec_model/spec_tokens/additional_config",
             lambda: all(f in EngineArgs.__dataclass_fields__ for f in
                         ("spec_method", "spec_model", "spec_tokens", "additional_config"))),
            ("'custom_class' in vllm.config.speculative.SpeculativeMethod",
             _method_literal_has_custom_class),
            ("vllm.v1.sample.rejection_sampler.MAX_SPEC_LEN", lambda: max_draft_tokens() > 0),
        ],
        wraps=[
            Wrap(EngineArgs, "create_speculative_config", _wrap_create_speculative_config),
            Wrap(EngineArgs, "add_cli_args", _wrap_add_cli_args),
        ],
    )
