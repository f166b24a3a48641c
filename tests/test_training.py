"""CLLM training pieces on the tiny model: trajectories, losses, one training run (seconds)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from vllm_cllm.training.losses import ar_loss, block_mask, consistency_loss
from vllm_cllm.training.trajectories import (
    build_records,
    jacobi_states,
    noise_states,
    read_trajectories,
    write_trajectories,
)

N = 8


@pytest.fixture(scope="module")
def tiny(tiny_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    prompt = tokenizer("def add(a, b):\n    return")["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=3 * N, do_sample=False,
                             min_new_tokens=3 * N)
    return model, prompt, out[0, len(prompt):].tolist()


def test_noise_states_keep_a_shrinking_correct_prefix():
    fixed = np.arange(100, 100 + N)
    states = noise_states(np.arange(50), fixed, np.random.default_rng(0), levels=4)
    kept = [next((i for i in range(N) if s[i] != fixed[i]), N) for s in states]
    assert kept == sorted(kept, reverse=True) and all(k < N for k in kept)


def test_real_jacobi_iterates_converge_to_the_greedy_block(tiny):
    model, prompt, answer = tiny
    context = np.asarray(prompt + answer[:N])
    fixed = np.asarray(answer[N:2 * N])
    states = jacobi_states(model, context, fixed, np.random.default_rng(0), max_states=N + 1)
    assert 1 <= len(states) <= N
    assert all(len(s) == N for s in states) and states[-1] != fixed.tolist()
    # Jacobi iteration fixes at least one more leading token each step
    correct = [next((i for i in range(N) if s[i] != fixed[i]), N) for s in states]
    assert correct == sorted(correct) and correct[0] < N


def test_records_are_deterministic_and_resumable(tiny, tmp_path):
    _, prompt, answer = tiny
    a = build_records(0, prompt, answer, n=N, mode="noise", seed=5, max_states=3)
    b = build_records(0, prompt, answer, n=N, mode="noise", seed=5, max_states=3)
    assert [r.states for r in a] == [r.states for r in b] and len(a) == 3
    path = tmp_path / "traj.jsonl"
    items = [(prompt, answer), (prompt, answer[:2 * N])]
    first = write_trajectories(path, items[:1], n=N, mode="noise", seed=5, max_states=3)
    second = write_trajectories(path, items, n=N, mode="noise", seed=5, max_states=3)
    assert (first, second) == (3, 2)  # the second call only adds the new prompt
    records = read_trajectories(path)
    assert [r.prompt_id for r in records] == [0, 0, 0, 1, 1]
    assert records[1].context_ids == prompt + answer[:N]


def test_consistency_loss_is_zero_at_agreement_and_trains_only_the_student():
    teacher = torch.randn(2, N, 11)
    student = teacher.clone().requires_grad_(True)
    mask = torch.ones(2, N, dtype=torch.bool)
    assert consistency_loss(student, teacher, mask).item() == pytest.approx(0.0, abs=1e-6)
    teacher_param = teacher.clone().requires_grad_(True)
    moved = (student + torch.randn_like(student)).detach().requires_grad_(True)
    loss = consistency_loss(moved, teacher_param, mask)
    loss.backward()
    assert loss.item() > 0 and moved.grad is not None and teacher_param.grad is None


def test_block_mask_starts_after_first_difference():
    fixed = torch.tensor([[1, 2, 3, 4]])
    states = torch.tensor([[1, 9, 3, 4]])
    assert block_mask(states, fixed).tolist() == [[False, False, True, True]]


def test_ar_loss_matches_transformers(tiny):
    model, prompt, answer = tiny
    ids = torch.tensor([prompt + answer])
    labels = torch.tensor([[-100] * len(prompt) + answer])
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels).loss
        mine = ar_loss(model(input_ids=ids).logits, labels)
    assert mine.item() == pytest.approx(ref.item(), rel=1e-4)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_training_steps_write_a_loadable_checkpoint(tiny, tiny_path, tmp_path, lora_rank):
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.cllm import CllmConfig, train_cllm

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=1, max_states=2)
    config = CllmConfig(block_size=N, max_steps=2, grad_accum=1, logging_steps=1,
                        lora_rank=lora_rank, learning_rate=1e-3)
    path = train_cllm(tiny_path, records, tmp_path / "run", config)
    trained = AutoModelForCausalLM.from_pretrained(path)
    assert (path / "tokenizer.json").exists()
    assert (tmp_path / "run" / "adapter").exists() == bool(lora_rank)
    history = json.loads((tmp_path / "run" / "log_history.json").read_text())
    assert any("loss_consistency" in h for h in history)
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    changed = any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(),
                                                        base.state_dict().values(),
                                                        strict=True))
    assert changed
