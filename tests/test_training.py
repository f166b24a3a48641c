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


def test_shifted_states_are_the_fixed_point_one_late_or_noise_behind_a_correct_prefix():
    fixed, context = np.arange(100, 100 + N), np.arange(50)
    states = noise_states(context, fixed, np.random.default_rng(0), levels=N, shifted=True)
    assert len(states) == N
    kinds = set()
    for s in states:
        keep = next(i for i in range(N) if s[i] != fixed[i])
        assert s[:keep] == fixed[:keep].tolist()
        if s[keep:] == [49 if keep == 0 else fixed[keep - 1], *fixed[keep:N - 1]]:
            kinds.add("late")  # 49 is the context's last token
        else:
            assert all(t < 50 for t in s[keep:])
            kinds.add("context")
    assert kinds == {"late", "context"}


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
    other = tmp_path / "other.jsonl"  # another file's prompt 0 is another prompt
    write_trajectories(other, items[1:], n=N, mode="noise", seed=5, max_states=2)
    together = read_trajectories(path, other)
    assert [r.prompt_id for r in together] == [0, 0, 0, 1, 1, 2, 2]
    assert [r.states for r in together] == [r.states for r in records + read_trajectories(other)]
    # a slice of the problems from the first-th on: the records of those prompts in the file
    # of them all (prompt ids and the noise drawn for them)
    sliced = tmp_path / "sliced.jsonl"
    write_trajectories(sliced, items[1:], n=N, mode="noise", seed=5, max_states=3, first=1)
    assert sliced.read_text().splitlines() == path.read_text().splitlines()[3:]


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
    # window 1: only the position right behind the first wrong token
    assert block_mask(states, fixed, window=1).tolist() == [[False, False, True, False]]
    assert block_mask(fixed, fixed, window=2).tolist() == [[False] * 4]  # nothing differs


def test_position_weights_decay_behind_the_first_wrong_token():
    from vllm_cllm.training.losses import position_weights

    mask = torch.tensor([[False, True, True, True], [False, False, False, False]])
    assert position_weights(mask, 0.5).tolist() == [[0.0, 1.0, 0.5, 0.25], [0.0] * 4]
    assert torch.equal(position_weights(mask, 1.0), mask.float())


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_base_anchor_teaches_the_untrained_model_its_own_clean_output(tiny, tiny_path,
                                                                       lora_rank):
    """Before training, the frozen base's teacher equals the model's own clean output: the AR
    anchor (KL to the base on the clean answer) is zero, every clean greedy token is the
    base's, and both anchors give the same consistency loss; the gradient reaches the student
    only."""
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.cllm import CllmConfig, cllm_loss, collate
    from vllm_cllm.training.packing import pack_prompt
    from vllm_cllm.training.trainer import with_lora

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=3, max_states=3)
    short = build_records(0, prompt, answer[:2 * N], n=N, mode="noise", seed=4, max_states=2)
    batch = collate([pack_prompt(records), pack_prompt(short)])  # clean parts of two widths
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    base = None
    if lora_rank:
        model = with_lora(model, lora_rank, lora_rank)
    else:
        base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    anchored, parts = cllm_loss(model, batch, CllmConfig(anchor="base", ar_weight=1.0), base)
    _, own = cllm_loss(model, batch, CllmConfig(anchor="self", ar_weight=1.0))
    assert parts["ar"] == pytest.approx(0.0, abs=1e-5)
    assert parts["greedy_agreement"] == 1.0 and "greedy_agreement" not in own
    assert parts["consistency"] == pytest.approx(own["consistency"], rel=1e-4)
    assert parts["consistency"] > 0
    anchored.backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert base is None or all(p.grad is None for p in base.parameters())


def test_margin_hinge_pushes_only_where_the_greedy_token_barely_wins():
    from vllm_cllm.training.cllm import greedy_margin_hinge

    logits = torch.zeros(1, 3, 5, requires_grad=True)
    with torch.no_grad():
        logits[0, 0, 1] = 5.0  # predicts label 1 by a margin of 5
        logits[0, 1, 2], logits[0, 1, 3] = 1.0, 0.5  # label 2 wins by only 0.5
    labels = torch.tensor([[-100, 1, 2]])  # logits at t are scored against labels[t + 1]
    hinge = greedy_margin_hinge(logits, labels, margin=2.0)
    assert hinge.item() == pytest.approx((0.0 + 1.5) / 2)
    hinge.backward()
    assert logits.grad[0, 0].abs().sum() == 0 and logits.grad[0, 1, 2] < 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_base_anchored_loss_on_the_gpu_equals_the_cpu_one(tiny, tiny_path):
    """Every tensor the base-anchored loss builds lives on the model's device: on CUDA it
    gives the CPU's loss parts."""
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.cllm import CllmConfig, cllm_loss, collate
    from vllm_cllm.training.packing import pack_prompt
    from vllm_cllm.training.trainer import with_lora

    _, prompt, answer = tiny
    batch = collate([pack_prompt(build_records(0, prompt, answer, n=N, mode="noise", seed=3,
                                               max_states=2))])
    model = with_lora(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), 4, 4)
    config = CllmConfig(anchor="base", ar_weight=1.0)
    _, on_cpu = cllm_loss(model, batch, config)
    _, on_gpu = cllm_loss(model.cuda(), {k: v.cuda() for k, v in batch.items()}, config)
    assert on_gpu == pytest.approx(on_cpu, rel=1e-3, abs=1e-5)


def test_base_anchored_margin_holds_the_base_models_greedy_token(tiny, tiny_path):
    """With the base as anchor the hinge scores the base's greedy token on the clean answer
    (the answer a round trains on may be the drifted model's own, not the base's)."""
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.cllm import CllmConfig, cllm_loss, collate, margin_hinge
    from vllm_cllm.training.packing import pack_prompt
    from vllm_cllm.training.trainer import with_lora

    _, prompt, greedy = tiny
    answer = [t + 1 for t in greedy]  # a drifted answer: not the base's greedy tokens
    batch = collate([pack_prompt(build_records(0, prompt, answer, n=N, mode="noise", seed=3,
                                               max_states=2))])
    model = with_lora(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), 4, 4)
    config = {"ar_weight": 1.0, "margin_weight": 1.0, "margin": 50.0}
    _, anchored = cllm_loss(model, batch, CllmConfig(anchor="base", **config))
    _, own = cllm_loss(model, batch, CllmConfig(anchor="self", **config))
    with torch.no_grad():
        clean = model(input_ids=torch.tensor([prompt + answer])).logits[0]
    z = clean[len(prompt) - 1:-1]  # the predictions of the answer's tokens
    expected = margin_hinge(z, z.argmax(-1), 50.0)
    assert anchored["margin"] == pytest.approx(float(expected), rel=1e-4)
    assert own["margin"] == pytest.approx(float(margin_hinge(z, torch.tensor(answer), 50.0)),
                                          rel=1e-4)
    assert own["margin"] > anchored["margin"]


def test_repeated_ngram_ends_mark_the_tokens_that_lower_distinct_n():
    from vllm_cllm.training.quality import distinct_n, repeated_ngram_ends

    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 4]
    ends = repeated_ngram_ends(tokens, 2)
    assert ends == [False, False, False, False, True, True, True, True, False]
    grams = len(tokens) - 1
    assert distinct_n(tokens, 2) == pytest.approx((grams - sum(ends)) / grams)


def test_repeat_excess_pulls_only_repeats_the_student_is_surer_of():
    from vllm_cllm.training.losses import repeat_excess

    reference = torch.zeros(3, 4)
    reference[:, 0] = 2.0  # the reference's p(token 0) at every position
    student = reference.clone().requires_grad_(True)
    with torch.no_grad():
        student[0, 0] = 4.0  # surer of the repeat at position 0
        student[1, 0] = 0.0  # less sure at position 1
        student[2, 0] = 4.0  # surer at position 2, which is no repeat
    targets = torch.zeros(3, dtype=torch.long)
    repeats = torch.tensor([True, True, False])
    loss = repeat_excess(student, reference, targets, repeats)
    log_ratio = (torch.log_softmax(student.detach(), -1) - torch.log_softmax(reference, -1))[0, 0]
    assert float(loss.detach()) == pytest.approx(float(log_ratio) / 3)
    loss.backward()
    assert student.grad[0, 0] > 0 and student.grad[1:].abs().sum() == 0


def test_base_anchored_repeat_term_scores_the_answers_repeats(tiny, tiny_path):
    """The repeat term is logged, adds to the loss, and is refused without the base anchor."""
    from transformers import AutoModelForCausalLM

    from vllm_cllm.training.cllm import CllmConfig, cllm_loss, collate, train_cllm
    from vllm_cllm.training.losses import repeat_mask
    from vllm_cllm.training.packing import pack_prompt
    from vllm_cllm.training.quality import repeated_ngram_ends
    from vllm_cllm.training.trainer import with_lora

    _, prompt, greedy = tiny
    answer = (greedy[:4] * 4)[:len(greedy)]  # a looping answer
    batch = collate([pack_prompt(build_records(0, prompt, answer, n=N, mode="noise", seed=3,
                                               max_states=2))])
    repeats = repeat_mask(batch["labels"], 2)
    marked = repeats[0, len(prompt):len(prompt) + len(answer)]
    assert marked.tolist() == repeated_ngram_ends(answer, 2)
    assert marked.any() and not repeats[0, :len(prompt)].any()
    assert not repeats[0, len(prompt) + len(answer):].any()
    model = with_lora(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32), 4, 4)
    torch.manual_seed(0)
    for parameter in model.parameters():  # a trained adapter: the student differs from the base
        if parameter.requires_grad:
            parameter.data.normal_(0, 0.2)
    plain, parts = cllm_loss(model, batch, CllmConfig(anchor="base", repeat_ngram=2))
    with_repeats, repeat_parts = cllm_loss(
        model, batch, CllmConfig(anchor="base", repeat_weight=2.0, repeat_ngram=2))
    assert "repeat" not in parts and repeat_parts["repeat"] > 0
    assert float(with_repeats - plain) == pytest.approx(2.0 * repeat_parts["repeat"], rel=1e-4)
    with pytest.raises(ValueError, match="anchor 'base'"):
        train_cllm(tiny_path, [], "/nonexistent", CllmConfig(anchor="self", repeat_weight=1.0))


def test_ar_loss_matches_transformers(tiny):
    model, prompt, answer = tiny
    ids = torch.tensor([prompt + answer])
    labels = torch.tensor([[-100] * len(prompt) + answer])
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels).loss
        mine = ar_loss(model(input_ids=ids).logits, labels)
    assert mine.item() == pytest.approx(ref.item(), rel=1e-4)


@pytest.mark.parametrize("consistency", ["global", "local"])
def test_packed_forward_equals_separate_student_and_teacher_passes(tiny, consistency):
    """One packed row gives the same logits as context+state and context+target forwards."""
    from vllm_cllm.training.cllm import collate
    from vllm_cllm.training.packing import pack_prompt

    model, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=3, max_states=3)
    example = pack_prompt(records, consistency=consistency)
    batch = collate([example, pack_prompt(records[:1])])  # a padded second row
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits
        flat = packed.reshape(-1, packed.shape[-1])
        rows = 0
        for r in records:
            for i, state in enumerate(r.states):
                local = consistency == "local" and i + 1 < len(r.states)
                target = r.states[i + 1] if local else r.fixed_point
                start = len(r.context_ids)
                # a state is packed from its first wrong token: its loss positions match
                keep = batch["loss_mask"][rows]
                for tokens, index, where in ((state, batch["student_index"][rows], keep),
                                             (target, batch["teacher_index"][rows],
                                              torch.ones_like(keep))):
                    ref = model(input_ids=torch.tensor([r.context_ids + tokens])).logits[0]
                    torch.testing.assert_close(flat[index][where],
                                               ref[start:start + N - 1][where],
                                               atol=1e-4, rtol=1e-4)
                rows += 1
        clean = model(input_ids=torch.tensor([prompt + answer])).logits
        torch.testing.assert_close(packed[0, :len(prompt + answer)], clean[0],
                                   atol=1e-4, rtol=1e-4)
    assert rows == len(example.student_index)
    labels = batch["labels"][0]
    assert labels[len(prompt):len(prompt + answer)].tolist() == answer
    assert (labels[:len(prompt)] == -100).all() and (labels[len(prompt + answer):] == -100).all()


def test_states_per_block_caps_the_states_seeded(tiny):
    from vllm_cllm.training.packing import pack_prompt

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=3, max_states=4)
    one = pack_prompt(records, states_per_block=1, seed=7)
    assert len(one.student_index) == len(records)
    assert torch.equal(one.input_ids, pack_prompt(records, states_per_block=1, seed=7).input_ids)


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
    assert any("loss_consistency" in h and "fixed_point_accuracy" in h for h in history)
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    changed = any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(),
                                                        base.state_dict().values(),
                                                        strict=True))
    assert changed
    if lora_rank:  # the git artifact (fp16 adapter) rebuilds the same model onto the base
        from vllm_cllm.runtime.checkpoints import merge_adapter
        from vllm_cllm.training.artifact import export_adapter

        weights = export_adapter(tmp_path / "run" / "adapter", tmp_path / "artifact")
        assert weights.stat().st_size < 2**20
        merge_adapter(tiny_path, tmp_path / "artifact", tmp_path / "rebuilt")
        rebuilt = AutoModelForCausalLM.from_pretrained(tmp_path / "rebuilt")
        for a, b in zip(rebuilt.state_dict().values(), trained.state_dict().values(),
                        strict=True):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def test_a_further_round_continues_the_given_adapter(tiny, tiny_path, tmp_path):
    """``init_adapter``: the second round starts from the first round's adapter (not a fresh
    one) and trains it further; the merged model is the base plus the continued adapter."""
    from safetensors.torch import load_file

    from vllm_cllm.training.cllm import CllmConfig, train_cllm

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=1, max_states=2)
    first = CllmConfig(block_size=N, max_steps=6, grad_accum=1, lora_rank=4,
                       learning_rate=1e-3, logging_steps=1)
    train_cllm(tiny_path, records, tmp_path / "one", first)
    adapter = tmp_path / "one" / "adapter"
    before = load_file(str(adapter / "adapter_model.safetensors"))
    second = CllmConfig(**{**vars(first), "init_adapter": str(adapter), "max_steps": 2})
    train_cllm(tiny_path, records, tmp_path / "two", second)
    after = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    assert after.keys() == before.keys()
    lora_b = [k for k in before if "lora_B" in k]
    # a fresh adapter starts from lora_B = 0; one step of the continued one stays near the first's
    moved = sum(float((after[k] - before[k]).norm()) for k in lora_b)
    assert moved < 0.5 * sum(float(before[k].norm()) for k in lora_b)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    with pytest.raises(ValueError, match="lora_rank"):
        train_cllm(tiny_path, records, tmp_path / "three",
                   CllmConfig(**{**vars(second), "lora_rank": 0}))
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        train_cllm(tiny_path, records, tmp_path / "three",
                   CllmConfig(**{**vars(second), "init_adapter": str(tmp_path)}))


def test_lora_targets_choose_the_adapted_layers(tiny, tiny_path, tmp_path):
    """``lora_targets``: the adapter holds matrices for the named layers only; an unknown name
    and a further round on other layers than its ``init_adapter``'s are refused."""
    from safetensors.torch import load_file

    from vllm_cllm.training.cllm import CllmConfig, train_cllm

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=1, max_states=2)
    mlp = CllmConfig(block_size=N, max_steps=2, grad_accum=1, lora_rank=4, learning_rate=1e-3,
                     lora_targets="gate_proj,up_proj,down_proj")
    train_cllm(tiny_path, records, tmp_path / "mlp", mlp)
    adapter = tmp_path / "mlp" / "adapter"
    adapted = {key.split(".")[-3] for key in load_file(str(adapter / "adapter_model.safetensors"))}
    assert adapted == {"gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ValueError, match="unknown"):
        train_cllm(tiny_path, records, tmp_path / "bad",
                   CllmConfig(**{**vars(mlp), "lora_targets": "gate_proj,mlp"}))
    with pytest.raises(ValueError, match="lora_rank"):
        train_cllm(tiny_path, records, tmp_path / "bad",
                   CllmConfig(**{**vars(mlp), "lora_rank": 0}))
    with pytest.raises(ValueError, match="same layers"):
        train_cllm(tiny_path, records, tmp_path / "next",
                   CllmConfig(**{**vars(mlp), "init_adapter": str(adapter),
                                 "lora_targets": "q_proj,v_proj"}))
    train_cllm(tiny_path, records, tmp_path / "next",  # the same layers continue
               CllmConfig(**{**vars(mlp), "init_adapter": str(adapter), "max_steps": 1}))
    train_cllm(tiny_path, records, tmp_path / "unnamed",  # unnamed: the adapter's layers
               CllmConfig(**{**vars(mlp), "init_adapter": str(adapter), "max_steps": 1,
                             "lora_targets": ""}))
    continued = load_file(str(tmp_path / "unnamed" / "adapter" / "adapter_model.safetensors"))
    assert {key.split(".")[-3] for key in continued} == {"gate_proj", "up_proj", "down_proj"}


def test_a_run_stopped_inside_its_schedule_is_that_schedules_checkpoint(tiny, tiny_path,
                                                                         tmp_path):
    """``stop_step``: the run ends after that step with the weights and learning rates of the
    whole ``max_steps`` schedule at that step; running it again loads that checkpoint and
    takes no further step."""
    from safetensors.torch import load_file

    from vllm_cllm.training.cllm import CllmConfig, train_cllm

    _, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=1, max_states=2)
    whole = CllmConfig(block_size=N, max_steps=6, save_steps=3, grad_accum=1, lora_rank=4,
                       learning_rate=1e-3, logging_steps=1)
    train_cllm(tiny_path, records, tmp_path / "whole", whole)
    stopped = CllmConfig(**{**vars(whole), "stop_step": 3})
    train_cllm(tiny_path, records, tmp_path / "stopped", stopped)

    def steps(run: str) -> list[tuple[int, float]]:
        history = json.loads((tmp_path / run / "log_history.json").read_text())
        return [(h["step"], h["learning_rate"]) for h in history if "learning_rate" in h]

    assert steps("stopped") == steps("whole")[:3]
    assert steps("stopped")[-1][1] > 0  # mid-schedule, not decayed to the end
    assert sorted(p.name for p in (tmp_path / "stopped" / "trainer").iterdir()) == ["checkpoint-3"]
    weights = "adapter_model.safetensors"
    reference = load_file(str(tmp_path / "whole" / "trainer" / "checkpoint-3" / weights))
    adapter = load_file(str(tmp_path / "stopped" / "adapter" / weights))
    assert adapter.keys() == reference.keys()
    for key in reference:
        torch.testing.assert_close(adapter[key], reference[key])
    train_cllm(tiny_path, records, tmp_path / "stopped", stopped)  # again: nothing more to do
    assert steps("stopped") == steps("whole")[:3]
    again = load_file(str(tmp_path / "stopped" / "adapter" / weights))
    assert all(torch.equal(again[key], adapter[key]) for key in adapter)
    with pytest.raises(ValueError, match="stop_step 7"):
        train_cllm(tiny_path, records, tmp_path / "late", CllmConfig(**{**vars(whole),
                                                                        "stop_step": 7}))


def test_quality_figures():
    from vllm_cllm.training.quality import accuracy, distinct_n, mean_distinct_n

    assert distinct_n([1, 2, 3, 4, 5]) == 1.0
    assert distinct_n([7] * 10) == pytest.approx(1 / 7)
    assert mean_distinct_n([[1, 2, 3, 4, 5], [7] * 10]) == pytest.approx((1 + 1 / 7) / 2)
    texts = ["so 3 + 4 = 7. Answer: 7", "Answer: $1,200.00", "I think 12", "no idea"]
    assert accuracy(texts, ["7", "1200", "13", "5"]) == 0.5


def test_answer_nlls_sum_each_answer_and_pool_into_the_mean(tiny, tiny_path):
    from vllm_cllm.training.quality import answer_nlls, mean_nll

    model, prompt, answer = tiny
    answers = [answer[:5], [], answer]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + answer])).logits[0], -1)
    direct = -sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(answer))
    nlls = answer_nlls(tiny_path, [prompt] * 3, answers)
    assert nlls[1] == 0.0 and nlls[2] == pytest.approx(direct, rel=1e-4)
    assert 0 < nlls[0] < nlls[2]
    assert mean_nll(tiny_path, [prompt] * 3, answers) == pytest.approx(
        (nlls[0] + nlls[2]) / (5 + len(answer)))


def test_onpolicy_records_pair_each_draft_with_what_was_committed():
    from types import SimpleNamespace

    from vllm_cllm.training.onpolicy import onpolicy_records

    prompt, answer = [1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17]
    outputs = [SimpleNamespace(request_id="0", prompt_token_ids=prompt,
                               outputs=[SimpleNamespace(token_ids=answer)])]
    drafts = [("0-1a2b3c4d", 4, [11, 99, 13]),  # wrong at its 2nd token
              ("0-1a2b3c4d", 5, [12, 13, 14]),  # all right: nothing to learn
              ("0-1a2b3c4d", 8, [15, 16]),  # the fixed point runs past the answer
              ("1-ffffffff", 4, [5, 5, 5])]  # another request
    records = list(onpolicy_records(outputs, drafts, n=4, max_per_prompt=8, seed=0))
    assert len(records) == 1
    r = records[0]
    assert r.context_ids == prompt + [10] and r.fixed_point == [11, 12, 13, 14]
    assert r.states == [[11, 99, 13, 14]]  # the undrafted position reads as committed
    assert r.answer_ids == answer and r.prompt_len == 3
    many = [("0-x", 4, [0, 0, 0])] * 5
    assert len(list(onpolicy_records(outputs, many, n=4, max_per_prompt=2, seed=0))) == 2


def _jacobi_replay_without_cache(model, prompt, answer, n, k):
    """Pure Jacobi decoding along ``answer`` by full forwards: the oracle for the guided
    drafts' KV-cache replay."""
    from vllm_cllm.sources.restart import RandomContextFill

    clean, committed, tail, drafts = prompt + answer, len(prompt) + 1, [], []
    while committed + n <= len(clean):
        draft = tail[:k] or RandomContextFill(0)(np.asarray(clean[:committed]), k).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([clean[:committed] + draft])).logits[0]
        predictions = logits[committed - 1:].argmax(-1).tolist()
        accepted = next((i for i, t in enumerate(draft) if t != clean[committed + i]),
                        len(draft))
        drafts.append((committed, draft))
        committed += accepted + 1
        tail = predictions[accepted + 1:]
    return drafts


def test_guided_drafts_are_pure_jacobi_along_the_given_answer(tiny):
    from vllm_cllm.training.guided import guided_drafts

    model, prompt, answer = tiny
    other = answer[::-1]  # a teacher's answer the model would not give
    # one batch: courses of different lengths, one too short to draft (its rows leave the
    # batch at different steps; rejected draft tokens stay masked in the shared cache)
    courses = [(prompt, answer), (prompt[1:], other), (prompt, answer[:N]),
               (prompt + answer[:3], answer[3:])]
    batched = guided_drafts(model, courses, N, N - 1)
    assert batched[2] == []
    for (p, course), drafts in zip(courses, batched, strict=True):
        assert drafts == _jacobi_replay_without_cache(model, p, course, N, N - 1)
        assert drafts == guided_drafts(model, [(p, course)], N, N - 1)[0]
        if drafts:
            starts = [start for start, _ in drafts]
            assert starts[0] == len(p) + 1 and starts == sorted(set(starts))
            assert starts[-1] + N <= len(p) + len(course)


def test_guided_records_pair_the_models_drafts_with_the_teachers_blocks(tiny, tmp_path):
    model, prompt, answer = tiny
    teacher = answer[::-1]
    records = build_records(3, prompt, teacher, n=N, mode="guided", seed=5, max_states=4,
                            model=model)
    again = build_records(3, prompt, teacher, n=N, mode="guided", seed=5, max_states=4,
                          model=model)
    assert [r.states for r in records] == [r.states for r in again] and 0 < len(records) <= 4
    for r in records:
        start = len(r.context_ids)
        assert r.prompt_id == 3 and r.context_ids == prompt + teacher[:start - len(prompt)]
        assert r.fixed_point == teacher[start - len(prompt):start - len(prompt) + N]
        assert r.answer_ids == teacher and r.states[0] != r.fixed_point
    # a file of them replays its prompts in batches and resumes at the next unwritten prompt
    path = tmp_path / "guided.jsonl"
    items = [(prompt, answer), (prompt, teacher), (prompt[1:], teacher)]
    write_trajectories(path, items[:1], n=N, mode="guided", seed=5, max_states=4, model=model)
    write_trajectories(path, items, n=N, mode="guided", seed=5, max_states=4, model=model,
                       batch_size=2)
    single = [r for pid, (p, a) in enumerate(items) for r in build_records(
        pid, p, a, n=N, mode="guided", seed=5, max_states=4, model=model)]
    assert [(r.prompt_id, r.states) for r in read_trajectories(path)] == [
        (r.prompt_id, r.states) for r in single]


@pytest.mark.engine
@pytest.mark.parametrize("fill", ["tail", "hybrid"])
def test_onpolicy_states_are_recorded_from_a_real_engine(tiny_path, tmp_path, fill):
    from vllm_cllm.training.onpolicy import write_onpolicy
    from vllm_cllm.training.trajectories import read_trajectories

    prompts = ["The capital of France is", "def add(a, b):"]
    path = tmp_path / "onpolicy.jsonl"
    written = write_onpolicy(path, tiny_path, prompts, n=5, k=4, max_new_tokens=24,
                             max_per_prompt=6, seed=0, fill=fill)
    records = read_trajectories(path)
    assert written == len(records) > 0
    for r in records:
        clean = r.context_ids[:r.prompt_len] + r.answer_ids
        start = len(r.context_ids)
        assert r.context_ids == clean[:start] and r.fixed_point == clean[start:start + 5]
        assert r.states[0] != r.fixed_point and len(r.states[0]) == 5
    assert {r.prompt_id for r in records} <= {0, 1}


def test_window_packs_only_the_tokens_its_loss_reads(tiny):
    """With a window, a state is packed up to the last token its loss positions read, and the
    packed logits at those positions still equal separate context + state forwards."""
    from vllm_cllm.training.cllm import collate
    from vllm_cllm.training.packing import pack_prompt

    model, prompt, answer = tiny
    records = build_records(0, prompt, answer, n=N, mode="noise", seed=3, max_states=3)
    full, windowed = pack_prompt(records), pack_prompt(records, window=2)
    assert len(windowed.input_ids) < len(full.input_ids)
    # every state is packed from its first wrong token: the tokens before it are not repeated
    clean = len(prompt) + len(answer)
    first_wrong = [next(i for i in range(N) if s[i] != r.fixed_point[i])
                   for r in records for s in r.states]
    assert len(full.input_ids) - clean == sum(N - 1 - min(f, N - 2) for f in first_wrong)
    batch = collate([windowed])
    with torch.no_grad():
        flat = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                     attention_mask=batch["attention_mask"]).logits[0]
    rows = 0
    for r in records:
        for state in r.states:
            ref = model(input_ids=torch.tensor([r.context_ids + state])).logits[0]
            start = len(r.context_ids)
            keep = windowed.loss_mask[rows]
            assert 0 < keep.sum() <= 2
            torch.testing.assert_close(flat[windowed.student_index[rows][keep]],
                                       ref[start:start + N - 1][keep], atol=1e-4, rtol=1e-4)
            rows += 1


def test_a_demo_built_on_a_demo_names_its_base_and_rebuilds_with_it(tmp_path, monkeypatch):
    from vllm_cllm.runtime import checkpoints as models

    for name, base in (("first", "smollm2-135m-instruct"), ("second", "first")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(
            json.dumps({"base_model_name_or_path": base}))
        (tmp_path / name / "adapter_model.safetensors").write_bytes(name.encode())
    monkeypatch.setattr(models, "ARTIFACTS", tmp_path)
    assert models.artifact_base("second") == "first"
    before = models._artifact_fingerprint("second")
    (tmp_path / "first" / "adapter_model.safetensors").write_bytes(b"retrained")
    assert models._artifact_fingerprint("second") != before  # the base's change rebuilds it
    changed = models._artifact_fingerprint("second")
    (tmp_path / "first" / "README.md").write_text("provenance notes")
    assert models._artifact_fingerprint("second") == changed  # notes are not weights


def test_committed_artifacts_name_their_bases():
    from vllm_cllm.runtime.checkpoints import BUILDERS, artifact_base

    assert artifact_base("smollm2-135m-cllm-gsm") == "smollm2-135m-instruct"
    assert artifact_base("smollm2-135m-space-gsm") == "smollm2-135m-instruct"
    assert artifact_base("smollm2-135m-cllm-gsm-noise") == "smollm2-135m-instruct"
    # the SPACE-on-CLLM artifact was trained on the noise CLLM, not on the demo
    assert artifact_base("smollm2-135m-space-cllm-gsm") == "smollm2-135m-cllm-gsm-noise"
    assert {"smollm2-135m-cllm-gsm-noise", "smollm2-135m-space-cllm-gsm"} <= set(BUILDERS)


def test_training_prompts_can_leave_out_questions_the_evaluation_asks():
    """gsm_symbolic reuses templates, so seed 1 draws one of seed 1000's first 40 questions
    verbatim (its 287th); ``exclude_eval`` drops exactly such prompts, and the evaluation
    seed itself is refused for training."""
    from vllm_cllm.training.gsm import GSM_EVAL_SEED, gsm_problems, training_problems

    held_out = {p["question"] for p in gsm_problems(40, GSM_EVAL_SEED)}
    every = training_problems(400, 1)
    assert [i for i, p in enumerate(every) if p["question"] in held_out] == [286]
    kept = training_problems(400, 1, exclude_eval=40)
    assert kept == every[:286] + every[287:]
    with pytest.raises(ValueError, match="evaluation seed"):
        training_problems(10, GSM_EVAL_SEED)


def test_a_later_rounds_prompts_follow_the_earlier_ones(smollm2_path):
    """``--first-prompt`` picks up where an earlier round's prompts end (after the eval
    exclusion), so rounds never share a prompt."""
    from vllm_cllm.training.cli import _gsm_prompts

    every = _gsm_prompts(smollm2_path, 6, 3, exclude_eval=40)
    assert _gsm_prompts(smollm2_path, 2, 3, exclude_eval=40, first=4) == every[4:]
    assert len(set(every)) == 6


def test_both_prompt_formats_alternate_and_a_later_round_keeps_the_alternation(smollm2_path):
    """``--prompt-format both``: even problems of the seed carry the recipe's instruction, odd
    ones are the bare question (what users send), counted from the seed's start so that a
    round starting at ``--first-prompt`` phrases each problem as the first round did."""
    from vllm_cllm.training.cli import _gsm_prompts
    from vllm_cllm.training.gsm import INSTRUCTION, format_prompts

    both = _gsm_prompts(smollm2_path, 4, 3, exclude_eval=40, prompt_format="both")
    assert [INSTRUCTION in p for p in both] == [True, False, True, False]
    instructed = _gsm_prompts(smollm2_path, 4, 3, exclude_eval=40)
    bare = _gsm_prompts(smollm2_path, 4, 3, exclude_eval=40, prompt_format="bare")
    assert both == [instructed[0], bare[1], instructed[2], bare[3]]
    assert not any(INSTRUCTION in p for p in bare)
    later = _gsm_prompts(smollm2_path, 2, 3, exclude_eval=40, first=1, prompt_format="both")
    assert later == both[1:3]
    with pytest.raises(ValueError, match="prompt format"):
        format_prompts(None, ["q"], "instructed")


def test_train_space_answers_the_prompt_format_it_is_given(smollm2_path, tmp_path, monkeypatch):
    """``vllm-cllm train space --prompt-format both`` trains on answers to the alternating
    prompts (the bare question as users send it, too) and records the format it used."""
    import vllm_cllm.training.answers as answers_module
    import vllm_cllm.training.space as space_module
    from vllm_cllm.cli import main
    from vllm_cllm.training.cli import _gsm_prompts

    asked = []
    monkeypatch.setattr(answers_module, "generate_answers",
                        lambda model, prompts, *a, **kw: asked.extend(prompts) or
                        [([1], [2]) for _ in prompts])
    monkeypatch.setattr(space_module, "train_space", lambda model, items, out, config: out)
    assert main(["train", "space", "--model", smollm2_path, "--out", str(tmp_path),
                 "--num-prompts", "4", "--seed", "3", "--exclude-eval", "40",
                 "--prompt-format", "both"]) == 0
    assert asked == _gsm_prompts(smollm2_path, 4, 3, exclude_eval=40, prompt_format="both")
    assert json.loads((tmp_path / "train_config.json").read_text())["prompt_format"] == "both"


def test_the_gsm_benchmark_evaluates_on_problems_never_seen_in_training():
    """The demos' training prompts (seed 1, 400) hold seed 1000's 34th question; the benchmark
    takes the first 40 of seed 1000 without it, i.e. the 41st in its place."""
    from vllm_cllm.training.gsm import GSM_EVAL_SEED, gsm_problems, unseen_problems

    trained = {p["question"] for p in gsm_problems(400, 1)}
    first = gsm_problems(41, GSM_EVAL_SEED)
    assert [i for i, p in enumerate(first) if p["question"] in trained] == [33]
    assert unseen_problems(40, GSM_EVAL_SEED, [(1, 400)]) == first[:33] + first[34:]
    # several training sets: a question in any of them is left out
    assert unseen_problems(40, GSM_EVAL_SEED, [(1000, 2), (1, 400)]) == first[2:33] + \
        first[34:] + gsm_problems(43, GSM_EVAL_SEED)[41:]


def test_tokens_per_verify_step_leaves_out_the_prefill_step_and_its_token():
    from vllm_cllm.bench.measure import tokens_per_verify_step

    # 8 tokens in 4 steps: 1 from prefill, 7 in 3 decode steps; a request that ended at
    # prefill (1 token, 1 step) has no decode step at all
    assert tokens_per_verify_step([[1] * 8, [2] * 30, [3]], [4, 6, 1]) == (7 + 29) / (3 + 5)
    assert tokens_per_verify_step([[3]], [1]) == 1.0


@pytest.mark.parametrize("command", ["space", "trajectories"])
def test_training_on_the_evaluation_seed_is_refused_before_anything_runs(command, tmp_path,
                                                                         capsys):
    from vllm_cllm.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", command, "--out", str(tmp_path / "out"), "--seed", "1000"])
    assert exit_info.value.code == 2
    assert "1000 is the evaluation seed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_precision_and_data_workers_reach_the_trainer(tmp_path):
    """``precision`` and ``data_workers`` become the Trainer's mixed precision and DataLoader
    workers; an unknown precision is refused by the CLI parser and by the recipe."""
    import argparse

    from vllm_cllm.training.cli import add_train_parser
    from vllm_cllm.training.cllm import CllmConfig
    from vllm_cllm.training.trainer import training_arguments

    args = training_arguments(tmp_path, CllmConfig(data_workers=2))
    assert args.dataloader_num_workers == 2 and not args.bf16
    with pytest.raises(ValueError, match="precision"):
        training_arguments(tmp_path, CllmConfig(precision="fp16"))
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    flags = ["train", "cllm", "--data", "d.jsonl", "--out", str(tmp_path)]
    parsed = parser.parse_args(flags + ["--precision", "bf16", "--data-workers", "3"])
    assert (parsed.precision, parsed.data_workers) == ("bf16", 3)
    with pytest.raises(SystemExit):
        parser.parse_args(flags + ["--precision", "fp16"])
