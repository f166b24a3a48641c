"""Errors the plugin raises, so that users see which option or which vLLM piece is at fault."""

from __future__ import annotations


class ConfigError(ValueError):
    """A speculative config this plugin cannot honour (unknown option, value out of range)."""


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM lacks a function or field the plugin wraps; nothing was patched."""

    def __init__(self, version: str, missing: list[str]):
        self.version, self.missing = version, missing
        super().__init__(
            f"vllm-cllm cannot run on vLLM {version}: missing {'; '.join(missing)}. "
            "Tested with vLLM 0.32.x and 0.33.x. Nothing was patched; install a supported vLLM, "
            "or exclude this plugin with VLLM_PLUGINS=<other plugins>."
        )
