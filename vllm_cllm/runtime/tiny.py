"""A tiny random-weight Llama for fast tests, with the SmolLM2 tokenizer so text prompts work."""

from __future__ import annotations

from pathlib import Path


def make_tiny_llama(out_dir: Path, tokenizer_dir: Path, *, num_heads: int = 4,
                    seed: int = 0) -> Path:
    """2 layers, hidden 256, head_dim 64 (vLLM's CPU attention needs head_dim >= 32);
    heads and KV heads divisible by 2 so tensor-parallel tests can split them."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64 * num_heads, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=num_heads, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, initializer_range=0.2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return Path(out_dir)
