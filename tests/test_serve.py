"""The documented serve command with ``jacobi``: same text as offline plain greedy, metrics."""

from __future__ import annotations

import json
import time

import pytest
import requests

from vllm_cllm.runtime.engine import with_engine
from vllm_cllm.runtime.server import read_metrics, running_server

pytestmark = [pytest.mark.engine, pytest.mark.server]

PROMPTS = ["def is_prime(n):\n", "The three primary colors are"]
QUESTION = "Name three animals that live in the ocean."
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def offline(smollm2_path):
    """Plain greedy (no speculation) texts, from an in-process engine."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    def run(llm):
        texts = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        chat = llm.chat([{"role": "user", "content": QUESTION}], params, use_tqdm=False)
        return texts, chat[0].outputs[0].text

    return with_engine(smollm2_path, None, run)


@pytest.fixture(scope="module")
def served(smollm2_path, offline, tmp_path_factory):
    spec = json.dumps({"method": "jacobi", "num_speculative_tokens": 8})
    log = str(tmp_path_factory.mktemp("serve") / "server.log")
    with running_server(smollm2_path, "--speculative-config", spec, log_path=log,
                        extra_env={"VLLM_LOG_STATS_INTERVAL": "1"}) as base:
        texts = []
        for prompt in PROMPTS:
            resp = requests.post(base + "/v1/completions", timeout=120, json={
                "model": "model", "prompt": prompt, "max_tokens": MAX_TOKENS,
                "temperature": 0.0})
            resp.raise_for_status()
            texts.append(resp.json()["choices"][0]["text"])
        chat = requests.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "model", "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "messages": [{"role": "user", "content": QUESTION}]})
        chat.raise_for_status()
        metrics = read_metrics(base)
        time.sleep(2)  # let the periodic stats logger print once more
    with open(log) as f:
        server_log = f.read()
    return texts, chat.json()["choices"][0]["message"]["content"], metrics, server_log


def test_completions_match_offline_plain_greedy(offline, served):
    assert served[0] == offline[0]


def test_chat_matches_offline_plain_greedy(offline, served):
    assert served[1] == offline[1]


def test_spec_decode_counters_are_exported(served):
    metrics = served[2]

    def total(name):
        return sum(v for k, v in metrics.items() if k.split("{")[0] == name)

    assert total("vllm:spec_decode_num_drafts_total") > 0
    assert total("vllm:spec_decode_num_draft_tokens_total") > 0
    assert total("vllm:spec_decode_num_accepted_tokens_total") > 0


def test_server_used_the_jacobi_proposer_and_logged_acceptance(served):
    server_log = served[3]
    assert "vllm_cllm.proposers.jacobi.JacobiProposer" in server_log
    assert "SpecDecoding metrics" in server_log and "Mean acceptance length" in server_log
