"""The bench's oracle (vllm_cllm/bench/oracle.py): its arithmetic on known candidates and a
known output, and the candidate log (vllm_cllm/policies/candidate_log.py) that feeds it,
which must leave every draft as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests import fakes
from vllm_cllm.bench.oracle import oracle_fields, read_log
from vllm_cllm.core.tokens import matched_prefix
from vllm_cllm.policies.candidate_log import CANDIDATE_LOG_ENV


def _line(step, requests, batch=1, knee=24.0, floor=28.0):
    return {"step": step, "batch": batch, "knee": knee, "floor": floor,
            "requests": [{"id": rid, "num_tokens": n, "room": 4, "candidates": c, "drafted": d}
                         for rid, n, c, d in requests]}


PROMPT, OUTPUT = [1, 2, 3], [10, 11, 12, 13, 14, 15]


def _one_request_log():
    """Prompt of 3 tokens, output of 6 (the prefill step's token, then three verify steps):
    step 1 drafts one token of a candidate that would have had 2 accepted while the n-grams
    would have had 4; step 2 drafts nothing where the tail would have had 2 (of 3 matching:
    the output then has 3 tokens left, one the step's own); step 3 drafts the tail, cut by
    the output's end."""
    rid = "measure-a-1a2b3c4d"  # vLLM's engine-core id: the bench's id and 8 characters
    return [
        _line(1, [(rid, 4, {"suffix": [11, 12, 99], "ngram": [11, 12, 13, 14], "tail": [50]},
                   [11])]),
        _line(2, [(rid, 6, {"suffix": [], "ngram": [13, 77], "tail": [13, 14, 15]}, [])]),
        _line(3, [(rid, 7, {"tail": [14, 15, 16]}, [14, 15, 16])]),
        _line(4, [(rid, 9, {"tail": [1, 2]}, [1, 2])]),  # after the end: no step
        _line(4, [("warmup-x-00000000", 5, {"tail": [1]}, [1])]),  # not the row's
    ]


def test_the_oracle_drafts_each_steps_best_candidate():
    fields = oracle_fields(_one_request_log(), ["measure-a"], [PROMPT], [OUTPUT], [4])
    # the row: 5 tokens after the first in 3 verify steps; the oracle: 1 + 4, 1 + 2, 1 + 1
    assert fields["oracle_tpf"] == pytest.approx(10 / 3)
    assert fields["oracle_cost_tpf"] == pytest.approx(10 / 3)  # batch 1: the same choices
    assert fields["selection_efficiency"] == pytest.approx(0.5)
    assert fields["oracle_coverage"] == 1.0 and fields["oracle_chain_breaks"] == 0
    # the distance, 5/3: step 1 drafted the right candidates' prefix, cut (sizing, 3 tokens);
    # step 2 drafted nothing (2 tokens)
    assert fields["oracle_gap_selection"] == pytest.approx(0.0)
    assert fields["oracle_gap_sizing"] == pytest.approx(1.0)
    assert fields["oracle_gap_undrafted"] == pytest.approx(2 / 3)
    # priced at knee 24, floor 28: the row's steps drafted 1, 0 and 3 tokens (28, 28, 28.25
    # for 2 + 1 + 2 tokens), the oracle's 4, 2 and 1 (29.25, 28, 28 for 5 + 3 + 2)
    assert fields["oracle_cost_speedup"] == pytest.approx((10 / 85.25) / (5 / 84.25))


def test_calibration_is_the_accepted_draft_tokens_over_the_expected_ones():
    log = _one_request_log()
    assert oracle_fields(log, ["measure-a"], [PROMPT], [OUTPUT], [4])[
        "acceptance_calibration"] is None  # no expectations logged (fixed k)
    # step 1's draft [11] is accepted (1 token); step 3's [14, 15, 16] has 1 token left to
    # be accepted (the output ends): 2 accepted where 0.5 + 3.5 were expected
    log[0]["requests"][0]["expected"], log[2]["requests"][0]["expected"] = 0.5, 3.5
    fields = oracle_fields(log, ["measure-a"], [PROMPT], [OUTPUT], [4])
    assert fields["acceptance_calibration"] == pytest.approx(2 / 4)


def test_a_step_left_unlogged_keeps_its_own_tokens():
    log = [line for line in _one_request_log() if line["step"] != 2]
    fields = oracle_fields(log, ["measure-a"], [PROMPT], [OUTPUT], [4])
    assert fields["oracle_tpf"] == pytest.approx((5 + 3 + 0) / 3)
    assert fields["oracle_coverage"] == pytest.approx(2 / 3)
    assert fields["oracle_chain_breaks"] == 1  # positions 1 -> 4 skip the unlogged step


def test_the_cost_model_oracle_prices_the_whole_batch():
    # batch 16, knee 24, floor 28: plain decoding makes 16 tokens for 40; 2 more tokens for
    # 46 do not pay (0.391 < 0.4), 6 more for 50 do (0.44). Two requests of the row, each
    # five verify steps of one token, the first of them logged.
    def fields(extra):
        outputs = [[5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24, 25]]
        log = [_line(1, [(f"r{i}", 3, {"tail": out[1:1 + extra]}, []) for i, out in
                         enumerate(outputs)], batch=16)]
        return oracle_fields(log, ["r0", "r1"], [[0, 0]] * 2, outputs, [6, 6])

    few, many = fields(1), fields(3)
    assert few["oracle_tpf"] == pytest.approx((10 + 2) / 10)
    assert few["oracle_cost_tpf"] == pytest.approx(10 / 10)  # not worth drafting
    assert few["selection_efficiency"] == pytest.approx(1.0)
    assert few["oracle_cost_speedup"] == pytest.approx(1.0)  # both draft nothing
    # the oracle's 6 tokens for 24 + 16 * 1.25 + 6 = 50 against the row's 16 for 40
    assert many["oracle_cost_speedup"] == pytest.approx((22 / 50) / (16 / 40))
    assert many["oracle_tpf"] == many["oracle_cost_tpf"] == pytest.approx((10 + 6) / 10)
    assert many["oracle_coverage"] == pytest.approx(0.2)


def test_rows_without_a_log_line_get_no_oracle():
    fields = oracle_fields([], ["measure-a"], [PROMPT], [OUTPUT], [4])
    assert set(fields.values()) == {None}


def test_fixed_order_rows_are_measured_against_the_full_length_oracle():
    log = _one_request_log()
    for line in log:
        line["knee"] = line["floor"] = None
    fields = oracle_fields(log, ["measure-a"], [PROMPT], [OUTPUT], [4])
    assert fields["oracle_cost_tpf"] is None and fields["oracle_cost_speedup"] is None
    assert fields["selection_efficiency"] == pytest.approx(0.5)


def _text(seed=0, size=480):
    """A text with repeats (the n-grams and the lookup find some of it), and new stretches."""
    rng = np.random.default_rng(seed)
    part = rng.integers(5, 45, 24).tolist()
    text: list[int] = []
    while len(text) < size:
        cut = int(rng.integers(6, 24))
        text += part[:cut] + rng.integers(5, 45, int(rng.integers(4, 16))).tolist()
    return text[:size]


def _drafts_of(proposer, ids, steps, text, start=8):
    """Verify steps of requests ``ids`` that all follow ``text``, as
    tests/fakes.verify_and_propose runs them (the target predicts the text, so a draft is
    accepted as far as it matches), but with the predictions past the accepted prefix (the
    Jacobi tail) wrong here and there; every step's drafts, and the requests' lengths."""
    tokens = np.array([text] * len(ids))
    lengths, drafts, made = [start] * len(ids), [[] for _ in ids], []
    for _ in range(steps):
        accepted = [matched_prefix(np.array(d, dtype=np.int64), text[n:n + len(d)])
                    for d, n in zip(drafts, lengths, strict=True)]
        rows = []
        for n, d, a in zip(lengths, drafts, accepted, strict=True):
            row = list(text[n:n + len(d) + 1])
            row[a + 1:] = [0 if (n + p) % 7 == 3 else t
                           for p, t in enumerate(row[a + 1:], start=a + 1)]
            rows.append(row)
        proposer.retain_requests(set(ids), set(ids))
        proposer.predictions = fakes.predictions(ids, rows)
        committed = [text[n:n + a + 1] for n, a in zip(lengths, accepted, strict=True)]
        lengths = [n + a + 1 for n, a in zip(lengths, accepted, strict=True)]
        drafts = proposer.propose(committed, np.array(lengths), tokens)
        made.append(drafts)
    return made, lengths


@pytest.mark.parametrize("batch", [1, 6])  # the small-step path and the grid path
@pytest.mark.parametrize("adaptive", [True, False])
def test_the_candidate_log_leaves_every_draft_as_it_was(tmp_path, monkeypatch, batch, adaptive):
    text = _text()
    ids = [f"req{i}-0000000{i}" for i in range(batch)]
    monkeypatch.delenv(CANDIDATE_LOG_ENV, raising=False)

    plain, _ = _drafts_of(fakes.jacobi(k=8, max_model_len=600, adaptive=adaptive), ids, 40,
                          text)
    path = tmp_path / "candidates.jsonl"
    monkeypatch.setenv(CANDIDATE_LOG_ENV, str(path))
    logged, lengths = _drafts_of(fakes.jacobi(k=8, max_model_len=600, adaptive=adaptive), ids,
                                 40, text)
    assert logged == plain
    assert sum(len(d) for step in plain for d in step) > 40  # it did draft
    lines = read_log(str(path))
    assert len(lines) == 40 and {r["id"] for line in lines for r in line["requests"]} == set(ids)
    assert all((line["knee"] is not None) == adaptive for line in lines)
    assert json.loads(path.read_text().splitlines()[0])["step"] == 1
    # the log maps back to the outputs: every verify step logged, the positions chained
    start = 8
    outputs = [text[start:n] for n in lengths]
    fields = oracle_fields(lines, [i.rsplit("-", 1)[0] for i in ids], [text[:start]] * batch,
                           outputs, [40] * batch)
    assert fields["oracle_coverage"] == 1.0 and fields["oracle_chain_breaks"] == 0
    tpf = sum(len(o) - 1 for o in outputs) / (39 * batch)
    assert fields["oracle_tpf"] >= tpf and fields["selection_efficiency"] <= 1.0
    assert fields["oracle_tpf"] - tpf == pytest.approx(
        fields["oracle_gap_selection"] + fields["oracle_gap_sizing"]
        + fields["oracle_gap_undrafted"])
    # the adaptive policy logs what it expected of each draft: a share of its tokens
    drafted = [r for line in lines for r in line["requests"] if r["drafted"]]
    if adaptive:
        assert all(0 < r["expected"] <= len(r["drafted"]) for r in drafted)
        assert 0 < fields["acceptance_calibration"]
    else:
        assert not any("expected" in r for r in drafted)
        assert fields["acceptance_calibration"] is None


def test_the_policies_of_one_step_share_its_number(tmp_path):
    from vllm_cllm.policies.candidate_log import CandidateLog

    log = CandidateLog(str(tmp_path / "log.jsonl"))
    first = fakes.step([[1, 2, 3], [4, 5, 6]], [[3], [6]])
    tail = {"tail": [np.array([7, 8]), np.array([9])]}
    log.record(first, [0], {"tail": tail["tail"][:1]}, [np.array([7])], (24.0, 28.0))
    log.record(first, [1], {"tail": tail["tail"][1:]}, [np.array([], dtype=np.int64)],
               extra={0: np.array([5, 5])}, extra_name="restart")
    log.record(fakes.step([[1, 2, 3, 7]], [[7]]), [0], {"tail": [np.array([8])]},
               [np.array([8])])
    log.close()
    lines = read_log(str(tmp_path / "log.jsonl"))
    assert [line["step"] for line in lines] == [1, 1, 2]
    assert [line["batch"] for line in lines] == [2, 2, 1]
    assert lines[0]["knee"] == 24.0 and lines[1]["knee"] is None
    assert lines[1]["requests"] == [{"id": "r1", "num_tokens": 3, "room": 4, "drafted": [],
                                     "candidates": {"tail": [9], "restart": [5, 5]}}]
