"""``vllm-cllm bench``: this project's proposers against vLLM's own, on real data, side by side.

Every configuration (model × speculative method) runs in its own engine process over every
data set and batch size; one model's configurations are loaded side by side and run the same
prompts in lock step, a few engine steps each in turn (vllm_cllm/bench/engine_pool.py), so that this
shared machine's drift does not enter the ratios. Each row is compared with the same model's
no-speculation row on the same prompts and batch size (speed-up, greedy token identity).
Per-model results are cached under ``OUT/raw/`` so that an interrupted run resumes there.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vllm_cllm.bench.engine_pool import EnginePool
from vllm_cllm.bench.measure import WARMUP_PROMPT, Group, against_baseline

#: The demo checkpoints the bench compares (``vllm-cllm model-path`` prepares them).
MODELS = {"base": "smollm2-135m-instruct", "cllm": "smollm2-135m-cllm-gsm",
          "space": "smollm2-135m-space-gsm"}
DATASETS = ("gsm", "humaneval", "mtbench", "sharegpt")
#: vLLM's own proposers as the bench runs them (``ngram`` tuned on these data sets; ``suffix``
#: with vLLM's defaults and up to 16 tokens); the benchmark scripts compare against the same.
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2,
              "prompt_lookup_max": 4}
SUFFIX_SPEC = {"method": "suffix", "num_speculative_tokens": 16}
#: ``jacobi`` options of a cost model under which no draft pays from batch 2 up (each query
#: token costs the same, no fixed part): the speculative path's own cost, nothing drafted.
NEVER_DRAFTING = {"knee_tokens": 1, "floor_tokens": 0}


@dataclass(frozen=True)
class BenchConfig:
    """One engine: a model label from MODELS, a method name for the table, its spec."""

    model: str
    method: str
    spec: dict[str, Any] | None = field(default=None, hash=False)

    @property
    def key(self) -> str:
        return f"{self.model}--{self.method}".replace(" ", "_").replace("=", "")


@dataclass(frozen=True)
class BenchPlan:
    """What one run measures; ``quick`` is a few-minute subset of the full plan."""

    datasets: tuple[str, ...] = DATASETS
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    #: prompts per batch size (batch 1 runs its prompts one at a time)
    prompts_per_batch: dict[int, int] = field(
        default_factory=lambda: {1: 8, 4: 8, 16: 16}, hash=False)
    max_tokens: int = 128
    k: int = 15
    #: Rounds: every configuration runs once per round (fresh engines each time), and a
    #: row's speed-up is the median over rounds of its ratio to its baseline in the same
    #: round.
    rounds: int = 1

    @classmethod
    def quick(cls) -> BenchPlan:
        return cls(datasets=("gsm", "mtbench"), batch_sizes=(1, 16),
                   prompts_per_batch={1: 2, 16: 16}, max_tokens=64)

    def fingerprint(self) -> str:
        """Names the raw-result cache (rounds live below it); the layout bumps when prompt
        selection or what a row measures changes (3: steps counted, not inferred; 4: one model's
        configurations side by side; 5: in lock step, each timing its own engine steps; 6: the
        ``jacobi`` rows' oracle)."""
        key = {**asdict(self), "layout": 6}
        key.pop("rounds")
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def suffix_available() -> str | None:
    """None when vLLM's ``suffix`` proposer can run here, else why not."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as exc:
        return f"arctic-inference is not installed ({exc}); `pip install arctic-inference`"
    return None


def configurations(k: int, with_suffix: bool = True, quick: bool = False) -> list[BenchConfig]:
    """No speculation per model first (the baselines), then every proposer.

    vLLM's ``ngram`` and ``suffix`` run on the base model and, outside ``quick``, on the CLLM
    demo too: a user holding a CLLM checkpoint chooses between them and ``jacobi`` on that
    checkpoint, whose outputs (and so what a lookup finds) differ from the base model's.
    """
    jacobi = {"method": "jacobi", "num_speculative_tokens": k}
    configs = [
        BenchConfig("base", "none"),
        BenchConfig("base", "ngram k=8", NGRAM_SPEC),
        BenchConfig("base", "suffix", SUFFIX_SPEC),
        BenchConfig("base", f"jacobi k={k}", jacobi),  # the default: adaptive drafting
        BenchConfig("base", f"jacobi fixed k={k}", {**jacobi, "adaptive": False}),
        BenchConfig("cllm", "none"),
        *([] if quick else [BenchConfig("cllm", "ngram k=8", NGRAM_SPEC),
                            BenchConfig("cllm", "suffix", SUFFIX_SPEC)]),
        BenchConfig("cllm", f"jacobi k={k}", jacobi),
        BenchConfig("cllm", f"jacobi fixed k={k}", {**jacobi, "adaptive": False}),
        BenchConfig("space", "none"),
        BenchConfig("space", "space k=5", {"method": "space", "num_speculative_tokens": 5}),
    ]
    return [c for c in configs if with_suffix or c.method != "suffix"]


def with_jacobi_options(configs: list[BenchConfig], options: dict[str, Any]
                        ) -> list[BenchConfig]:
    """``options`` added to every ``jacobi`` configuration that takes them (the adaptive
    cost model's, say, to the default and not to fixed k), and named in its method: its rows
    then never mix with the plain configuration's in a results folder."""
    from vllm_cllm.errors import ConfigError
    from vllm_cllm.options import parse_options

    named = " ".join(f"{key}={value}" for key, value in sorted(options.items()))
    out = []
    for config in configs:
        if config.spec is not None and config.spec.get("method") == "jacobi":
            spec = {**config.spec, **options}
            try:
                parse_options(spec, max_k=spec["num_speculative_tokens"])
            except ConfigError:
                out.append(config)
                continue
            config = BenchConfig(config.model, f"{config.method} {named}", spec)
        out.append(config)
    return out


def prompt_sets(plan: BenchPlan, tokenizer: Any) -> dict[str, list[str]]:
    """Enough prompts per data set for disjoint groups (:func:`groups`); chat template except
    for HumanEval (code completion)."""
    from vllm_cllm.bench.datasets import (
        chat_template,
        humaneval_prompts,
        mtbench_questions,
        sharegpt_questions,
    )
    from vllm_cllm.training.gsm import GSM_EVAL_SEED, chat_prompt, gsm_problems

    count = sum(plan.prompts_per_batch[b] for b in plan.batch_sizes)
    loaders = {
        "gsm": lambda: [chat_prompt(tokenizer, p["question"])
                        for p in gsm_problems(count, GSM_EVAL_SEED)],
        "humaneval": lambda: humaneval_prompts(count),  # code completion: the raw prompt
        "mtbench": lambda: chat_template(tokenizer, _interleaved(mtbench_questions(), 10)[:count]),
        "sharegpt": lambda: chat_template(tokenizer, sharegpt_questions(count)),
    }
    return {name: loaders[name]() for name in plan.datasets}


def _interleaved(items: list[str], stride: int) -> list[str]:
    """MT-bench lists its 8 categories in blocks of 10: take one of each in turn."""
    return [items[i] for r in range(stride) for i in range(r, len(items), stride)]


def groups(plan: BenchPlan, prompts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One group per data set and batch size, each with prompts no other group uses: vLLM's
    ``suffix`` caches earlier responses, and a prompt seen twice would flatter it."""
    out, used = [], dict.fromkeys(plan.datasets, 0)
    for d in plan.datasets:
        for b in plan.batch_sizes:
            n = plan.prompts_per_batch[b]
            out.append({"tags": {"dataset": d}, "batch_size": b, "warmup": [WARMUP_PROMPT] * b,
                        "prompts": prompts[d][used[d]:used[d] + n]})
            used[d] += n
    return out


def run(plan: BenchPlan, out: Path, model_dirs: dict[str, str],
        configs: list[BenchConfig]) -> list[dict[str, Any]]:
    """Measure every configuration in ``plan.rounds`` rounds (resuming from ``out/raw``) and
    compare each with its baseline. Within a round, one model's configurations run side by
    side (:func:`measure_side_by_side`), so a speed-up is a ratio between runs seconds apart;
    each round starts their engines in another order (:func:`started_in_turn`)."""
    from transformers import AutoTokenizer

    prompts = prompt_sets(plan, AutoTokenizer.from_pretrained(model_dirs["base"]))
    raw = out / "raw" / plan.fingerprint()
    models = list(dict.fromkeys(c.model for c in configs))
    rounds = []
    with tqdm(total=plan.rounds * len(models), desc="bench models") as bar:
        for r in range(plan.rounds):
            folder = raw if r == 0 else raw / f"round{r + 1}"  # round 1: the one-round layout
            folder.mkdir(parents=True, exist_ok=True)
            measured: dict[str, list[dict[str, Any]]] = {}
            for model in models:
                mine = started_in_turn([c for c in configs if c.model == model], r)
                cached = folder / f"{model}.json"
                found = json.loads(cached.read_text()) if cached.exists() else {}
                if not all(c.key in found for c in mine):
                    found = measure_side_by_side(model_dirs[model], mine, groups(plan, prompts),
                                                 plan.max_tokens)
                    cached.write_text(json.dumps(found))
                measured.update(found)
                bar.update()
            rows: list[dict[str, Any]] = []
            for config in configs:
                for row in measured[config.key]:
                    row.update(model=config.model, method=config.method, spec=config.spec)
                rows.extend(measured[config.key])
            rounds.append(compare_with_baselines(rows))
    return merge_rounds(rounds)


def started_in_turn(configs: list[BenchConfig], round_index: int) -> list[BenchConfig]:
    """The order a round starts one model's engines in: rotated by the round, so that over
    as many rounds as configurations each is started in every place once (an engine's speed
    can depend on when it was started, for its whole life)."""
    shift = round_index % len(configs) if configs else 0
    return configs[shift:] + configs[:shift]


def measure_side_by_side(model_dir: str, configs: list[BenchConfig], groups: list[Group],
                         max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Every configuration of one model, each in its own engine, all loaded at once
    (:class:`EnginePool`): each group runs on every engine in lock step, a few engine steps
    at a time. Returns each configuration's rows (one per group) by :attr:`BenchConfig.key`."""
    rows: dict[str, list[dict[str, Any]]] = {c.key: [] for c in configs}
    with EnginePool({c.key: (model_dir, c.spec) for c in configs}) as pool:
        for group in groups:
            for name, row in pool.measure(group, max_tokens).items():
                rows[name].append(row)
    return rows


def compare_with_baselines(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speed-up and identity against the same model's ``none`` row (dataset, batch size);
    ``tpf`` is tokens per verify step: decode steps counted, each request's prefill step (which
    verifies no draft) and its token left out; ``tokens_per_step`` keeps them in."""
    baselines = {(r["model"], r["dataset"], r["batch_size"]): r for r in rows
                 if r["method"] == "none"}
    for row in rows:
        against_baseline(row, baselines[(row["model"], row["dataset"], row["batch_size"])])
        row["vllm_acceptance_length"] = row.pop("tpf")
        row["tpf"] = row["tokens_per_verify_step"]
    return rows


def merge_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration × data set × batch size: the first round's row with the
    median tokens/s and median speed-up over rounds (each round's speed-up is paired with
    that round's baseline), the per-round figures, and identity required in every round."""
    if len(rounds) == 1:
        return rounds[0]
    merged = []
    for same in zip(*rounds, strict=True):
        row = dict(same[0])
        row["tokens_per_s_rounds"] = [r["tokens_per_s"] for r in same]
        row["speedup_rounds"] = [r["speedup"] for r in same]
        row["tokens_per_s"] = statistics.median(row["tokens_per_s_rounds"])
        row["speedup"] = statistics.median(row["speedup_rounds"])
        row["identical"] = all(r["identical"] and r["tokens"] == row["tokens"] for r in same)
        merged.append(row)
    return merged
