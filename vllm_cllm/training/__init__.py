"""Recipes that turn a Hugging Face causal LM into a checkpoint our proposers decode fast.

``trajectories``: Jacobi trajectory data (real iterates or synthesized noisy states);
``losses``: consistency and AR losses; ``cllm``: consistency distillation on HF Trainer.
"""
