"""The user-facing speculative options of this plugin, validated before any engine starts.

vLLM's ``SpeculativeConfig`` forbids unknown keys, so the plugin's own keys (``fill``, …) are
validated here, removed from the speculative config and carried to the workers through
``VllmConfig.additional_config["vllm_cllm"]``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

from vllm_cllm.errors import ConfigError
from vllm_cllm.sizing.cost_model import TOKEN_MARGIN_PCT

#: Methods this plugin adds, with the proposer class each one maps to (vLLM's custom_class hook).
METHODS: dict[str, str] = {
    "jacobi": "vllm_cllm.proposers.jacobi.JacobiProposer",
    "space": "vllm_cllm.proposers.space.SpaceProposer",
}

FILL_POLICIES = ("hybrid", "ngram", "tail", "random")
#: What ``space`` drafts when its mask slots cannot be used; the first is the default.
SPACE_FILL_POLICIES = ("hybrid", "ngram", "masks", "tail")
#: Options each method accepts besides num_speculative_tokens.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "jacobi": ("fill", "ngram_min", "ngram_max", "seed", "adaptive", "knee_tokens",
               "floor_tokens", "token_margin_pct", "pool_size", "history_size", "lookup"),
    "space": ("fill", "ngram_min", "ngram_max", "history_size", "mask_token_id"),
}

#: Options that only some fills use, by method: given with another fill they are refused
#: rather than silently ignored. ``space``'s ``tail`` completes the tail from the n-gram
#: lookup, which is where the history comes in.
FILL_OPTIONS: dict[str, dict[str, tuple[str, ...]]] = {
    "jacobi": {"pool_size": ("hybrid",), "history_size": ("hybrid",), "lookup": ("hybrid",)},
    "space": {"history_size": ("hybrid", "ngram", "tail")},
}

#: Where ``jacobi``'s ``hybrid`` looks up earlier text: arctic-inference's suffix trees (the
#: default where it is installed) or this project's numpy lookups (vllm_cllm/sources/history.py).
LOOKUPS = ("suffix", "ngram")
#: Default ``history_size`` per lookup: a suffix tree finds a match among thousands of
#: outputs in microseconds; the numpy history is searched per n-gram and kept small.
DEFAULT_HISTORY = {"suffix": 1024, "ngram": 16}
MAX_HISTORY = {"suffix": 1 << 20, "ngram": 256}

#: Options of the adaptive rule: refused where drafting is not adaptive.
ADAPTIVE_OPTIONS = ("knee_tokens", "floor_tokens", "token_margin_pct")

#: Keys the plugin sets itself in vLLM's SpeculativeConfig; every other field of the
#: installed vLLM's SpeculativeConfig (probed by the front-end patch) passes through untouched.
OWN_KEYS = {"method", "num_speculative_tokens", "model"}

ADDITIONAL_CONFIG_KEY = "vllm_cllm"


@dataclass(frozen=True)
class ProposerOptions:
    """Options of both proposers, as validated by :func:`parse_options` (docs/options.md
    has the full text and why each default).

    fill: what completes the Jacobi tail up to k — ``hybrid`` (several sources), ``ngram``
      (the request's own n-grams), ``tail`` (the tail alone: pure Jacobi decoding), ``random``
      (tokens of the request's own text); ``space``: ``hybrid``, ``ngram``, ``masks``, ``tail``.
    adaptive (``jacobi``; default true with ``hybrid``): each step, each request drafts the
      candidate whose tokens promise the most and the batch's drafts are sized by the cost
      model ``max(floor_tokens, knee_tokens + N)``; false drafts a fixed k.
    token_margin_pct: how much a draft token's expected yield must beat its cost.
    ngram_min / ngram_max: n-gram lengths; seed: the ``random`` fill's seed.
    pool_size: fixed-k ``hybrid``'s pool of recent Jacobi iterates (0: off).
    history_size / lookup: how many earlier outputs the lookup keeps, and where it looks
      (``suffix``: arctic-inference's suffix trees; ``ngram``: the numpy history).
    mask_token_id (``space``): the checkpoint's mask token, from its config unless given.
    For ``space``, num_speculative_tokens is k, the masks per step; vLLM verifies 2k slots.
    """

    method: str = "jacobi"
    num_speculative_tokens: int = 15
    fill: str = "hybrid"
    ngram_min: int = 2
    ngram_max: int = 4
    seed: int = 0
    adaptive: bool = True  # with fill hybrid; parse_options sets False for other fills
    knee_tokens: int = 24
    floor_tokens: int = 28
    token_margin_pct: int = TOKEN_MARGIN_PCT
    pool_size: int = 8
    history_size: int = 16
    lookup: str = "ngram"
    mask_token_id: int | None = None

    @property
    def vllm_draft_tokens(self) -> int:
        """Draft slots vLLM schedules per request and step."""
        k = self.num_speculative_tokens
        return 2 * k if self.method == "space" else k

    @property
    def history_in_use(self) -> int:
        """``history_size`` where the fill drafts from the numpy history
        (vllm_cllm/sources/history.py), else 0: nothing is kept there."""
        fills = FILL_OPTIONS[self.method].get("history_size", ())
        return self.history_size if self.fill in fills and not self.uses_suffix_tree else 0

    @property
    def uses_suffix_tree(self) -> bool:
        """Whether ``jacobi``'s hybrid looks earlier text up in arctic-inference's trees."""
        return self.method == "jacobi" and self.fill == "hybrid" and self.lookup == "suffix"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"vllm-cllm: {name} must be an integer in [{low}, {high}]; got {value!r}")
    return value


def parse_options(spec: dict[str, Any], max_k: int, hf_config: Any = None,
                  vllm_keys: Collection[str] = ()) -> ProposerOptions:
    """Validate the plugin part of a speculative config dict (already holding our ``method``).

    ``max_k`` is vLLM's per-request limit on draft slots; ``hf_config`` the target model's
    config (``space`` reads its mask token there); ``vllm_keys`` the installed vLLM's
    SpeculativeConfig fields, which pass through. Raises ConfigError naming the offending
    key and the allowed values.
    """
    method = spec.get("method")
    if method not in METHODS:
        raise ConfigError(f"vllm-cllm: unknown method {method!r}; allowed: {', '.join(METHODS)}")
    allowed = METHOD_OPTIONS[method]
    unknown = sorted(set(spec) - OWN_KEYS - set(vllm_keys) - set(allowed))
    if unknown:
        raise ConfigError(
            f"vllm-cllm: unknown option(s) {', '.join(map(repr, unknown))} for method {method!r}; "
            f"allowed: num_speculative_tokens, {', '.join(allowed)}, and the fields of vLLM's "
            f"SpeculativeConfig"
        )
    if "model" in spec and spec["model"] not in (None, METHODS[method]):
        raise ConfigError(
            f"vllm-cllm: method {method!r} drafts with the target model itself; "
            f"do not set 'model' (got {spec['model']!r})"
        )
    if method == "space":
        max_k //= 2  # k candidates + k masks per step
    if "num_speculative_tokens" not in spec:
        raise ConfigError(f"vllm-cllm: method {method!r} needs num_speculative_tokens "
                          f"(an integer in [1, {max_k}])")
    k = _int_in("num_speculative_tokens", spec["num_speculative_tokens"], 1, max_k)
    policies = SPACE_FILL_POLICIES if method == "space" else FILL_POLICIES
    fill = spec.get("fill", policies[0])
    if fill not in policies:
        raise ConfigError(
            f"vllm-cllm: fill for method {method!r} must be one of {', '.join(policies)}; "
            f"got {fill!r}")
    for name, fills in FILL_OPTIONS[method].items():
        if name in spec and fill not in fills:
            raise ConfigError(f"vllm-cllm: {name} is used only with fill {' or '.join(fills)} "
                              f"for method {method!r}; got fill {fill!r}")
    ngram_min = _int_in("ngram_min", spec.get("ngram_min", ProposerOptions.ngram_min), 1, 64)
    ngram_max = _int_in("ngram_max", spec.get("ngram_max", ProposerOptions.ngram_max),
                        ngram_min, 64)
    seed = _int_in("seed", spec.get("seed", ProposerOptions.seed), 0, 2**31 - 1)
    adaptive = spec.get("adaptive", method == "jacobi" and fill == "hybrid")
    if not isinstance(adaptive, bool):
        raise ConfigError(f"vllm-cllm: adaptive must be true or false; got {adaptive!r}")
    if adaptive and fill != "hybrid":
        raise ConfigError(f"vllm-cllm: adaptive drafting chooses among the hybrid fill's "
                          f"candidates; fill {fill!r} drafts a fixed k (remove \"adaptive\")")
    for name in ADAPTIVE_OPTIONS:
        if name in spec and not adaptive:
            raise ConfigError(f"vllm-cllm: {name} sets the adaptive rule's cost model and is "
                              f"used only with adaptive drafting (fill hybrid, the default, "
                              f"without \"adaptive\": false)")
    if "pool_size" in spec and adaptive:
        raise ConfigError("vllm-cllm: pool_size is a source of fixed-k drafting; adaptive "
                          "drafting does not use it (add \"adaptive\": false, or remove it)")
    default_knee, default_floor = default_cost_model()
    knee_tokens = _int_in("knee_tokens", spec.get("knee_tokens", default_knee), 1, 1 << 20)
    floor_tokens = _int_in("floor_tokens", spec.get("floor_tokens", default_floor), 0, 1 << 20)
    token_margin_pct = _int_in("token_margin_pct",
                               spec.get("token_margin_pct", TOKEN_MARGIN_PCT), 0, 1000)
    pool_size = _int_in("pool_size", spec.get("pool_size", ProposerOptions.pool_size), 0, 64)
    lookup = _lookup(spec) if method == "jacobi" and fill == "hybrid" else "ngram"
    history_size = _int_in("history_size", spec.get("history_size", DEFAULT_HISTORY[lookup]),
                           0, MAX_HISTORY[lookup])
    mask_token_id = _mask_token_id(spec, hf_config) if method == "space" else None
    return ProposerOptions(method=method, num_speculative_tokens=k, fill=fill,
                           ngram_min=ngram_min, ngram_max=ngram_max, seed=seed,
                           adaptive=adaptive, knee_tokens=knee_tokens,
                           floor_tokens=floor_tokens, token_margin_pct=token_margin_pct,
                           pool_size=pool_size,
                           history_size=history_size, lookup=lookup,
                           mask_token_id=mask_token_id)


def _lookup(spec: dict[str, Any]) -> str:
    """The ``lookup`` option: as given (``suffix`` only where arctic-inference imports), else
    ``suffix`` where it is installed and ``ngram`` where it is not."""
    from vllm_cllm.sources.suffix_trees import suffix_tree_missing

    missing = suffix_tree_missing()
    if "lookup" not in spec:
        return "ngram" if missing else "suffix"
    lookup = spec["lookup"]
    if lookup not in LOOKUPS:
        raise ConfigError(f"vllm-cllm: lookup must be one of {', '.join(LOOKUPS)}; "
                          f"got {lookup!r}")
    if lookup == "suffix" and missing:
        raise ConfigError(f"vllm-cllm: lookup 'suffix' needs arctic-inference: {missing}; "
                          "or choose lookup 'ngram'")
    return lookup


def default_cost_model() -> tuple[int, int]:
    """The adaptive cost model's (knee, floor) for this platform: the CPU platform's fit by
    ``benchmarks/step_cost.py`` (docs/results.md), and for GPUs, which stay memory-bound up
    to hundreds of query tokens, (256, 0) — not yet measured on a GPU."""
    try:
        from vllm.platforms import current_platform

        return (24, 28) if current_platform.is_cpu() else (256, 0)
    except ImportError:
        return 24, 28


def _mask_token_id(spec: dict[str, Any], hf_config: Any) -> int:
    """The SPACE mask token: the option, else the checkpoint's ``mask_token_id``; checked."""
    vocab = getattr(hf_config, "vocab_size", None) if hf_config is not None else None
    upper = (vocab - 1) if vocab else 2**31 - 1
    if "mask_token_id" in spec:
        return _int_in("mask_token_id", spec["mask_token_id"], 0, upper)
    mask_id = getattr(hf_config, "mask_token_id", None) if hf_config is not None else None
    if not isinstance(mask_id, int) or isinstance(mask_id, bool) or not 0 <= mask_id <= upper:
        name = getattr(hf_config, "name_or_path", None) or "the target model"
        raise ConfigError(
            f"vllm-cllm: method 'space' needs a SPACE checkpoint with a mask token, but "
            f"{name} has no mask_token_id in its config (got {mask_id!r}). Train one with "
            f"`vllm-cllm train space`, or name the token with the option mask_token_id "
            f"(an integer in [0, {upper}]).")
    return mask_id


def options_from_vllm_config(vllm_config: Any, method: str) -> ProposerOptions:
    """Options as the worker sees them. When the class path was given directly (no options
    stored by our front end), the method's defaults for vLLM's draft slots, validated as
    above (``space``: half the slots are candidates; the mask token from the model)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    stored = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
    if stored:
        return ProposerOptions(**stored)
    slots = vllm_config.speculative_config.num_speculative_tokens
    k = slots // 2 if method == "space" else slots
    return parse_options({"method": method, "num_speculative_tokens": k}, slots,
                         getattr(vllm_config.model_config, "hf_config", None))
