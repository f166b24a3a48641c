"""Helpers that start vLLM engines and servers with this platform's settings and prepare
checkpoints, for examples, tests, benchmarks and training. Not part of the plugin."""
