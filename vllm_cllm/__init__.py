"""vllm-cllm: self-drafting parallel decoding (Jacobi / CLLM, SPACE) inside vLLM."""

__version__ = "0.1.0"
