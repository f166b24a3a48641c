"""LoRA adapters averaged exactly and stored at a bounded rank (the git artifact), on the tiny
model (seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vllm_cllm.training.artifact import average_adapters, export_adapter, truncate_rank


def _delta(weights: dict[str, torch.Tensor], name_a: str, scaling: float) -> torch.Tensor:
    return scaling * weights[name_a.replace("lora_A", "lora_B")].double() @ weights[name_a].double()


def test_truncate_rank_keeps_a_delta_of_that_rank_and_is_the_best_approximation_below():
    gen = torch.Generator().manual_seed(0)
    rank, scaling = 6, 2.0
    weights = {"x.lora_A.weight": torch.randn(rank, 20, generator=gen, dtype=torch.float64),
               "x.lora_B.weight": torch.randn(12, rank, generator=gen, dtype=torch.float64)}
    delta = _delta(weights, "x.lora_A.weight", scaling)

    full, dropped = truncate_rank(weights, scaling, rank)
    torch.testing.assert_close(_delta(full, "x.lora_A.weight", 1.0), delta)
    assert dropped < 1e-12

    low, dropped = truncate_rank(weights, scaling, 2)
    assert low["x.lora_A.weight"].shape == (2, 20) and low["x.lora_B.weight"].shape == (12, 2)
    u, s, vh = torch.linalg.svd(delta)
    best = (u[:, :2] * s[:2]) @ vh[:2]  # Eckart-Young: no rank-2 matrix is closer
    torch.testing.assert_close(_delta(low, "x.lora_A.weight", 1.0), best)
    assert dropped == pytest.approx(float((s[2:] ** 2).sum().sqrt() / (s ** 2).sum().sqrt()))


def _random_adapter(tiny_path: str, out: Path, rank: int, alpha: int, seed: int) -> Path:
    """A LoRA adapter on the tiny model with random A and B (a trained one is not zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=["q_proj", "down_proj"],
                        init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(out)
    return out


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def test_train_average_merges_to_the_mean_of_the_merged_runs(tiny_path, tmp_path):
    from vllm_cllm.cli import main
    from vllm_cllm.runtime.checkpoints import merge_adapter

    adapters = [_random_adapter(tiny_path, tmp_path / "a", 4, 4, 0),
                _random_adapter(tiny_path, tmp_path / "b", 4, 8, 1)]  # scaling 1 and 2
    for adapter in adapters:
        merge_adapter(Path(tiny_path), adapter, adapter / "merged")
    assert main(["train", "average", "--model", tiny_path, "--out", str(tmp_path / "avg"),
                 *map(str, adapters)]) == 0

    config = json.loads((tmp_path / "avg" / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == 8
    runs = [_weights(a / "merged") for a in adapters]
    averaged = _weights(tmp_path / "avg" / "model")
    assert any(not torch.equal(runs[0][n], runs[1][n]) for n in averaged)
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (runs[0][name] + runs[1][name]) / 2)

    # the artifact at the average's rank rebuilds it; below, each layer's best approximation
    export_adapter(tmp_path / "avg" / "adapter", tmp_path / "art8", base="tiny-random-llama")
    art3 = export_adapter(tmp_path / "avg" / "adapter", tmp_path / "art3",
                          base="tiny-random-llama", max_rank=3)
    assert json.loads((tmp_path / "art3" / "adapter_config.json").read_text())["r"] == 3
    assert art3.stat().st_size < (tmp_path / "art8" / "adapter_model.safetensors").stat().st_size
    merge_adapter(Path(tiny_path), tmp_path / "art8", tmp_path / "rebuilt")
    for name, tensor in _weights(tmp_path / "rebuilt").items():
        torch.testing.assert_close(tensor, averaged[name], atol=1e-3, rtol=1e-3)


def test_average_refuses_adapters_of_other_layers_or_scaling_rules(tiny_path, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    first = _random_adapter(tiny_path, tmp_path / "a", 4, 4, 0)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=4, target_modules=["v_proj"],
                                     init_lora_weights=False)).save_pretrained(tmp_path / "v")
    with pytest.raises(ValueError, match="other layers"):
        average_adapters([first, tmp_path / "v"], tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    get_peft_model(model, LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "down_proj"],
                                     use_rslora=True)).save_pretrained(tmp_path / "rs")
    with pytest.raises(ValueError, match="rsLoRA"):
        average_adapters([first, tmp_path / "rs"], tmp_path / "out")
    with pytest.raises(SystemExit, match="at least two"):
        from vllm_cllm.cli import main

        main(["train", "average", "--out", str(tmp_path / "one"), str(first)])
