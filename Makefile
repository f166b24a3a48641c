# The README's two commands: `make demo` runs the demo CLLM with jacobi beside plain decoding,
# `make test` the test suite. Each first runs ./install.sh, which is idempotent (seconds when
# everything is in place).
.PHONY: setup demo serve test

setup:
	./install.sh

demo: setup
	.venv/bin/vllm-cllm demo

serve: setup
	.venv/bin/vllm-cllm demo --serve

test: setup
	.venv/bin/python -m pytest
