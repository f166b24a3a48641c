"""``vllm-cllm bench``: its data sets, the baseline comparison, the files it writes, and one
tiny end-to-end run (two engines on the tiny model)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_cllm.bench.datasets import mtbench_questions, sharegpt_questions
from vllm_cllm.bench.engine_pool import turn_order
from vllm_cllm.bench.measure import WARMUP_PROMPT
from vllm_cllm.bench.report import FIELDS, write_results
from vllm_cllm.bench.suite import (
    BenchConfig,
    BenchPlan,
    compare_with_baselines,
    configurations,
    groups,
    merge_rounds,
    run,
    started_in_turn,
)


def test_mtbench_and_sharegpt_come_from_their_wheels():
    questions = mtbench_questions()
    assert len(questions) == 80 and questions[0].startswith("Compose an engaging travel blog")
    sharegpt = sharegpt_questions(300, max_chars=500)
    assert len(sharegpt) == 300 and all(0 < len(q) <= 500 for q in sharegpt)


def test_groups_never_share_a_prompt():
    # vLLM's suffix proposer caches earlier responses: a prompt measured twice flatters it.
    plan = BenchPlan()
    prompts = {d: [f"{d} {i}" for i in range(32)] for d in plan.datasets}
    batches = groups(plan, prompts)
    measured = [p for g in batches for p in g["prompts"]]
    assert len(measured) == len(set(measured)) == 4 * (8 + 8 + 16)
    assert all(g["warmup"] == [WARMUP_PROMPT] * g["batch_size"] for g in batches)
    assert [len(g["prompts"]) for g in batches[:3]] == [8, 8, 16]


def _bench_row(model, method, tokens, tps, steps_tokens=1.0, dataset="gsm", batch=1):
    return {"model": model, "method": method, "dataset": dataset, "batch_size": batch,
            "tokens": tokens, "tokens_per_s": tps, "tpf": 9.9,
            "tokens_per_step": steps_tokens - 0.1, "tokens_per_verify_step": steps_tokens,
            "acceptance_by_position": [0.5, 0.25] if method != "none" else []}


def test_rows_compare_with_the_same_models_baseline():
    rows = compare_with_baselines([
        _bench_row("base", "none", [[1, 2]], 10.0),
        _bench_row("cllm", "none", [[1, 3]], 20.0),
        _bench_row("base", "jacobi", [[1, 2]], 25.0, 2.5),
        _bench_row("cllm", "jacobi", [[1, 2]], 30.0, 3.0)])
    base, cllm = rows[2], rows[3]
    assert base["speedup"] == 2.5 and base["identical"]
    assert cllm["speedup"] == 1.5 and not cllm["identical"]  # differs from cllm's own baseline
    assert cllm["tpf"] == 3.0 and cllm["vllm_acceptance_length"] == 9.9


def test_rounds_merge_into_median_paired_speedups():
    def round_rows(base_tps, jacobi_tps, jacobi_tokens=((1, 2),)):
        return compare_with_baselines([_bench_row("base", "none", [[1, 2]], base_tps),
                                       _bench_row("base", "jacobi",
                                                  [list(t) for t in jacobi_tokens],
                                                  jacobi_tps, 2.0)])

    # the machine slows down in round 2: paired ratios stay 2.0, 2.0, 1.0 -> median 2.0
    merged = merge_rounds([round_rows(10.0, 20.0), round_rows(5.0, 10.0),
                           round_rows(10.0, 10.0)])
    jacobi = merged[1]
    assert jacobi["speedup_rounds"] == [2.0, 2.0, 1.0] and jacobi["speedup"] == 2.0
    assert jacobi["tokens_per_s"] == 10.0 and jacobi["identical"]
    differs = merge_rounds([round_rows(10.0, 20.0), round_rows(10.0, 20.0, ((1, 3),))])
    assert not differs[1]["identical"]  # identity must hold in every round
    assert merge_rounds([round_rows(10.0, 20.0)])[1]["speedup"] == 2.0  # one round: as is


def test_results_files_have_the_documented_fields(tmp_path):
    rows = compare_with_baselines([_bench_row("base", "none", [[1]], 10.0),
                                   _bench_row("base", "jacobi", [[1]], 20.0, 2.0)])
    table = write_results(rows, tmp_path, {"date": "today", "description": "test",
                                           "datasets": ["gsm"]})
    data = json.loads((tmp_path / "results.json").read_text())
    assert [list(r)[:len(FIELDS)] for r in data["rows"]] == [list(FIELDS)] * 2
    assert "tokens" not in data["rows"][0]
    assert "| base jacobi | 2.00x (2.00) |" in table
    assert (tmp_path / "speedup.png").stat().st_size > 0
    assert (tmp_path / "acceptance.png").stat().st_size > 0


def test_the_table_bounds_each_jacobi_cell_against_suffix_by_its_priced_oracle(tmp_path):
    jacobi = {**_bench_row("base", "jacobi", [[1]], 20.0, 2.0), "oracle_tpf": 3.0,
              "oracle_cost_tpf": 2.5, "selection_efficiency": 0.8, "oracle_cost_speedup": 1.5}
    rows = compare_with_baselines([_bench_row("base", "none", [[1]], 10.0),
                                   _bench_row("base", "suffix", [[1]], 25.0, 2.0), jacobi])
    table = write_results(rows, tmp_path, {"date": "today", "description": "test",
                                           "datasets": ["gsm"]})
    # the oracle's 1.5x over the row's 20 tokens/s, against suffix's 25: 1.2x
    assert "| base jacobi | 2.00 / 2.50 / 3.00 (0.80, 1.50x, 1.20x suffix) |" in table


def test_configurations_cover_every_method_and_model():
    configs = configurations(15)
    assert {(c.model, c.method) for c in configs if c.method == "none"} == {
        ("base", "none"), ("cllm", "none"), ("space", "none")}
    assert {c.spec["method"] for c in configs if c.spec} == {"ngram", "suffix", "jacobi",
                                                             "space"}
    assert not any(c.method == "suffix" for c in configurations(15, with_suffix=False))
    rivals = {(c.model, c.method) for c in configs if c.spec and c.spec["method"] != "jacobi"}
    assert {("cllm", "ngram k=8"), ("cllm", "suffix")} <= rivals  # same-model comparison
    assert not any(c.model == "cllm" and c.method in ("ngram k=8", "suffix")
                   for c in configurations(15, quick=True))  # --quick stays a few minutes
    assert BenchPlan.quick().fingerprint() != BenchPlan().fingerprint()
    assert BenchPlan(rounds=3).fingerprint() == BenchPlan().fingerprint()  # rounds reuse it


def test_jacobi_options_go_where_they_apply_and_rename_the_rows():
    from vllm_cllm.bench.suite import with_jacobi_options

    pinned = with_jacobi_options(configurations(15), {"knee_tokens": 24, "floor_tokens": 28})
    changed = [c for c in pinned if c.spec and c.spec.get("knee_tokens") == 24]
    assert {c.model for c in changed} == {"base", "cllm"}
    assert all(c.method == "jacobi k=15 floor_tokens=28 knee_tokens=24" for c in changed)
    # fixed k takes no cost model (it would be refused): left as it is, as is every other method
    untouched = [c for c in pinned if c not in changed]
    assert untouched == [c for c in configurations(15)
                         if not (c.spec and c.method == "jacobi k=15")]


class _FakeEngine:
    """Each step gives every unfinished request two tokens, until it has ``length``."""

    def __init__(self, length: int) -> None:
        self.length, self.requests = length, {}

    def add_request(self, request_id, prompt, params):
        self.requests[request_id] = 0

    def has_unfinished_requests(self):
        return any(n < self.length for n in self.requests.values())

    def step(self):
        from types import SimpleNamespace

        outputs = []
        for request_id, n in self.requests.items():
            if n < self.length:
                self.requests[request_id] = n + 2
                outputs.append(SimpleNamespace(request_id=request_id, prompt_token_ids=[0],
                                               outputs=[SimpleNamespace(token_ids=[n, n + 1])]))
        return outputs


class _FakeLLM:
    def __init__(self, length: int) -> None:
        self.llm_engine = _FakeEngine(length)

    def generate(self, *args, **kwargs):
        return []

    def get_metrics(self):
        return []


def test_a_stepped_measurement_times_only_its_own_steps():
    # the engine pool alternates engines every few steps: the time an engine waits for its
    # turn must not count, and the row must not depend on how the steps were split
    import time

    from vllm_cllm.bench.measure import SteppedMeasurement

    whole = SteppedMeasurement(_FakeLLM(6), ["a", "b", "c"], 2, 6, warmup=[])
    while whole.advance(100):
        pass
    stepped = SteppedMeasurement(_FakeLLM(6), ["a", "b", "c"], 2, 6, warmup=[])
    calls = 0
    while stepped.advance(1):
        calls += 1
        time.sleep(0.02)  # another engine's turn
    assert calls >= 6  # two batches (2 + 1 prompts) of 3 steps each, one step per call
    row, whole_row = stepped.row(), whole.row()
    assert row["tokens"] == whole_row["tokens"] == [[0, 1, 2, 3, 4, 5]] * 3
    assert row["steps"] == [3, 3, 3] and row["batch_size"] == 2
    assert row["seconds"] < 0.02  # the waits between turns are not in it


def test_turn_order_varies_who_runs_first_and_who_follows_whom():
    names = ["a", "b", "c"]
    orders = [turn_order(names, r) for r in range(6)]
    assert all(sorted(o) == names for o in orders)
    assert {o[0] for o in orders} == set(names)
    followers = {(o[i], o[i + 1]) for o in orders for i in range(2)}
    assert ("a", "b") in followers and ("b", "a") in followers
    assert [turn_order(["x", "y"], r) for r in range(4)] == [["x", "y"], ["y", "x"],
                                                            ["y", "x"], ["x", "y"]]


def test_an_engines_setup_runs_in_its_worker_before_the_engine_is_built(monkeypatch):
    """A study's change for one engine (``EnginePool(setups=...)``) goes to that engine's
    worker only, and is in place when the worker builds the engine."""
    from vllm_cllm.bench import engine_pool
    from vllm_cllm.runtime import engine

    done: list[str] = []
    built = []
    monkeypatch.setattr(engine, "with_engine",
                        lambda model, spec, use: built.append((model, list(done))))
    engine_pool._serve(None, "m", None, lambda: done.append("set up"))
    engine_pool._serve(None, "n", None)
    assert built == [("m", ["set up"]), ("n", ["set up"])]

    started: dict[str, Any] = {}

    class Conn:
        def recv(self) -> str:
            return "ready"

        def send(self, message: Any) -> None:
            pass

    class Process:
        def __init__(self, target: Any, args: tuple, daemon: bool) -> None:
            started[args[1]] = args[3]

        def start(self) -> None:
            pass

        def join(self, timeout: float) -> None:
            pass

        def is_alive(self) -> bool:
            return False

    context = SimpleNamespace(Process=Process, Pipe=lambda: (Conn(), Conn()))
    monkeypatch.setattr(engine_pool.mp, "get_context", lambda method: context)
    setup = done.clear
    with engine_pool.EnginePool({"a": ("model a", None), "b": ("model b", None)},
                                {"a": setup}):
        pass
    assert started == {"model a": setup, "model b": None}


def test_each_round_starts_the_engines_in_another_order(monkeypatch, tmp_path):
    """Over as many rounds as configurations, each configuration's engine is started in
    every place once; the rows still come out in the configurations' order."""
    from vllm_cllm.bench import suite

    configs = [BenchConfig("base", "none"), BenchConfig("base", "suffix", {"m": 1}),
               BenchConfig("base", "jacobi k=15", {"m": 2})]
    assert [c.method for c in started_in_turn(configs, 4)] == ["suffix", "jacobi k=15", "none"]
    started = []

    def measured(model_dir, mine, groups, max_tokens):
        started.append([c.method for c in mine])
        return {c.key: [{"dataset": "gsm", "batch_size": 1, "tokens_per_s": 1.0,
                         "tpf": 1.0, "tokens_per_verify_step": 1.0, "tokens": [[1]]}]
                for c in mine}

    monkeypatch.setattr(suite, "measure_side_by_side", measured)
    monkeypatch.setattr(suite, "prompt_sets", lambda plan, tokenizer: {})
    monkeypatch.setattr(suite, "groups", lambda plan, prompts: [])
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda path: None)
    rows = run(BenchPlan(rounds=3), tmp_path, {"base": "unused"}, configs)
    assert started == [["none", "suffix", "jacobi k=15"], ["suffix", "jacobi k=15", "none"],
                       ["jacobi k=15", "none", "suffix"]]
    assert [r["method"] for r in rows] == ["none", "suffix", "jacobi k=15"]


@pytest.mark.engine
def test_tiny_end_to_end_run_is_identical_and_resumes(tiny_path, tmp_path):
    plan = BenchPlan(datasets=("humaneval", "mtbench"), batch_sizes=(1, 4),
                     prompts_per_batch={1: 1, 4: 4}, max_tokens=12, k=4)
    configs = [BenchConfig("base", "none"),
               BenchConfig("base", "jacobi adaptive", {"method": "jacobi",
                                                       "num_speculative_tokens": 4,
                                                       "adaptive": True})]
    rows = run(plan, tmp_path, {"base": tiny_path}, configs)
    assert len(rows) == 2 * 2 * 2
    assert all(r["identical"] for r in rows)
    assert {(r["dataset"], r["batch_size"]) for r in rows} == {
        ("humaneval", 1), ("humaneval", 4), ("mtbench", 1), ("mtbench", 4)}
    # the jacobi engine's candidate log maps to the bench's requests, every verify step
    assert all(r["oracle_coverage"] == 1.0 and r["oracle_chain_breaks"] == 0
               and r["oracle_tpf"] >= r["tpf"] for r in rows
               if r["method"] != "none" and any(s > 1 for s in r["steps"]))
    again = run(plan, tmp_path, {"base": tiny_path}, configs)  # from out/raw, no engine
    assert [r["tokens"] for r in again] == [r["tokens"] for r in rows]


def test_each_batch_size_gets_an_engine_of_its_own(monkeypatch):
    # the same prompts at batch 1 and 8 in one engine: a proposer that remembers earlier
    # outputs would draft the batch-8 answers from the batch-1 ones
    import subprocess
    from types import SimpleNamespace

    from vllm_cllm.bench import measure as benchmarking

    jobs = []

    def fake_run(cmd, input, **kwargs):
        job = json.loads(input)
        jobs.append(job)
        rows = [{"batch_size": g["batch_size"]} for g in job["groups"]]
        return SimpleNamespace(returncode=0, stdout="ROWS " + json.dumps(rows), stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    rows = benchmarking.measure_in_subprocess("m", None, {8: ["a", "b"], 1: ["a"]}, 4)
    assert [r["batch_size"] for r in rows] == [1, 8]
    assert [[g["batch_size"] for g in job["groups"]] for job in jobs] == [[1], [8]]
    shared = [{"batch_size": 1, "prompts": ["a"]}, {"batch_size": 2, "prompts": ["b", "c"]}]
    benchmarking.measure_in_subprocess("m", None, shared, 4)
    assert len(jobs) == 3 and len(jobs[-1]["groups"]) == 2  # a list of groups: one engine


def test_the_serving_comparison_counts_each_counter_once():
    """vLLM exports accepted tokens in total and per position; tokens per verify step and the
    draft length read each counter itself, not every counter whose name begins with it."""
    from scripts import load_script

    serve_compare = load_script("benchmarks/serve_compare.py")
    labels = '{engine="0",model_name="model"}'

    def metrics(drafts: float, tokens: float, accepted: float) -> dict[str, float]:
        return {f"vllm:spec_decode_num_drafts_total{labels}": drafts,
                f"vllm:spec_decode_num_drafts_created{labels}": 1.7e9,
                f"vllm:spec_decode_num_draft_tokens_total{labels}": tokens,
                f"vllm:spec_decode_num_accepted_tokens_total{labels}": accepted,
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}': accepted}

    deltas = serve_compare.counter_deltas(metrics(10, 50, 20), metrics(30, 130, 50))
    assert deltas == {"num_drafts": 20, "num_draft_tokens": 80, "num_accepted_tokens": 30}
    row = {"config": "jacobi", "concurrency": 1, "output_tok_s": 1.0, "requests": 1,
           "identical": 1, **deltas}
    [summary] = serve_compare.summarise([row])
    assert summary["acceptance_length"] == 1 + 30 / 20 and summary["draft_length"] == 80 / 20


def test_the_serving_comparison_takes_medians_of_per_round_ratios():
    """Servers measured in turn: a ratio is taken within each round (the machine slows down
    in round 1 for all of them), then its median over rounds."""
    from scripts import load_script

    serve_compare = load_script("benchmarks/serve_compare.py")
    speeds = {"none": (100, 50, 100), "suffix": (200, 100, 200), "jacobi": (220, 120, 180)}
    rows = [{"config": name, "concurrency": 8, "round": r, "output_tok_s": tok_s,
             "requests": 4, "identical": 4, "num_drafts": 0}
            for name, per_round in speeds.items() for r, tok_s in enumerate(per_round)]
    by = {s["config"]: s for s in serve_compare.summarise(rows)}
    assert by["jacobi"]["vs_suffix"] == pytest.approx(1.1)  # of 1.1, 1.2 and 0.9
    assert by["jacobi"]["speedup"] == pytest.approx(2.2)  # of 2.2, 2.4 and 1.8
    assert by["jacobi"]["output_tok_s"] == 180 and by["jacobi"]["requests"] == 12
    assert by["jacobi"]["identical"] == 12 and by["jacobi"]["acceptance_length"] is None
