"""The package by role: the plugin never imports the benchmark harness, the training recipes
or the engine helpers, and the proposers share code only through their shared modules."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What vLLM loads: the entry point, options, proposers, their sources, sizing, kernels and
#: the patches (installed as vllm_cllm.patches).
PRODUCT = ["vllm_cllm/plugin.py", "vllm_cllm/options.py", "vllm_cllm/errors.py",
           "vllm_cllm/core", "vllm_cllm/sources", "vllm_cllm/policies", "vllm_cllm/methods",
           "vllm_cllm/proposers", "vllm_cllm/kernels", "patches"]
#: The product's layers, lowest first: a module imports only from its own layer or below.
LAYERS = [("vllm_cllm.errors", "vllm_cllm.kernels"), ("vllm_cllm.core",),
          ("vllm_cllm.sources",), ("vllm_cllm.policies",), ("vllm_cllm.options",),
          ("vllm_cllm.methods",), ("vllm_cllm.patches",), ("vllm_cllm.proposers",),
          ("vllm_cllm.plugin",)]
NOT_PRODUCT = ("vllm_cllm.bench", "vllm_cllm.training", "vllm_cllm.runtime", "vllm_cllm.cli")


def _module(path: Path) -> str:
    """The dotted name a file installs as (``patches/`` installs as vllm_cllm.patches)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "patches":
        parts.insert(0, "vllm_cllm")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at its top or inside a function (relative imports
    resolved): a lazy import is still a dependency."""
    found = set()
    package = _module(path) if path.name == "__init__.py" else _module(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
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


def _graph() -> dict[str, set[str]]:
    """Module → the package's modules it imports, over vllm_cllm/ and patches/."""
    paths = _files(["vllm_cllm", "patches"])
    modules = {_module(path): path for path in paths}
    return {name: {m for m in _imports(path) if m in modules and m != name}
            for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles_in_the_package_or_the_patches():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_sees_lazy_and_relative_imports():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # options imports the suffix trees' probe inside a function
    assert "vllm_cllm.sources.suffix_trees" in _imports(ROOT / "vllm_cllm/options.py")
    # patches/worker.py imports its sibling modules relatively
    assert "vllm_cllm.patches.verify_capture" in _imports(ROOT / "patches/worker.py")


def _layer(module: str) -> int | None:
    for depth, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return depth
    return None


def test_lower_layers_never_import_higher_ones():
    upward = {}
    for module, imported in _graph().items():
        depth = _layer(module)
        if depth is None:
            continue
        above = sorted(m for m in imported if (_layer(m) or 0) > depth)
        if above:
            upward[module] = above
    assert upward == {}


def test_the_drafting_core_imports_no_vllm():
    """core, sources, policies and methods run without vLLM (the adapter owns it)."""
    found = {str(path.relative_to(ROOT)): sorted(
        m for m in _imports(path) if m == "vllm" or m.startswith("vllm."))
        for path in _files(["vllm_cllm/core", "vllm_cllm/sources", "vllm_cllm/policies",
                            "vllm_cllm/methods"])}
    assert {path: names for path, names in found.items() if names} == {}
