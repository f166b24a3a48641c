"""benchmarks/host_cost.py's core on a tiny batch, vocabulary and text: one row per proposer
and batch size, positive times, and drafts accepted where the text repeats. No engine."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from scripts import load_script


def _host_cost():
    return load_script("benchmarks/host_cost.py")


def _repeating_pool(host_cost, vocab: int, prompt_len: int = 48, answer_len: int = 40):
    """Requests whose prompt and answer repeat one 24-token phrase: every lookup hits."""
    phrase = np.random.default_rng(0).integers(0, vocab - 1, 24)  # never the mask token

    def make() -> list:
        tokens = np.tile(phrase, (prompt_len + answer_len) // len(phrase) + 1)
        return [host_cost.Request(tokens[:prompt_len + answer_len].astype(np.int32), prompt_len)
                for _ in range(8)]

    return host_cost.RequestPool(make)


#: Set in the child interpreter the test runs in: vLLM's ngram proposer imports numba, and
#: numba in a process makes every later in-process vLLM 0.32 engine fail at start-up.
CHILD = "VLLM_CLLM_HOST_COST_CHILD"


def _in_child(test: str) -> bool:
    """Run ``test`` of this file in a child interpreter (True: this is the parent, done)."""
    if os.environ.get(CHILD) == "1":
        return False
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::{test}"], env={**os.environ, CHILD: "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return True


def test_every_proposer_and_batch_gets_a_row_with_drafts_accepted():
    if _in_child("test_every_proposer_and_batch_gets_a_row_with_drafts_accepted"):
        return
    host_cost = _host_cost()
    names = list(host_cost.PROPOSERS)
    if host_cost.suffix_missing():
        names.remove("suffix")
    settings = host_cost.Settings(batch_sizes=(1, 3), steps=12, warmup=3, vocab=512,
                                  max_model_len=256, proposers=names)
    rows, profiles = host_cost.measure(_repeating_pool(host_cost, 512), settings, progress=False)
    assert profiles == {}
    assert sorted((r["proposer"], r["batch_size"]) for r in rows) == sorted(
        (n, b) for n in names for b in (1, 3))
    for row in rows:
        assert row["propose_us"] > 0 and row["steps_timed"] == 12, row
        assert row["tokens_per_step"] == pytest.approx(1 + row["accepted_per_step"])
        assert 0 <= row["accepted_per_step"] <= row["drafted_per_step"] <= 2 * settings.k
        if row["proposer"] in host_cost.OWN:
            assert 0 < row["capture_us"] < row["propose_us"], row
    accepted = {(r["proposer"], r["batch_size"]): r["accepted_per_step"] for r in rows}
    for name in ("jacobi", "jacobi fixed", "ngram", "suffix"):
        if name in names:
            assert accepted[name, 3] > 1, (name, accepted)
    table = host_cost.table(rows)
    assert "| jacobi fixed |" in table and "batch 3" in table


def test_a_draft_is_accepted_up_to_its_first_token_off_the_text():
    """The verify step: the accepted prefix, then the text's next token (vLLM's bonus)."""
    if _in_child("test_a_draft_is_accepted_up_to_its_first_token_off_the_text"):
        return
    host_cost = _host_cost()
    tokens = np.arange(100, 140, dtype=np.int32)
    pool = host_cost.RequestPool(lambda: [host_cost.Request(tokens, 10)])
    settings = host_cost.Settings(vocab=512, max_model_len=64, proposers=("ngram",))
    run = host_cost.Run("ngram", 1, pool, settings, None)
    run.step(timed=False)  # prefill: commits text[10]
    slot = run.slots[0]
    assert slot.pos == 11
    slot.draft = [111, 112, 999, 114]  # right, right, wrong, (right but after a rejection)
    run.step(timed=True)
    assert slot.pos == 14 and run.accepted == [2] and run.drafted == [4]
    assert run.token_ids[0, :14].tolist() == tokens[:14].tolist()
