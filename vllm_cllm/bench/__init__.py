"""The benchmark harness (``vllm-cllm bench``, lossless checks, the demo benchmarks' loop).

Not part of the plugin: the proposers never import it.
"""
