"""The user-facing speculative options of this plugin, validated before any engine starts.

vLLM's ``SpeculativeConfig`` forbids unknown keys, so the plugin's own keys (``fill``, …) are
validated here, removed from the speculative config and carried to the workers through
``VllmConfig.additional_config["vllm_cllm"]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from vllm_cllm.errors import ConfigError

#: Methods this plugin adds, with the proposer class each one maps to (vLLM's custom_class hook).
METHODS: dict[str, str] = {
    "jacobi": "vllm_cllm.jacobi.JacobiProposer",
}

FILL_POLICIES = ("hybrid", "ngram", "tail", "random")

#: Keys the plugin sets itself in vLLM's SpeculativeConfig.
OWN_KEYS = {"method", "num_speculative_tokens", "model"}
#: Other SpeculativeConfig keys that the plugin passes through to vLLM untouched.
VLLM_KEYS = {"disable_by_batch_size", "max_model_len", "disable_log_stats"}

ADDITIONAL_CONFIG_KEY = "vllm_cllm"


@dataclass(frozen=True)
class ProposerOptions:
    """Options of the ``jacobi`` proposer (``space`` extends them).

    fill: what completes the draft after the Jacobi tail, up to k tokens —
      ``ngram`` (tail, then the continuation of the longest suffix n-gram seen in the request),
      ``tail`` (the Jacobi tail only, as CLLM's shrinking block; random prompt tokens when empty),
      ``random`` (tokens drawn from the request's own prompt and output, as CLLM starts blocks),
      ``hybrid`` (per request, whichever of "tail + ngram" and "ngram alone" has matched the
      committed tokens better so far: the tail wins on a CLLM, n-grams on an untrained model).
    ngram_min / ngram_max: n-gram lengths tried by the ``ngram`` fill.
    seed: seeds the ``random`` fill; the same on every tensor-parallel rank.
    """

    method: str = "jacobi"
    num_speculative_tokens: int = 15
    fill: str = "hybrid"
    ngram_min: int = 2
    ngram_max: int = 4
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


OPTION_NAMES = tuple(f.name for f in fields(ProposerOptions) if f.name not in
                     ("method", "num_speculative_tokens"))


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"vllm-cllm: {name} must be an integer in [{low}, {high}]; got {value!r}")
    return value


def parse_options(spec: dict[str, Any], max_k: int) -> ProposerOptions:
    """Validate the plugin part of a speculative config dict (already holding our ``method``).

    Raises ConfigError naming the offending key and the allowed values.
    """
    method = spec.get("method")
    if method not in METHODS:
        raise ConfigError(f"vllm-cllm: unknown method {method!r}; allowed: {', '.join(METHODS)}")
    unknown = sorted(set(spec) - OWN_KEYS - VLLM_KEYS - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(
            f"vllm-cllm: unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}; "
            f"allowed: num_speculative_tokens, {', '.join(OPTION_NAMES)}"
        )
    if "model" in spec and spec["model"] not in (None, METHODS[method]):
        raise ConfigError(
            f"vllm-cllm: method {method!r} drafts with the target model itself; "
            f"do not set 'model' (got {spec['model']!r})"
        )
    if "num_speculative_tokens" not in spec:
        raise ConfigError(f"vllm-cllm: method {method!r} needs num_speculative_tokens "
                          f"(an integer in [1, {max_k}])")
    k = _int_in("num_speculative_tokens", spec["num_speculative_tokens"], 1, max_k)
    fill = spec.get("fill", ProposerOptions.fill)
    if fill not in FILL_POLICIES:
        raise ConfigError(
            f"vllm-cllm: fill must be one of {', '.join(FILL_POLICIES)}; got {fill!r}")
    ngram_min = _int_in("ngram_min", spec.get("ngram_min", ProposerOptions.ngram_min), 1, 64)
    ngram_max = _int_in("ngram_max", spec.get("ngram_max", ProposerOptions.ngram_max),
                        ngram_min, 64)
    seed = _int_in("seed", spec.get("seed", ProposerOptions.seed), 0, 2**31 - 1)
    return ProposerOptions(method=method, num_speculative_tokens=k, fill=fill,
                           ngram_min=ngram_min, ngram_max=ngram_max, seed=seed)


def options_from_vllm_config(vllm_config: Any) -> ProposerOptions:
    """Options as the worker sees them; defaults when the class path was given directly."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    stored = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
    k = vllm_config.speculative_config.num_speculative_tokens
    if not stored:
        return ProposerOptions(num_speculative_tokens=k)
    return ProposerOptions(**{**stored, "num_speculative_tokens": k})
