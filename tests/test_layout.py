"""The package by role: the plugin never imports the benchmark harness, the training recipes
or the engine helpers, and the proposers share code only through their shared modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What vLLM loads: the entry point, options, proposers, their sources, sizing, kernels and
#: the patches (installed as vllm_cllm.patches).
PRODUCT = ["vllm_cllm/plugin.py", "vllm_cllm/options.py", "vllm_cllm/errors.py",
           "vllm_cllm/proposers", "vllm_cllm/sources", "vllm_cllm/sizing", "vllm_cllm/kernels",
           "patches"]
NOT_PRODUCT = ("vllm_cllm.bench", "vllm_cllm.training", "vllm_cllm.runtime", "vllm_cllm.cli")


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _files(paths: list[str]) -> list[Path]:
    out = []
    for name in paths:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _offending(paths: list[str], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    """File → the forbidden modules it imports, for the files under ``paths`` that do."""
    found = {str(path.relative_to(ROOT)): sorted(
        name for name in _imports(path) if name.startswith(forbidden)) for path in _files(paths)}
    return {path: names for path, names in found.items() if names}


def test_the_plugin_imports_no_harness_training_or_helpers():
    assert _offending(PRODUCT, NOT_PRODUCT) == {}


def test_the_checkpoint_helpers_import_no_harness_or_training():
    """Building a demo from its artifact (runtime) needs neither the recipes nor the bench."""
    assert _offending(["vllm_cllm/runtime"],
                      ("vllm_cllm.bench", "vllm_cllm.training", "vllm_cllm.cli")) == {}


def test_the_proposers_do_not_import_each_other():
    for one, other in (("space", "jacobi"), ("jacobi", "space")):
        names = _imports(ROOT / f"vllm_cllm/proposers/{one}.py")
        assert not any(n.startswith(f"vllm_cllm.proposers.{other}") for n in names), one


def test_every_subpackage_is_installed():
    import re

    setup = (ROOT / "setup.py").read_text()
    listed = set(re.findall(r'"(\w+)"', setup.split("SUBPACKAGES = [", 1)[1].split("]", 1)[0]))
    on_disk = {p.parent.name for p in (ROOT / "vllm_cllm").glob("*/__init__.py")}
    assert listed == on_disk


def test_the_recipes_run_on_the_package_alone():
    """A recipe that makes a shipped checkpoint needs only the installed package and its CLI:
    no one-off study (experiments/) or measurement script (benchmarks/)."""
    for recipe in sorted((ROOT / "examples/recipes").glob("*.sh")):
        text = recipe.read_text()
        assert "experiments/" not in text and "benchmarks/" not in text, recipe.name
