"""SPACE without an engine: options and refusal, mask token, SAR data builder, proposer rules."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fakes import vllm_config

from vllm_cllm.core.predictions import VerifyPredictions
from vllm_cllm.errors import ConfigError
from vllm_cllm.options import parse_options
from vllm_cllm.policies.mask_slots import Slots
from vllm_cllm.policies.scores import SourceScores
from vllm_cllm.proposers.space import SpaceProposer
from vllm_cllm.runtime.mask_token import MASK_TOKEN, add_mask_token
from vllm_cllm.sources.masks import next_candidates
from vllm_cllm.sources.ngram import NgramFill, NoFill
from vllm_cllm.training.space import (
    SarDataset,
    build_sar_example,
    collate_sar,
    sar_loss,
)

MASK = 99


# --- options ---------------------------------------------------------------------------------

def test_space_options_take_the_mask_token_from_the_model_config():
    opts = parse_options({"method": "space", "num_speculative_tokens": 5},
                         max_k=128, hf_config=SimpleNamespace(mask_token_id=7, vocab_size=10))
    assert (opts.mask_token_id, opts.num_speculative_tokens, opts.vllm_draft_tokens,
            opts.fill) == (7, 5, 10, "hybrid")


@pytest.mark.parametrize("spec, config, words", [
    ({"method": "space", "num_speculative_tokens": 5}, SimpleNamespace(vocab_size=10),
     ["needs a SPACE checkpoint", "mask_token_id", "vllm-cllm train space"]),
    ({"method": "space", "num_speculative_tokens": 65},
     SimpleNamespace(mask_token_id=7, vocab_size=10), ["num_speculative_tokens", "[1, 64]"]),
    ({"method": "space", "num_speculative_tokens": 5, "mask_token_id": 10},
     SimpleNamespace(vocab_size=10), ["mask_token_id", "[0, 9]"]),
    ({"method": "space", "num_speculative_tokens": 5, "fill": "random"},
     SimpleNamespace(mask_token_id=7, vocab_size=10), ["fill", "hybrid, ngram, masks, tail"]),
    ({"method": "space", "num_speculative_tokens": 5, "seed": 1},
     SimpleNamespace(mask_token_id=7, vocab_size=10), ["'seed'", "mask_token_id"]),
    ({"method": "jacobi", "num_speculative_tokens": 5, "mask_token_id": 1},
     None, ["'mask_token_id'", "for method 'jacobi'"]),
])
def test_bad_space_input_is_refused_with_a_clear_message(spec, config, words):
    with pytest.raises(ConfigError) as err:
        parse_options(spec, max_k=128, hf_config=config)
    for word in words:
        assert word in str(err.value)


def test_model_without_mask_token_is_refused_before_an_engine_starts(tiny_path):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=tiny_path, dtype="float32", max_model_len=512, enforce_eager=True,
                      speculative_config={"method": "space", "num_speculative_tokens": 5})
    with pytest.raises(ConfigError, match="needs a SPACE checkpoint"):
        args.create_engine_config()


def test_space_checkpoint_selects_the_proposer_with_2k_slots():
    from vllm.engine.arg_utils import EngineArgs

    from vllm_cllm.runtime.checkpoints import model_path

    config = EngineArgs(model=str(model_path("tiny-random-space")), dtype="float32",
                        max_model_len=512, enforce_eager=True,
                        speculative_config={"method": "space", "num_speculative_tokens": 5}
                        ).create_engine_config()
    assert config.speculative_config.model == "vllm_cllm.proposers.space.SpaceProposer"
    assert config.speculative_config.num_speculative_tokens == 10
    stored = config.additional_config["vllm_cllm"]
    assert stored["num_speculative_tokens"] == 5
    assert stored["mask_token_id"] == config.model_config.hf_config.mask_token_id


# --- mask token ------------------------------------------------------------------------------

def test_add_mask_token_grows_vocab_by_one_and_is_idempotent(tiny_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    rows = model.get_input_embeddings().weight.shape[0]
    mask_id = add_mask_token(model, tokenizer)
    assert mask_id == rows and tokenizer.mask_token == MASK_TOKEN
    assert model.get_input_embeddings().weight.shape[0] == rows + 1 == len(tokenizer)
    assert model.config.mask_token_id == mask_id
    assert tokenizer.encode(MASK_TOKEN, add_special_tokens=False) == [mask_id]
    assert add_mask_token(model, tokenizer) == mask_id
    assert model.get_input_embeddings().weight.shape[0] == rows + 1


# --- SAR data --------------------------------------------------------------------------------

def test_sar_example_layout_and_labels():
    prompt, answer = [1, 2, 3], [10, 11, 12, 13, 14, 15, 16]
    ex = build_sar_example(prompt, answer, MASK, k=3, groups=2, rng=np.random.default_rng(0))
    clean = prompt + answer
    length = len(clean)
    assert ex.input_ids[:length].tolist() == clean
    assert ex.input_ids[length:].tolist() == [MASK] * 6
    assert ex.ar_labels[len(prompt):length].tolist() == answer
    assert (ex.ar_labels[:len(prompt)] == -100).all() and (ex.ar_labels[length:] == -100).all()
    for g in range(2):
        rows = range(length + 3 * g, length + 3 * g + 3)
        s = int(ex.position_ids[rows[0]]) - 1  # last real token the group sees
        assert len(prompt) - 1 <= s <= length - 3
        for j, row in enumerate(rows):
            assert int(ex.position_ids[row]) == s + 1 + j
            seen = ex.attention[row].nonzero().flatten().tolist()
            assert seen == list(range(s + 1)) + list(range(rows[0], row + 1))
            if s + 2 + j < length:
                assert row in ex.mask_index.tolist()
                at = ex.mask_index.tolist().index(row)
                assert int(ex.mask_target[at]) == clean[s + 2 + j]  # j places after the bonus
    assert ex.attention[:length, :length].equal(torch.ones(length, length).tril().bool())


def test_packed_mask_groups_equal_the_inference_layout(tiny_path):
    """Logits at a packed mask group equal a plain causal forward of prefix + masks (the view
    the proposer gives the model in vLLM when every candidate was accepted)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    mask_id = 5
    prompt, answer = [1, 2, 3, 4], list(range(20, 40))
    ex = build_sar_example(prompt, answer, mask_id, k=4, groups=3,
                           rng=np.random.default_rng(1))
    batch = collate_sar([ex])
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                       attention_mask=batch["attention_mask"]).logits[0]
        length = len(prompt) + len(answer)
        for g in range(3):
            start = length + 4 * g
            s = int(ex.position_ids[start]) - 1
            alone = torch.tensor([(prompt + answer)[:s + 1] + [mask_id] * 4])
            plain = model(input_ids=alone).logits[0, s + 1:]
            torch.testing.assert_close(packed[start:start + 4], plain, atol=1e-4, rtol=1e-4)


def test_sar_loss_parts_and_short_answers(tiny_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    data = SarDataset([([1, 2], list(range(30, 50))), ([1], [7, 8])], mask_id=5, k=3, groups=4)
    assert len(data) == 1  # an answer too short for any split point is left out
    loss, parts = sar_loss(model, collate_sar([data[0]]), mask_weight=1.0)
    assert loss.requires_grad
    assert abs(float(loss.detach()) - parts["ar"] - parts["mask"]) < 1e-3
    assert 0.0 <= parts["mask_accuracy"] <= 1.0


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_base_anchor_holds_the_untrained_models_own_text(tiny_path, lora_rank):
    """With ``anchor="base"`` the AR term is KL(base || model) on the clean answer: zero before
    training (the base's teacher is the model's own output), on rows of two widths, with every
    greedy token the base's; the mask term is SAR-SFT's, and the gradient reaches the model
    only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vllm_cllm.training.trainer import with_lora

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    mask_id = add_mask_token(model, AutoTokenizer.from_pretrained(tiny_path))
    base = None
    if lora_rank:
        model = with_lora(model, lora_rank, lora_rank, trainable_token_indices=[mask_id])
    else:  # as train_space's frozen copy for a full fine-tune
        base = copy.deepcopy(model).eval().requires_grad_(False)
    data = SarDataset([([1, 2], list(range(30, 50))), ([3], list(range(60, 70)))],
                      mask_id=mask_id, k=3, groups=4)
    batch = collate_sar([data[0], data[1]])
    assert int(batch["clean_width"]) == 22
    loss, parts = sar_loss(model, batch, 1.0, anchor="base", ar_weight=5.0, base=base)
    _, own = sar_loss(model, batch, 1.0)
    assert parts["ar"] == pytest.approx(0.0, abs=1e-5) and own["ar"] > 0
    assert parts["greedy_agreement"] == 1.0 and "greedy_agreement" not in own
    assert parts["mask"] == pytest.approx(own["mask"], rel=1e-5)
    assert float(loss.detach()) == pytest.approx(parts["mask"], abs=1e-4)
    loss.backward()
    assert any(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert base is None or all(p.grad is None for p in base.parameters())


def test_every_saved_checkpoint_merges_into_a_servable_space_model(tiny_path, tmp_path):
    """A LoRA run's Trainer checkpoints carry the mask token as its final adapter does, so
    ``merge_adapter`` builds a model with the mask token from any of them."""
    import json

    from vllm_cllm.runtime.checkpoints import merge_adapter
    from vllm_cllm.runtime.mask_token import MASK_TOKEN_FILE
    from vllm_cllm.training.space import SpaceConfig, train_space

    items = [([1, 2], list(range(30, 50))), ([3], list(range(60, 70)))]
    train_space(tiny_path, items, tmp_path / "run", SpaceConfig(
        k=3, groups=2, lora_rank=4, lora_alpha=4, max_steps=2, save_steps=1, grad_accum=1,
        keep_checkpoints=0, logging_steps=1))
    final = json.loads((tmp_path / "run" / "adapter" / MASK_TOKEN_FILE).read_text())
    for step in (1, 2):
        checkpoint = tmp_path / "run" / "trainer" / f"checkpoint-{step}"
        assert json.loads((checkpoint / MASK_TOKEN_FILE).read_text()) == final
        merge_adapter(Path(tiny_path), checkpoint, tmp_path / f"model-{step}")
        config = json.loads((tmp_path / f"model-{step}" / "config.json").read_text())
        assert config["mask_token_id"] == final["mask_token_id"] == config["vocab_size"] - 1


def test_space_refuses_an_unknown_anchor_before_anything_runs(tmp_path, capsys):
    from vllm_cllm.cli import main
    from vllm_cllm.training.space import SpaceConfig, check_space_config

    with pytest.raises(ValueError, match="anchor must be one of"):
        check_space_config(SpaceConfig(anchor="teacher"))
    with pytest.raises(ValueError, match="ar_weight"):
        check_space_config(SpaceConfig(ar_weight=-1.0))
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "space", "--out", str(tmp_path / "out"), "--anchor", "teacher"])
    assert exit_info.value.code == 2 and "--anchor" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="ar_weight"):
        main(["train", "space", "--out", str(tmp_path / "out"), "--ar-weight", "-1"])
    assert not (tmp_path / "out").exists()


# --- proposer rules --------------------------------------------------------------------------

def test_all_candidates_accepted_drafts_from_the_mask_slots():
    # last step: t0, c1, c2, M1, M2, M3 -> predictions after each; both candidates accepted
    row = np.array([50, 51, 52, 60, 61, 62])
    out = next_candidates(row, num_sampled=3, last_candidates=2, k=3,
                          context=np.arange(10), fill=NoFill())
    assert out.tolist() == [60, 61, 62]


def test_rejection_falls_back_to_the_jacobi_tail_then_the_fill():
    row = np.array([50, 51, 52, 53, 60, 61, 62])  # 3 candidates, 3 masks; 1 accepted
    context = np.array([52, 53, 7, 5, 6])
    out = next_candidates(row, num_sampled=2, last_candidates=3, k=3, context=context,
                          fill=NgramFill(2, 3, 100))
    # the tail behind the rejected candidate (no mask rows), then the n-gram continuation
    assert out.tolist() == [52, 53, 7]
    tail_only = next_candidates(row, 2, 3, 3, context, NoFill())
    assert tail_only.tolist() == [52, 53]


def test_device_step_reads_mask_rows_and_tails_like_the_host_rule():
    """The capture's fixed-point step, told each request's mask slots, gives the same next
    candidates as the rule on the host: mask rows after a full acceptance, else the tail."""
    proposer = _proposer(k=3)
    _fills(proposer, NoFill(), use_tail=True)
    _slots(proposer, "full", 2)
    _slots(proposer, "rej", 3)
    # full: c1 c2 + 3 masks, both accepted; rej: c1 c2 c3 + 3 masks, c1 accepted
    rows = [[50, 51, 52, 60, 61, 62], [70, 71, 72, 73, 80, 81, 82]]
    logits = torch.zeros(13, 128)
    logits[torch.arange(13), torch.tensor(sum(rows, []))] = 1.0
    drafts = [50, 51, MASK, MASK, MASK, 70, 99, 98, MASK, MASK, MASK]
    meta = SimpleNamespace(num_draft_tokens=[5, 6],
                           draft_token_ids=torch.tensor(drafts, dtype=torch.int32))
    proposer.capture_on_host = False  # the device step (on a GPU: Triton)
    proposer.observe_verification(logits, meta, ["full", "rej"])
    preds = proposer.predictions
    assert preds.num_mask.tolist() == [3, 3] and preds.accepted.tolist() == [2, 1]
    tokens = np.zeros((2, 100), dtype=np.int64)
    out = proposer.propose([[50, 51, 52], [70, 71]], np.array([10, 10]), tokens)
    host = [next_candidates(np.array(rows[0]), 3, 2, 3, tokens[0, :10], NoFill()),
            next_candidates(np.array(rows[1]), 2, 3, 3, tokens[1, :10], NoFill())]
    assert host[0].tolist() == [60, 61, 62] and host[1].tolist() == [72, 73]
    assert out == [host[0].tolist() + [MASK] * 3, host[1].tolist() + [MASK] * 3]


def test_first_step_uses_the_fill_or_masks_only():
    context = np.array([1, 2, 3, 1, 2])
    assert next_candidates(np.array([9]), 1, None, 4, context,
                           NgramFill(2, 2, 100)).tolist() == [3, 1, 2]
    assert next_candidates(np.array([9]), 1, None, 4, context, NoFill()).tolist() == []
    # placeholder drafts we did not make are not read as candidates or masks
    assert next_candidates(np.array([9, 9, 9]), 1, None, 4, context, NoFill()).tolist() == []


def _proposer(k: int = 3, max_model_len: int = 100, fill: str = "masks") -> SpaceProposer:
    spec = {"method": "space", "num_speculative_tokens": k, "fill": fill,
            "mask_token_id": MASK}
    return SpaceProposer(vllm_config(spec, max_model_len,
                                     SimpleNamespace(mask_token_id=MASK)))


def _slots(proposer: SpaceProposer, req_id: str, last_candidates: int,
           scores: SourceScores | None = None) -> Slots:
    """Request ``req_id``'s record as if it had drafted ``last_candidates`` candidates."""
    state = proposer.drafter.table.open(req_id, [])
    slots = state.parts["space"] = Slots(last_candidates, scores)
    return slots


def _fills(proposer: SpaceProposer, fill, use_tail: bool = False) -> None:
    """What the candidates fall back to after a rejection (both greedy and sampled)."""
    source = proposer.drafter.sources["masks"]
    source.fill = source.greedy_fill = fill
    source.use_tail = use_tail
    source.fill_alone = True


def _last_candidates(proposer: SpaceProposer, req_id: str) -> int:
    return proposer.drafter.table.get(req_id).parts["space"].last_candidates


def test_proposer_appends_k_masks_and_tracks_candidates():
    proposer = _proposer(k=3)
    tokens = np.zeros((1, 100), dtype=np.int64)
    proposer.predictions = VerifyPredictions(["r"], np.array([40]), np.array([0, 1]))
    assert proposer.propose([[40]], np.array([10]), tokens) == [[MASK] * 3]  # masks only
    assert _last_candidates(proposer, "r") == 0
    # next step: nothing to accept, M1 at the bonus position -> mask predictions
    proposer.predictions = VerifyPredictions(["r"], np.array([41, 42, 43, 44]),
                                             np.array([0, 4]))
    assert proposer.propose([[41]], np.array([11]), tokens) == [[42, 43, 44] + [MASK] * 3]
    assert _last_candidates(proposer, "r") == 3
    proposer.retain_requests(set())
    assert proposer.tracked_requests() == set()


def test_proposer_truncates_masks_first_near_max_model_len():
    proposer = _proposer(k=3, max_model_len=16)
    tokens = np.zeros((1, 16), dtype=np.int64)
    proposer.predictions = VerifyPredictions(["r"], np.array([41, 42, 43, 44]),
                                             np.array([0, 4]))
    _slots(proposer, "r", 0)  # no scores without fill=hybrid
    assert proposer.propose([[41]], np.array([12]), tokens) == [[42, 43, 44, MASK]]


def test_mask_logit_is_never_the_argmax():
    proposer = _proposer()
    logits = torch.zeros((3, 128))
    logits[:, MASK] = 100.0
    meta = SimpleNamespace(num_draft_tokens=[1, 0],
                           draft_token_ids=torch.tensor([MASK], dtype=torch.int32))
    proposer.observe_verification(logits, meta, ["a", "b"])
    assert torch.isneginf(logits[:, MASK]).all()
    assert len(proposer.predictions.flat) == 3 and MASK not in proposer.predictions.flat.tolist()
    no_drafts = torch.zeros((2, 128))
    no_drafts[:, MASK] = 100.0
    proposer.observe_verification(no_drafts, None, ["a", "b"])  # sampling still sees -inf
    assert torch.isneginf(no_drafts[:, MASK]).all()


def test_hybrid_prefers_ngrams_for_a_request_whose_mask_guesses_keep_missing():
    """...and the lookup drafts past k, as far as its match goes, into the 2k slots: the
    masks take the slots it leaves."""
    proposer = _proposer(k=3, fill="hybrid")
    _fills(proposer, NgramFill(2, 2, 100))
    tokens = np.zeros((1, 100), dtype=np.int64)
    tokens[0, :6] = [1, 2, 3, 4, 1, 2]  # n-gram lookup alone continues "1 2" with "3 4 1 2"
    _slots(proposer, "r", 0, SourceScores("masks", {"masks": 0.1, "ngram": 1.5}))
    proposer.predictions = VerifyPredictions(["r"], np.array([2, 42, 43, 44]),
                                             np.array([0, 4]))
    assert proposer.propose([[2]], np.array([6]), tokens) == [[3, 4, 1, 2] + [MASK] * 2]
    assert _last_candidates(proposer, "r") == 4
    # a match as long as all 2k slots leaves no mask; the next step has no mask rows then
    tokens[0, :10] = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    _slots(proposer, "r", 0, SourceScores("masks", {"masks": 0.1, "ngram": 1.5}))
    proposer.predictions = VerifyPredictions(["r"], np.array([2, 42, 43, 44]),
                                             np.array([0, 4]))
    assert proposer.propose([[2]], np.array([10]), tokens) == [[3, 4, 5, 6, 7, 8]]
    assert proposer.mask_slots(["r"], [6]) == [0]


def test_hybrid_after_a_rejection_scores_the_jacobi_tail_against_ngrams():
    proposer = _proposer(k=3, fill="hybrid")
    _fills(proposer, NgramFill(2, 2, 100), use_tail=True)
    tokens = np.zeros((1, 100), dtype=np.int64)
    tokens[0, :6] = [1, 2, 3, 4, 1, 2]  # n-gram lookup alone continues "1 2" with "3 4 1"
    # last step: 3 candidates + 3 masks, the 2nd candidate rejected -> the tail behind it
    row = np.array([50, 51, 52, 53, 60, 61, 62])
    for scores, expected in (({"masks": 1.0, "block": 0.9, "ngram": 0.2}, [52, 53, MASK,
                                                                            MASK, MASK]),
                             ({"masks": 1.0, "block": 0.1, "ngram": 1.5}, [3, 4, 1, 2, MASK,
                                                                            MASK])):
        state = SourceScores("masks", dict(scores))
        _slots(proposer, "r", 3, state)
        proposer.predictions = VerifyPredictions(["r"], row, np.array([0, 7]),
                                                 num_mask=np.array([3]))
        assert proposer.propose([[50, 51]], np.array([6]), tokens) == [expected]
        assert set(state.proposed) == {"block", "ngram"}  # scored next step as the block


def test_ngram_fill_falls_back_to_earlier_outputs_and_requests_feed_them():
    """With ``fill: ngram`` a rejection without an n-gram match in a greedy request drafts
    what followed its context in an earlier request's output (a sampled one drafts masks
    only); a request's output (not its prompt) enters that history when it leaves."""
    proposer = _proposer(k=3, fill="ngram")
    history = proposer.drafter.sources["masks"].greedy_fill.history
    tokens = np.zeros((1, 100), dtype=np.int64)
    tokens[0, :9] = [90, 91, 30, 31, 32, 33, 34, 35, 36]  # prompt of 2, then its output
    proposer.predictions = VerifyPredictions(["a"], np.array([30]), np.array([0, 1]))
    proposer.propose([[30]], np.array([3]), tokens)
    proposer.predictions = VerifyPredictions(["a"], np.array([36]), np.array([0, 1]))
    proposer.propose([[31, 32, 33, 34, 35, 36]], np.array([9]), tokens)
    proposer.retain_requests(set())
    assert [o.tolist() for o in history.outputs.values()] == [[30, 31, 32, 33, 34, 35, 36]]
    tokens[0, :5] = [7, 8, 31, 32, 33]  # no n-gram repeats here; "31 32 33" did in "a"
    proposer.retain_requests({"b"}, {"b"})  # a greedy request
    _slots(proposer, "b", 3)
    row = np.array([31, 60, 61, 62, 70, 71, 72])  # 1 of 3 candidates accepted
    proposer.predictions = VerifyPredictions(["b"], row, np.array([0, 7]),
                                             num_mask=np.array([3]))
    assert proposer.propose([[32, 33]], np.array([5]), tokens) == [[34, 35, 36] + [MASK] * 3]
    proposer.retain_requests({"b"}, set())  # sampled
    _slots(proposer, "b", 3)
    proposer.predictions = VerifyPredictions(["b"], row, np.array([0, 7]),
                                             num_mask=np.array([3]))
    assert proposer.propose([[32, 33]], np.array([5]), tokens) == [[MASK] * 3]


# --- the paper-layout reference --------------------------------------------------------------

def test_paper_layout_rows_see_what_the_paper_says(tiny_path):
    """Candidate c_i = plain forward of prefix + c_0..c_i; group G_i = prefix + c_<i + masks."""
    from transformers import AutoModelForCausalLM

    from vllm_cllm.bench.space_reference import block_layout

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    prefix, cands, k, mask_id = list(range(300, 320)), [7, 8, 9], 3, 5
    ids, positions, visible, group_start = block_layout(0, len(prefix), cands, mask_id, k)
    additive = torch.zeros(visible.shape).masked_fill_(~visible, torch.finfo(torch.float32).min)
    with torch.no_grad():
        packed = model(input_ids=torch.tensor([prefix + ids]),
                       position_ids=torch.tensor([positions]),
                       attention_mask=additive[None, None]).logits[0]
        for i in range(k + 1):
            if i < k:
                row = len(prefix) + (i + 1) * (k + 1) - 1
                plain = model(input_ids=torch.tensor([prefix + cands[:i + 1]])).logits[0, -1]
                torch.testing.assert_close(packed[row], plain, atol=1e-4, rtol=1e-4)
            start = group_start[i]
            plain = model(input_ids=torch.tensor([prefix + cands[:i] + [mask_id] * k])
                          ).logits[0, -k:]
            torch.testing.assert_close(packed[start:start + k], plain, atol=1e-4, rtol=1e-4)


def test_paper_layout_decoding_equals_greedy(tiny_path):
    from transformers import AutoModelForCausalLM

    from vllm_cllm.bench.space_reference import space_generate

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    prompt, greedy = [1, 2, 3, 4, 5, 6], []
    with torch.no_grad():  # plain greedy decoding, one full forward per token
        for _ in range(24):
            logits = model(input_ids=torch.tensor([prompt + greedy])).logits[0, -1]
            greedy.append(int(logits.argmax()))
    # the mask id here is an ordinary token the random model may also predict: the reference
    # never emits it, so pick one the greedy output does not contain
    mask_id = next(t for t in range(10, 100) if t not in greedy)
    assert space_generate(model, prompt, mask_id, 3, 24).tokens == greedy


def test_class_path_alone_gets_space_defaults_from_vllm_slots_and_the_model():
    from vllm_cllm.options import options_from_vllm_config

    def config(hf):
        return SimpleNamespace(additional_config=None,
                               speculative_config=SimpleNamespace(num_speculative_tokens=10),
                               model_config=SimpleNamespace(hf_config=hf))

    opts = options_from_vllm_config(config(SimpleNamespace(mask_token_id=7, vocab_size=10)),
                                    "space")
    assert (opts.num_speculative_tokens, opts.vllm_draft_tokens, opts.mask_token_id,
            opts.fill) == (5, 10, 7, "hybrid")
    with pytest.raises(ConfigError, match="needs a SPACE checkpoint"):
        options_from_vllm_config(config(SimpleNamespace(vocab_size=10)), "space")


@pytest.mark.parametrize("method", ["jacobi", "space"])
def test_device_and_host_capture_give_the_same_next_blocks(method):
    """Every proposer's capture through the device step (torch on CPU tensors here, Triton
    on a GPU) and through the host path, on the same verify steps: the same next block for
    every request, however many drafts it had (``space`` verifies up to 2k slots)."""
    from fakes import jacobi

    k = 3
    proposer = _proposer(k=k) if method == "space" else jacobi(k, max_model_len=100)
    rng = np.random.default_rng(0)
    slots = proposer.options.vllm_draft_tokens
    for _ in range(20):
        req_ids = [f"r{i}" for i in range(4)]
        num_drafts = [int(n) for n in rng.integers(0, slots + 1, len(req_ids))]
        if method == "space":  # some of each request's slots are masks behind its candidates
            for r, n in zip(req_ids, num_drafts, strict=True):
                _slots(proposer, r, int(rng.integers(0, n + 1)))
        rows = sum(n + 1 for n in num_drafts)
        logits = torch.randn(rows, 64)
        drafts = torch.randint(0, 64, (sum(num_drafts),))
        # accept some drafts: make a draft the row's argmax where a coin says so
        offsets = np.cumsum([0] + [n + 1 for n in num_drafts])
        cursor = 0
        for i, n in enumerate(num_drafts):
            for j in range(n):
                if rng.random() < 0.6:
                    logits[offsets[i] + j, int(drafts[cursor + j])] = 10.0
            cursor += n
        meta = SimpleNamespace(num_draft_tokens=num_drafts, draft_token_ids=drafts)
        captured = []
        for on_host in (True, False):
            proposer.capture_on_host = on_host
            proposer.observe_verification(logits.clone(), meta, req_ids)
            captured.append(proposer.take_predictions())
        host, device = captured
        for i, accepted in enumerate(device.accepted):  # the greedy commit: the device's block
            num_sampled = int(accepted) + 1
            assert device.next_block(i, num_sampled).tolist() == \
                host.next_block(i, num_sampled).tolist(), (method, num_drafts, i)


def test_load_model_warms_the_step_each_proposer_runs(monkeypatch):
    """Before serving, each proposer compiles the fixed-point step for its own block length
    and mask flag (``space``: 2k slots with masks; ``jacobi``: k, none)."""
    import vllm_cllm.kernels as kernels
    from vllm_cllm.proposers.jacobi import JacobiProposer

    warmed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(kernels, "warm_up", lambda vocab, dtype, device, k, with_mask:
                        warmed.append((vocab, dtype, device.type, k, with_mask)))
    model = SimpleNamespace(max_model_len=100, get_vocab_size=lambda: 128,
                            dtype=torch.bfloat16, hf_config=SimpleNamespace(mask_token_id=MASK))
    for cls, spec in ((SpaceProposer, {"method": "space", "num_speculative_tokens": 3,
                                       "mask_token_id": MASK}),
                      (JacobiProposer, {"method": "jacobi", "num_speculative_tokens": 3})):
        slots = 6 if spec["method"] == "space" else 3
        cls(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=slots),
                            model_config=model,
                            additional_config={"vllm_cllm": parse_options(
                                spec, max_k=128).to_dict()})).load_model(None)
    assert warmed == [(128, torch.bfloat16, "cuda", 6, True),
                      (128, torch.bfloat16, "cuda", 3, False)]


def test_a_pending_device_copy_is_waited_for_only_when_the_proposer_reads_it():
    """On CUDA the capture queues its device-to-host copy and returns: the wait (an event's
    synchronize) happens when ``propose()`` takes the predictions, after vLLM's sampler was
    launched; until then the batch's requests are still tracked."""
    from fakes import jacobi

    from vllm_cllm.core.predictions import PendingPredictions

    class Event:
        waited = 0

        def synchronize(self) -> None:
            Event.waited += 1

    # two requests: 1 draft (rows 2) and 0 drafts (row 1); k = 2
    packed = torch.tensor([5, 6, 7, 1, 0, 1, 0, 6, -1, -1, -1])
    observer = jacobi(k=2)
    observer.predictions = PendingPredictions(["a", "b"], packed, Event(), [2, 1], 2, None)
    assert observer.tracked_requests() == {"a", "b"} and Event.waited == 0
    preds = observer.take_predictions()
    assert Event.waited == 1 and observer.take_predictions() is None
    assert preds.row(0).tolist() == [5, 6] and preds.accepted.tolist() == [1, 0]
    assert preds.next_block(0, 2).tolist() == [6]
