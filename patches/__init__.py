"""vLLM-version-specific patches, kept in one place so that a new vLLM release means one review.

Every patch wraps a vLLM function: it calls the captured original and passes unknown arguments
through. A patch group is applied all-or-nothing: all probes run first, and if any fails,
:class:`~vllm_cllm.errors.UnsupportedVllmError` names the vLLM version and the missing pieces
before anything is changed. Applying a group twice is a no-op (plugins load in every process,
sometimes more than once).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_cllm.errors import UnsupportedVllmError

_MARK = "__vllm_cllm_patch__"


def vllm_version() -> str:
    """Version string of the importable vLLM (the CPU build reports the same numbers)."""
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:  # pragma: no cover - vLLM import itself failing
        return "not importable"


@dataclass
class Wrap:
    """Replace ``owner.attr`` by ``make(original)``; handles plain and static methods."""

    owner: Any
    attr: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]

    def raw(self) -> Any:
        return self.owner.__dict__.get(self.attr) if isinstance(self.owner, type) else getattr(
            self.owner, self.attr, None)

    def is_applied(self) -> bool:
        raw = self.raw()
        func = raw.__func__ if isinstance(raw, staticmethod) else raw
        return getattr(func, _MARK, False)

    def apply(self) -> None:
        if self.is_applied():
            return
        raw = self.raw()
        is_static = isinstance(raw, staticmethod)
        original = raw.__func__ if is_static else raw
        wrapper = functools.wraps(original)(self.make(original))
        setattr(wrapper, _MARK, True)
        setattr(self.owner, self.attr, staticmethod(wrapper) if is_static else wrapper)


@dataclass
class PatchGroup:
    """Probes that must all hold, then the wraps that rely on them."""

    name: str
    probes: list[tuple[str, Callable[[], bool]]] = field(default_factory=list)
    wraps: list[Wrap] = field(default_factory=list)

    def missing(self) -> list[str]:
        out = []
        for description, check in self.probes:
            try:
                ok = bool(check())
            except Exception:
                ok = False
            if not ok:
                out.append(description)
        return out

    def apply(self) -> None:
        apply_groups([self])

    def is_applied(self) -> bool:
        return all(w.is_applied() for w in self.wraps)


def has_params(func: Any, *names: str) -> bool:
    """True when ``func`` accepts every parameter in ``names`` (a cheap signature probe)."""
    import inspect

    params = inspect.signature(func).parameters
    return all(n in params for n in names)


def apply_groups(groups: list[PatchGroup]) -> None:
    """Probe every group first, then apply them all: never half-patch across groups either."""
    missing = [m for group in groups for m in group.missing()]
    if missing:
        raise UnsupportedVllmError(vllm_version(), missing)
    for group in groups:
        for wrap in group.wraps:
            wrap.apply()
