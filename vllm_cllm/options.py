"""The user-facing speculative options of this plugin: one table, validated before any engine
starts.

:data:`OPTIONS` declares every option once — its type, range or choices, default (which may
depend on the platform, the model or other options), meaning, and the fills and modes it
applies to. Validation (:func:`parse_options`), the defaults, the README's options table and
``docs/options.md`` (:func:`render_options_table`, :func:`render_options_doc`) all come
from it; a test keeps the two documents equal to it.

vLLM's ``SpeculativeConfig`` forbids unknown keys, so the plugin's own keys are validated
here, removed from the speculative config and carried to the workers through
``VllmConfig.additional_config["vllm_cllm"]``, where :func:`options_from_vllm_config`
validates them again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, fields
from typing import Any

from vllm_cllm.errors import ConfigError

#: Methods this plugin adds, with the proposer class each one maps to (vLLM's custom_class hook).
METHODS: dict[str, str] = {
    "jacobi": "vllm_cllm.proposers.jacobi.JacobiProposer",
    "space": "vllm_cllm.proposers.space.SpaceProposer",
}

#: Keys the plugin sets itself in vLLM's SpeculativeConfig; every other field of the
#: installed vLLM's SpeculativeConfig (probed by the front-end patch) passes through untouched.
OWN_KEYS = {"method", "num_speculative_tokens", "model"}

ADDITIONAL_CONFIG_KEY = "vllm_cllm"

#: Where ``jacobi``'s ``hybrid`` looks up earlier text, and each lookup's most outputs kept:
#: a suffix tree finds a match among thousands of outputs in microseconds; the numpy history
#: is searched per n-gram and kept small.
LOOKUPS = {"suffix": 1 << 20, "history": 256}
#: Earlier spellings of option values, still accepted.
ALIASES = {("lookup", "ngram"): "history"}

#: The adaptive cost model's (knee, floor) per platform: the CPU platform's fit by
#: ``benchmarks/step_cost.py`` (docs/results.md), and for GPUs, which stay memory-bound up
#: to hundreds of query tokens, (256, 0).
COST_MODEL = {"cpu": (24, 28), "gpu": (256, 0)}
#: Whether ``measure_cost`` is on unless knee or floor is given.
MEASURE_BY_DEFAULT = True


@dataclass(frozen=True)
class Option:
    """One option: ``kind`` int, bool or str; ``low``/``high`` (an int's range, ``high``
    may name another option whose value is the bound, or be a function of the context) or
    ``choices``; ``default`` a value or a function of the options parsed so far; ``only``
    restricts it to some fills or modes (``{"fill": (...), "adaptive": (...)}``), outside
    which giving it is refused; ``doc`` the longer text of docs/options.md."""

    name: str
    kind: type
    methods: tuple[str, ...]
    meaning: str | dict[str, str]
    default: Any = None
    default_text: str | dict[str, str] = ""
    low: int | str | None = None
    high: int | str | Callable[[dict[str, Any]], int] | None = None
    choices: dict[str, tuple[str, ...]] | None = None
    only: dict[str, dict[str, tuple[Any, ...]]] | None = None
    values_text: dict[str, str] | None = None
    doc: str = ""

    def meaning_for(self, method: str) -> str:
        return self.meaning[method] if isinstance(self.meaning, dict) else self.meaning

    def applies(self, method: str, parsed: dict[str, Any]) -> bool:
        """Whether the option is used with what has been parsed so far."""
        return all(parsed.get(key) in allowed
                   for key, allowed in ((self.only or {}).get(method) or {}).items())


def _platform() -> str:
    try:
        from vllm.platforms import current_platform

        return "cpu" if current_platform.is_cpu() else "gpu"
    except ImportError:
        return "cpu"


def _default_lookup(parsed: dict[str, Any]) -> str:
    from vllm_cllm.sources.suffix_trees import suffix_tree_missing

    return "history" if suffix_tree_missing() else "suffix"


def _default_history(parsed: dict[str, Any]) -> int:
    return 1024 if parsed.get("lookup") == "suffix" else 16


def _max_k(parsed: dict[str, Any]) -> int:
    slots = parsed["_max_slots"]
    return slots // 2 if parsed["method"] == "space" else slots


_HYBRID = {"fill": ("hybrid",)}
_ADAPTIVE = {"fill": ("hybrid",), "adaptive": (True,)}

#: Every option, in the order the documents list them (and parsing resolves them: an
#: option's default or bound may depend on those before it).
OPTIONS: tuple[Option, ...] = (
    Option("num_speculative_tokens", int, ("jacobi", "space"), low=1, high=_max_k,
           default_text="required",
           values_text={"jacobi": "1–128", "space": "1–64"},
           meaning={"jacobi": "k, the most draft tokens a request verifies per step",
                    "space": "k, the mask slots per step; vLLM verifies up to 2k draft slots"},
           doc="With adaptive drafting k is a cap: each request drafts as many tokens as the "
               "cost model finds worth verifying. With fixed-k drafting every request "
               "verifies up to k tokens every step. The upper bound is vLLM's per-request "
               "limit (`MAX_SPEC_LEN` of its rejection sampler); `space` uses half of it."),
    Option("fill", str, ("jacobi", "space"),
           choices={"jacobi": ("hybrid", "ngram", "tail", "random"),
                    "space": ("hybrid", "ngram", "masks", "tail")},
           default="hybrid",
           meaning={"jacobi": "where drafts come from: several sources (`hybrid`), the Jacobi "
                              "tail then the request's n-grams (`ngram`), the tail alone, i.e. "
                              "pure Jacobi decoding (`tail`), random tokens of the request "
                              "(`random`)",
                    "space": "what is drafted when the mask rows cannot be used (after a "
                             "rejection)"},
           doc="`jacobi` `hybrid`: the request's n-grams, the `lookup` of earlier text, the "
               "Jacobi tail and (fixed k) the pool of recent iterates are candidates; greedy "
               "requests choose adaptively (`adaptive`), sampled ones in a fixed order (the "
               "n-grams, the lookup, the pool, the block), drafting from their own tokens. "
               "`ngram`, `tail` and `random` draft a fixed k. `space` `hybrid` scores the "
               "block (the Jacobi tail completed by n-grams) against the n-grams alone; "
               "`masks` drafts only masks after a rejection (always fully accepted, so the "
               "next step has mask rows again)."),
    Option("adaptive", bool, ("jacobi",),
           default=lambda p: p["method"] == "jacobi" and p["fill"] == "hybrid",
           default_text="`true` with `hybrid`",
           meaning="each step, each greedy request drafts its most promising candidate, "
                   "sized by learned acceptance and the step-cost model; `false` drafts a "
                   "fixed k in a fixed order",
           doc="Every token of every candidate is valued by how often tokens like it were "
               "accepted (by source, position, agreement with the other candidates and how "
               "the request's last draft fared); the candidate whose best prefix promises "
               "the most tokens per step cost is drafted, and the batch's drafts are sized "
               "together by the cost model. Sampled requests always draft a fixed k."),
    Option("knee_tokens", int, ("jacobi",), low=1, high=1 << 20,
           default=lambda p: COST_MODEL[_platform()][0],
           default_text="24 on CPU, 256 on GPU", only={"jacobi": _ADAPTIVE},
           meaning="cost model `max(floor, knee + N)` of a verify step over N query tokens: "
                   "its fixed part, in query tokens",
           doc="Fit on a machine by `benchmarks/step_cost.py` (docs/results.md)."),
    Option("floor_tokens", int, ("jacobi",), low=0, high=1 << 20,
           default=lambda p: COST_MODEL[_platform()][1],
           default_text="28 on CPU, 0 on GPU", only={"jacobi": _ADAPTIVE},
           meaning="the cost model's floor: below it extra query tokens cost nothing",
           doc="Where a step is bound by reading the weights, a few more query tokens come "
               "free; the floor is the step's cost there."),
    Option("measure_cost", bool, ("jacobi",),
           default=lambda p: MEASURE_BY_DEFAULT and bool(p.get("adaptive"))
           and not {"knee_tokens", "floor_tokens"} & p["_given"],
           default_text="`true` unless `knee_tokens` or `floor_tokens` is given",
           only={"jacobi": _ADAPTIVE},
           meaning="fit `knee_tokens` and `floor_tokens` to the engine's own timed verify "
                   "steps while it serves, starting from the values above",
           doc="Each verify step's forward time (from the step's start to its predictions "
               "on the host) against the query tokens it scheduled and the requests it ran, "
               "steps with a prefill chunk left out, plus the rest of a step (sampling, the "
               "proposer, output, scheduling: from the predictions to the next step's start) "
               "through its per-batch-size medians; fitted as `p·B + max(floor, knee + N)` "
               "(`p`: what a request costs beyond its query token, 0 where every step ran "
               "one batch size), first tried after 16 and 32 steps (quietly until a fit is "
               "found) and again after a change of the batch size by more than 2x, refitted "
               "every 64 steps over the last 1,024 (the steps of batch sizes within 2x of the "
               "current one first, all of them where those make no fit), and logged. "
               "A fit that does not explain the steps (too narrow "
               "a range of token counts, a zero or negative slope, a large error) is dropped "
               "with a log line and the values in use are kept; a fit whose seconds per query "
               "token are over 3x off the fit in use is taken only when the next fit agrees "
               "with it within 1.5x (logged while it waits). With tensor parallelism every "
               "rank measures its own; vLLM schedules the drafts of one rank (its output "
               "rank), so the others' drafts, which it discards, may differ."),
    Option("token_margin_pct", int, ("jacobi",), low=0, high=1000, default=30,
           only={"jacobi": _ADAPTIVE},
           meaning="how much (percent) a draft token's expected yield must exceed its cost",
           doc="Each draft token's expected yield counts `1 / (1 + margin)` of its estimate, "
               "so where a token costs time it is drafted only if it beats its cost by that "
               "much."),
    Option("ngram_min", int, ("jacobi", "space"), low=1, high=64, default=2,
           meaning="shortest n-gram looked up in the request's own tokens",
           doc="The request's n-grams are looked up longest first, `ngram_max` down to "
               "`ngram_min` tokens."),
    Option("ngram_max", int, ("jacobi", "space"), low="ngram_min", high=64, default=4,
           values_text={"jacobi": "`ngram_min`–64", "space": "`ngram_min`–64"},
           meaning="longest n-gram looked up in the request's own tokens",
           doc="Where the n-gram occurred several times, the draft follows the way it most "
               "often continued, from its first such occurrence (`ngram`), or its latest "
               "occurrence (`ngram_latest`), whichever has matched better in the request."),
    Option("lookup", str, ("jacobi",), choices={"jacobi": tuple(LOOKUPS)},
           default=_default_lookup, default_text="`suffix` if arctic-inference is installed",
           only={"jacobi": _HYBRID},
           meaning="where `hybrid` looks up earlier text: arctic-inference's suffix trees "
                   "(`suffix`), or the numpy output history (`history`)",
           doc="Both see the request's own prompt and output; greedy requests also see "
               "earlier requests' outputs. `ngram`, an earlier name of `history`, is "
               "accepted."),
    Option("ngram_candidate", bool, ("jacobi",), default=True,
           only={"jacobi": _ADAPTIVE},
           meaning="the request's n-grams are a candidate beside the lookup and the tail",
           doc="The lookup sees the request's own tokens too; without the n-gram candidate "
               "a step builds one candidate less per request: less host time per step, "
               "somewhat fewer tokens per verify step (docs/decisions.md)."),
    Option("drain", bool, ("jacobi",), default=True,
           only={"jacobi": _ADAPTIVE},
           meaning="in a batch that drains, only the requests that end last draft where "
                   "drafts cost time, priced as a batch of only them",
           doc="A batch drains when its requests finish and none take their places (an "
               "offline batch, the end of a run): the steps go on until its last request "
               "ends, so a token gained by a request that ends earlier shortens no step. "
               "Such requests then draft nothing where a draft token costs time (above the "
               "cost model's floor); the others draft priced as a batch of only them, since "
               "their tokens decide when the batch ends (docs/decisions.md)."),
    Option("history_size", int, ("jacobi", "space"), low=0,
           high=lambda p: LOOKUPS[p.get("lookup") or "history"], default=_default_history,
           default_text={"jacobi": "1024 (`suffix`), 16 (`history`)", "space": "16"},
           values_text={"jacobi": "0–2^20 (`suffix`), 0–256 (`history`)", "space": "0–256"},
           only={"jacobi": _HYBRID, "space": {"fill": ("hybrid", "ngram", "tail")}},
           meaning="how many earlier requests' outputs the lookup keeps; only greedy requests "
                   "draft from them",
           doc="A sampled request drafts from its own tokens only: its samples depend on its "
               "drafts, and a seeded request must sample the same whatever ran before it."),
    Option("pool_size", int, ("jacobi",), low=0, high=64, default=8,
           only={"jacobi": {"fill": ("hybrid",), "adaptive": (False,)}},
           meaning="fixed-k `hybrid` only: how many recent Jacobi iterates of the request are "
                   "a draft source",
           doc="Lookahead decoding's n-gram pool: tokens guessed a step or two early often "
               "come true after a correction."),
    Option("seed", int, ("jacobi",), low=0, high=2**31 - 1, default=0,
           values_text={"jacobi": "integer"},
           meaning="seeds the restart block and the `random` fill",
           doc="Drawn per request from its own tokens, so a seeded request gets the same "
               "drafts whatever runs beside it."),
    Option("mask_token_id", int, ("space",), low=0,
           high=lambda p: p["_vocab"] - 1 if p.get("_vocab") else 2**31 - 1,
           default=lambda p: p["_model_mask"], default_text="the checkpoint's `mask_token_id`",
           values_text={"space": "token id"},
           meaning="the SPACE mask token",
           doc="`vllm-cllm train space` writes it into the checkpoint's config."),
)

OPTION = {option.name: option for option in OPTIONS}


@dataclass(frozen=True)
class ProposerOptions:
    """The options of one method as :func:`parse_options` resolved them (every field set;
    :data:`OPTIONS` says what each means)."""

    method: str
    num_speculative_tokens: int
    fill: str
    ngram_min: int
    ngram_max: int
    seed: int
    adaptive: bool
    knee_tokens: int
    floor_tokens: int
    token_margin_pct: int
    pool_size: int
    history_size: int
    lookup: str
    mask_token_id: int | None
    measure_cost: bool
    ngram_candidate: bool
    drain: bool

    @property
    def vllm_draft_tokens(self) -> int:
        """Draft slots vLLM schedules per request and step."""
        k = self.num_speculative_tokens
        return 2 * k if self.method == "space" else k

    @property
    def history_in_use(self) -> int:
        """``history_size`` where the numpy output history is drafted from, else 0."""
        used = OPTION["history_size"].applies(self.method, asdict(self))
        return self.history_size if used and self.lookup == "history" else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, stored: dict[str, Any], max_slots: int) -> ProposerOptions:
        """Options stored by the front end, validated again: exactly the fields, each in
        its range (``max_slots``: vLLM's draft slots per request)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(stored, dict) or set(stored) != names:
            missing = sorted(names - set(stored or {}))
            extra = sorted(set(stored or {}) - names)
            raise ConfigError(f"vllm-cllm: stored options do not match this version of the "
                              f"plugin (missing {missing}, unknown {extra})")
        method = stored["method"]
        if method not in METHODS:
            raise ConfigError(f"vllm-cllm: stored options name an unknown method {method!r}")
        context = {"method": method, "_max_slots": max_slots, "_vocab": None,
                   "_given": set(stored)}
        for option in OPTIONS:
            value = stored[option.name]
            if value is None and option.name == "mask_token_id" and method != "space":
                continue
            if method in option.methods:
                context[option.name] = _check(option, method, value, context)
        return cls(**stored)


def _bound(bound: Any, context: dict[str, Any]) -> Any:
    if callable(bound):
        return bound(context)
    if isinstance(bound, str):
        return context[bound]
    return bound


def _check(option: Option, method: str, value: Any, context: dict[str, Any]) -> Any:
    """``value`` if it is valid for ``option``, else a ConfigError naming it."""
    name = option.name
    if option.kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"vllm-cllm: {name} must be true or false; got {value!r}")
        return value
    if option.kind is int:
        low, high = _bound(option.low, context), _bound(option.high, context)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"vllm-cllm: {name} must be an integer in [{low}, {high}]; "
                              f"got {value!r}")
        return value
    choices = (option.choices or {})[method]
    value = ALIASES.get((name, value), value)
    if value not in choices:
        raise ConfigError(f"vllm-cllm: {name} for method {method!r} must be one of "
                          f"{', '.join(choices)}; got {value!r}")
    return value


def _used_only(option: Option, method: str) -> str:
    """How the documents and messages say where an option applies."""
    only = (option.only or {}).get(method) or {}
    parts = []
    if "fill" in only:
        parts.append(f"fill {' or '.join(only['fill'])}")
    if only.get("adaptive") == (True,):
        parts.append("adaptive drafting")
    if only.get("adaptive") == (False,):
        parts.append("\"adaptive\": false")
    return ", with ".join(parts)


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
    mine = [option for option in OPTIONS if method in option.methods]
    allowed = [option.name for option in mine]
    unknown = sorted(set(spec) - OWN_KEYS - set(vllm_keys) - set(allowed))
    if unknown:
        raise ConfigError(
            f"vllm-cllm: unknown option(s) {', '.join(map(repr, unknown))} for method "
            f"{method!r}; allowed: {', '.join(allowed)}, and the fields of vLLM's "
            f"SpeculativeConfig")
    if "model" in spec and spec["model"] not in (None, METHODS[method]):
        raise ConfigError(
            f"vllm-cllm: method {method!r} drafts with the target model itself; "
            f"do not set 'model' (got {spec['model']!r})")
    if "num_speculative_tokens" not in spec:
        raise ConfigError(f"vllm-cllm: method {method!r} needs num_speculative_tokens "
                          f"(an integer in [1, {_max_k({'method': method, '_max_slots': max_k})}])")
    vocab = getattr(hf_config, "vocab_size", None) if hf_config is not None else None
    context: dict[str, Any] = {"method": method, "_max_slots": max_k, "_vocab": vocab,
                               "_given": set(spec),
                               "_model_mask": getattr(hf_config, "mask_token_id", None)
                               if hf_config is not None else None}
    for option in mine:
        used = option.applies(method, context)
        if option.name in spec:
            if not used:
                raise ConfigError(
                    f"vllm-cllm: {option.name} is used only with {_used_only(option, method)} "
                    f"for method {method!r}; got fill {context['fill']!r}"
                    + (f", adaptive {str(context['adaptive']).lower()}"
                       if "adaptive" in context else "")
                    + f" ({option.name}: {option.meaning_for(method)})")
            context[option.name] = _check(option, method, spec[option.name], context)
        elif option.name == "lookup" and not used:
            context["lookup"] = "history"  # the numpy history is the only lookup there
        elif option.name == "mask_token_id":
            context[option.name] = _model_mask_token(hf_config, option, context)
        else:
            default = option.default
            context[option.name] = default(context) if callable(default) else default
        if option.name == "adaptive" and context["adaptive"] and context["fill"] != "hybrid":
            raise ConfigError(f"vllm-cllm: adaptive drafting chooses among the hybrid fill's "
                              f"candidates; fill {context['fill']!r} drafts a fixed k (remove "
                              f"\"adaptive\")")
    resolved = {f.name: context.get(f.name) for f in fields(ProposerOptions)}
    if resolved["lookup"] is None:
        resolved["lookup"] = "history"
    if resolved["lookup"] == "suffix":
        _check_suffix_trees(spec)
    for name, option in OPTION.items():  # what this method does not use, as the defaults
        if resolved.get(name) is None and name != "mask_token_id":
            default = option.default
            resolved[name] = default(context) if callable(default) else default
    if resolved["history_size"] is None:
        resolved["history_size"] = _default_history(resolved)
    return ProposerOptions(**resolved)


def _check_suffix_trees(spec: dict[str, Any]) -> None:
    """``lookup: suffix`` asked for where arctic-inference does not import: refused."""
    from vllm_cllm.sources.suffix_trees import suffix_tree_missing

    missing = suffix_tree_missing()
    if missing and ALIASES.get(("lookup", spec.get("lookup")), spec.get("lookup")) == "suffix":
        raise ConfigError(f"vllm-cllm: lookup 'suffix' needs arctic-inference: {missing}; "
                          "or choose lookup 'history'")


def _model_mask_token(hf_config: Any, option: Option, context: dict[str, Any]) -> int:
    """The SPACE checkpoint's ``mask_token_id``, checked; refused where it has none."""
    mask_id = context["_model_mask"]
    upper = _bound(option.high, context)
    if not isinstance(mask_id, int) or isinstance(mask_id, bool) or not 0 <= mask_id <= upper:
        name = getattr(hf_config, "name_or_path", None) or "the target model"
        raise ConfigError(
            f"vllm-cllm: method 'space' needs a SPACE checkpoint with a mask token, but "
            f"{name} has no mask_token_id in its config (got {mask_id!r}). Train one with "
            f"`vllm-cllm train space`, or name the token with the option mask_token_id "
            f"(an integer in [0, {upper}]).")
    return mask_id


def options_from_vllm_config(vllm_config: Any, method: str) -> ProposerOptions:
    """Options as the worker sees them: those the front end stored, validated again; when
    the class path was given directly (nothing stored), the method's defaults for vLLM's
    draft slots (``space``: half the slots are candidates; the mask token from the model)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    stored = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
    slots = vllm_config.speculative_config.num_speculative_tokens
    if stored:
        options = ProposerOptions.from_dict(stored, max(slots, 1))
        if options.method != method or options.vllm_draft_tokens != slots:
            raise ConfigError(f"vllm-cllm: stored options are for method {options.method!r} "
                              f"with {options.vllm_draft_tokens} draft slots, but vLLM runs "
                              f"{method!r} with {slots}")
        return options
    k = slots // 2 if method == "space" else slots
    return parse_options({"method": method, "num_speculative_tokens": k}, slots,
                         getattr(vllm_config.model_config, "hf_config", None))


# -- the documents ------------------------------------------------------------------------

README_START, README_END = "<!-- options table: generated -->", "<!-- end of options table -->"


def _values(option: Option, method: str) -> str:
    if option.values_text and method in option.values_text:
        return option.values_text[method]
    if option.kind is bool:
        return "`true`, `false`"
    if option.choices:
        return ", ".join(f"`{c}`" for c in option.choices[method])
    high = option.high if isinstance(option.high, int) else None
    if high is not None and high >= 1 << 20:
        return f"≥ {option.low}"
    return f"{option.low}–{high}"


def _default(option: Option, method: str) -> str:
    if isinstance(option.default_text, dict):
        return option.default_text[method]
    if option.default_text:
        return option.default_text
    if isinstance(option.default, bool):
        return f"`{str(option.default).lower()}`"
    if isinstance(option.default, str):
        return f"`{option.default}`"
    return str(option.default)


def render_options_table(method: str) -> str:
    """The README's one-line-per-option table of ``method``."""
    rows = ["| option | values | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        if method in option.methods:
            only = _used_only(option, method)
            meaning = option.meaning_for(method) + (f" (only with {only})" if only else "")
            rows.append(f"| `{option.name}` | {_values(option, method)} | "
                        f"{_default(option, method)} | {meaning} |")
    return "\n".join(rows)


def render_options_doc() -> str:
    """``docs/options.md``: both tables, then each option's longer text."""
    out = ["# Options", "",
           "Every option of the `jacobi` and `space` methods. Generated from the table in "
           "`vllm_cllm/options.py` (`vllm-cllm options --write` rewrites this file and the "
           "README's tables); a test keeps them equal.", "",
           "Options go into vLLM's speculative config, next to the method:", "",
           "- Python: `LLM(model=..., speculative_config={\"method\": \"jacobi\", "
           "\"num_speculative_tokens\": 15, \"adaptive\": false})`",
           "- server: `vllm serve MODEL --speculative-config '{\"method\": \"jacobi\", "
           "\"num_speculative_tokens\": 15}'`", "",
           "The shorter spellings `--speculative-model \"[jacobi]\" --num-speculative-tokens "
           "15` and `--spec-method jacobi --spec-tokens 15` select the method with its "
           "defaults. Unknown options, values out of range and options that the chosen fill "
           "or mode does not use are refused before the engine starts, with a message naming "
           "the option and the allowed values. vLLM fields that would make the output differ "
           "from the model's, or that vLLM ignores for a `custom_class` proposer, are refused "
           "too where the installed vLLM has them (`REFUSED_FIELDS` in "
           "`patches/speculative_config.py`); other fields of vLLM's `SpeculativeConfig` pass "
           "through.", ""]
    for method in METHODS:
        out += [f"## `{method}`", "", render_options_table(method), ""]
        for option in OPTIONS:
            if method in option.methods and option.doc:
                out += [f"- `{option.name}`: {option.doc}"]
        out.append("")
    return "\n".join(out)


def render_readme_section() -> str:
    """The README's options tables, between their markers."""
    return "\n".join([README_START, render_options_table("jacobi"), "",
                      "`space` (`{\"method\": \"space\", \"num_speculative_tokens\": 5}`):", "",
                      render_options_table("space"), README_END])


def write_options_docs(root: Any) -> list[str]:
    """Rewrite ``docs/options.md`` and the README's options tables under ``root`` from
    :data:`OPTIONS`; the files changed."""
    from pathlib import Path

    root, changed = Path(root), []
    doc = root / "docs" / "options.md"
    if not doc.exists() or doc.read_text() != render_options_doc():
        doc.write_text(render_options_doc())
        changed.append(str(doc))
    readme = root / "README.md"
    text = readme.read_text()
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    new = text[:start] + render_readme_section() + text[end:]
    if new != text:
        readme.write_text(new)
        changed.append(str(readme))
    return changed
