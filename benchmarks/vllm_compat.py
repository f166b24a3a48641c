"""The plugin against vLLM's GPU builds, checked on a machine without a GPU (no engine).

For each admitted vLLM release (``vllm`` from PyPI, the CUDA build, with the torch it pins):
1. a throwaway virtual environment under ``--venvs`` with ``pip install vllm==X torch==<pin>``
   (pip's machine-wide find-links and constraints are switched off, so the CPU torch wheel
   on this machine's disk cannot stand in for the CUDA one); time and disk recorded;
2. a copy of this checkout's ``vllm_cllm`` (``patches/`` as ``vllm_cllm.patches``) and its
   ``vllm.general_plugins`` entry point on that environment's ``PYTHONPATH``;
3. in that environment, with no GPU visible: ``import vllm`` (if it fails, the frame where it
   stops), vLLM loading the plugin through its entry point, every probe of every patch group
   in ``patches/`` (passed or failed, one by one), each group applied, the proposer classes
   imported, and the ``--speculative-config``, ``--spec-method`` and ``--speculative-model``
   spellings (and the Python dict) parsed into vLLM's own ``SpeculativeConfig`` for a
   ``jacobi`` and a ``space`` config, plus the refused lossy or doomed fields this release
   has (``patches/speculative_config.py``).

Writes ``results.json`` and ``table.md`` to ``--out``. The environments stay for a re-run
(seconds) unless ``--remove`` is given; they are several GiB each.

    .venv/bin/python benchmarks/vllm_compat.py --out results/vllm_compat
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: The releases setup.py's ``cuda`` extra admits (0.32 has one release, 0.32.0).
RELEASES = ("0.32.0", "0.33.0")
#: pip settings of this machine that would let a local CPU wheel or a cap replace PyPI's.
_PIP_ENV_DROPPED = ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL",
                    "PIP_NO_INDEX", "PIP_CONFIG_FILE")
#: The parsed configs: (method, model name, k given, draft slots vLLM must get).
CONFIGS = (("jacobi", "tiny-random-llama", 15, 15), ("space", "tiny-random-space", 5, 10))


# ---------------------------------------------------------------- driver (any Python)

def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PIP_ENV_DROPPED}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide pip.conf (find-links, constraints)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def torch_pin(release: str, wheel_dir: Path) -> str:
    """The ``torch==`` requirement in the release's wheel METADATA."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = sorted(wheel_dir.glob(f"vllm-{release}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "-d", str(wheel_dir), f"vllm=={release}"], check=True, env=pip_env())
        wheels = sorted(wheel_dir.glob(f"vllm-{release}-*.whl"))
    with zipfile.ZipFile(wheels[-1]) as wheel:
        meta = wheel.read(f"vllm-{release}.dist-info/METADATA").decode()
    for line in meta.splitlines():
        if line.startswith("Requires-Dist: torch=="):
            return line.split(": ", 1)[1].split(";")[0].strip()
    raise RuntimeError(f"vllm {release}: no torch== pin in its METADATA")


def du_gib(path: Path) -> float:
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0]) / 2**30


def install(release: str, venv: Path, wheel_dir: Path, log: Path) -> dict[str, Any]:
    """Create ``venv`` with the GPU build of vLLM ``release`` (skipped if already there)."""
    pin = torch_pin(release, wheel_dir)
    marker = venv / ".vllm-compat-installed"
    info: dict[str, Any] = {"torch_pin": pin, "venv": str(venv)}
    if marker.exists():
        info.update(json.loads(marker.read_text()), reused=True)
        return info
    shutil.rmtree(venv, ignore_errors=True)
    start = time.time()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    with log.open("w") as out:
        # ray: the plugin's `ray` extra, which patches/ray_cpu.py's probes import.
        done = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--no-cache-dir", "--progress-bar", "off",
             f"vllm=={release}", pin, "ray"],
            stdout=out, stderr=subprocess.STDOUT, env=pip_env())
    if done.returncode:
        raise RuntimeError(f"pip install vllm=={release} failed; see {log}")
    record = {"install_s": round(time.time() - start, 1), "disk_gib": round(du_gib(venv), 2)}
    marker.write_text(json.dumps(record))
    info.update(record, reused=False)
    return info


def stage_plugin(stage: Path) -> None:
    """This checkout's package as an installed one would be laid out, with its entry point."""
    shutil.rmtree(stage, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "artifacts")
    shutil.copytree(ROOT / "vllm_cllm", stage / "vllm_cllm", ignore=ignore)
    shutil.copytree(ROOT / "patches", stage / "vllm_cllm" / "patches", ignore=ignore)
    info = stage / "vllm_cllm-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cllm\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nvllm_cllm = vllm_cllm.plugin:register\n")


def model_dirs() -> dict[str, str]:
    from vllm_cllm.runtime.checkpoints import model_path

    return {name: str(model_path(name)) for _, name, _, _ in CONFIGS}


def run_probe(venv: Path, stage: Path, models: dict[str, str], out: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON"))}
    env.update(PYTHONPATH=str(stage), CUDA_VISIBLE_DEVICES="", VLLM_LOGGING_LEVEL="ERROR")
    start = time.time()
    done = subprocess.run(
        [str(venv / "bin" / "python"), __file__, "--probe", "--models", json.dumps(models),
         "--result", str(out)], env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    result = json.loads(out.read_text()) if out.exists() else {}
    result["probe_s"] = round(time.time() - start, 1)
    if done.returncode:
        result["probe_process"] = f"exit {done.returncode}: {done.stderr[-2000:]}"
    return result


def rows(result: dict[str, Any]) -> dict[str, str]:
    """One release's result as check -> "passed" / "failed (why)"."""
    table: dict[str, str] = {}

    def put(name: str, ok: bool, why: str = "") -> None:
        table[name] = "passed" if ok else f"failed{f' ({why})' if why else ''}"

    imp = result.get("import", {})
    put("import vllm (no GPU)", imp.get("ok", False), imp.get("stops_at", ""))
    for name, check in result.get("vllm_limits", {}).items():
        table[name] = f"fails in vLLM itself ({check.get('error', '')})"
    for name, check in result.get("checks", {}).items():
        put(name, check["ok"], check.get("error", ""))
    for group, info in result.get("groups", {}).items():
        if "error" in info:
            put(f"{group}: patch_group()", False, info["error"])
        for probe, check in info.get("probes", {}).items():
            put(f"{group}: {probe}", check["ok"], check.get("error", ""))
        if "applied" in info:
            put(f"{group}: applied", info["applied"], info.get("apply_error", ""))
    for name, check in result.get("front_end", {}).items():
        put(name, check["ok"], check.get("error", ""))
    return table


def failed(result: dict[str, Any]) -> list[str]:
    """The plugin's checks that failed (limits of vLLM itself are reported, not counted)."""
    return [name for name, verdict in rows(result).items() if verdict.startswith("failed")]


def markdown(results: dict[str, dict[str, Any]]) -> str:
    releases = list(results)
    tables = {r: rows(results[r]) for r in releases}
    names = list(dict.fromkeys(n for r in releases for n in tables[r]))
    lines = ["| check | " + " | ".join(f"vllm {r}" for r in releases) + " |",
             "|---|" + "---|" * len(releases)]
    for name in names:
        cells = [tables[r].get(name, "absent").replace("|", "/")[:200] for r in releases]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for r in releases:
        res = results[r]
        inst, imp = res.get("install", {}), res.get("import", {})
        lines.append(
            f"- vllm {r}: {inst.get('torch_pin')} (torch {imp.get('torch')}, CUDA "
            f"{imp.get('torch_cuda')}, GPU visible: {imp.get('cuda_available')}, platform "
            f"{imp.get('platform')}); install {inst.get('install_s')} s, "
            f"{inst.get('disk_gib')} GiB; checks {res.get('probe_s')} s")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--releases", nargs="+", default=list(RELEASES))
    parser.add_argument("--venvs", type=Path, default=Path("/tmp/vllm-compat"),
                        help="where the throwaway environments go (several GiB each)")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "vllm_compat")
    parser.add_argument("--remove", action="store_true",
                        help="delete each environment after its checks")
    parser.add_argument("--install-only", action="store_true",
                        help="create the environments, check nothing")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--models", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        args.result.write_text(json.dumps(probe(json.loads(args.models)), indent=1))
        return 0
    args.out, args.venvs = args.out.resolve(), args.venvs.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.venvs.mkdir(parents=True, exist_ok=True)
    installed = {}
    for release in args.releases:
        venv = args.venvs / f"vllm-{release}"
        print(f"vllm {release}: installing into {venv} (log: {args.out}/pip-{release}.log)",
              flush=True)
        installed[release] = install(release, venv, args.venvs / "wheels",
                                     args.out / f"pip-{release}.log")
        print(f"vllm {release}: {installed[release]}", flush=True)
    if args.install_only:
        return 0
    models = model_dirs()
    stage = args.venvs / "plugin"
    stage_plugin(stage)
    results: dict[str, dict[str, Any]] = {}
    for release in args.releases:
        venv = args.venvs / f"vllm-{release}"
        result = run_probe(venv, stage, models, args.out / f"probe-{release}.json")
        result["install"] = installed[release]
        results[release] = result
        bad = failed(result)
        print(f"vllm {release}: {len(rows(result)) - len(bad)} checks without failure, "
              f"{len(bad)} failed{': ' + '; '.join(bad) if bad else ''}", flush=True)
        if args.remove:
            shutil.rmtree(venv, ignore_errors=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (args.out / "table.md").write_text(table)
    print(table)
    return 0 if all(not failed(r) for r in results.values()) else 1


# ---------------------------------------------------------------- probe (inside the venv)

def _where(exc: BaseException) -> str:
    """The innermost frames of a failure: the file and line where it stops, and why."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    at = " <- ".join(f"{f.filename.rpartition('site-packages/')[2]}:{f.lineno}"
                     for f in reversed(frames))
    return f"at {at}: {type(exc).__name__}: {str(exc)[:300]}"


def _check(fn, *args: Any) -> dict[str, Any]:
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - every failure is a finding
        return {"ok": False, "error": _where(exc)}
    if isinstance(value, dict):
        return {"ok": True, **value}
    return {"ok": bool(value)} if value is not None else {"ok": True}


def _front_end(method: str, model: str, flags: list[str] | None, spec: dict | None,
               expected_k: int) -> dict[str, Any]:
    from vllm.config import ParallelConfig, SpeculativeConfig
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    from vllm_cllm.options import ADDITIONAL_CONFIG_KEY, METHODS

    if flags is not None:
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
        engine_args: Any = AsyncEngineArgs.from_cli_args(
            parser.parse_args(["--model", model, "--max-model-len", "512", *flags]))
    else:
        engine_args = EngineArgs(model=model, max_model_len=512, speculative_config=spec)
    model_config = engine_args.create_model_config()
    config = engine_args.create_speculative_config(model_config, ParallelConfig())
    assert isinstance(config, SpeculativeConfig), type(config)
    assert config.method == "custom_class", config.method
    assert config.model == METHODS[method], config.model
    assert config.num_speculative_tokens == expected_k, config.num_speculative_tokens
    extra = engine_args.additional_config[ADDITIONAL_CONFIG_KEY]
    assert extra["method"] == method, extra
    return {"num_speculative_tokens": config.num_speculative_tokens}


def _refused(model: str, field: str, value: Any) -> dict[str, Any]:
    from vllm.config import ParallelConfig
    from vllm.engine.arg_utils import EngineArgs

    from vllm_cllm.errors import ConfigError

    engine_args = EngineArgs(model=model, max_model_len=512, speculative_config={
        "method": "jacobi", "num_speculative_tokens": 4, field: value})
    try:
        engine_args.create_speculative_config(engine_args.create_model_config(),
                                              ParallelConfig())
    except ConfigError as err:
        assert field in str(err), str(err)
        return {"message": str(err)}
    raise AssertionError(f"{field}={value!r} was passed through")


def probe(models: dict[str, str]) -> dict[str, Any]:
    """Everything that can be checked without an engine, each failure recorded, not raised."""
    import importlib
    import pkgutil

    result: dict[str, Any] = {"import": {}, "checks": {}, "groups": {}, "front_end": {}}
    imp = result["import"]
    try:
        import torch

        imp.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                   cuda_available=torch.cuda.is_available())
        import vllm
        from vllm.platforms import current_platform

        imp.update(ok=True, vllm=vllm.__version__, platform=type(current_platform).__name__,
                   device_type=current_platform.device_type)
    except BaseException as exc:  # noqa: BLE001
        imp.update(ok=False, stops_at=_where(exc), traceback=traceback.format_exc()[-4000:])
        return result

    def entry_point_loaded() -> bool:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        return getattr(EngineArgs.create_speculative_config, "__vllm_cllm_patch__", False)

    result["checks"]["plugin loaded by vLLM (vllm.general_plugins)"] = _check(entry_point_loaded)

    import vllm_cllm.patches as patches

    for info in pkgutil.iter_modules(patches.__path__):
        module = importlib.import_module(f"vllm_cllm.patches.{info.name}")
        if not hasattr(module, "patch_group"):
            continue
        try:
            group = module.patch_group()
        except BaseException as exc:  # noqa: BLE001
            result["groups"][info.name] = {"error": _where(exc)}
            continue
        probes = {desc: _check(fn) for desc, fn in group.probes}
        entry: dict[str, Any] = {"probes": probes}
        try:
            group.apply()
            entry["applied"] = group.is_applied()
        except BaseException as exc:  # noqa: BLE001
            entry.update(applied=False, apply_error=_where(exc))
        result["groups"][info.name] = entry

    from vllm_cllm.options import METHODS

    for method, path in METHODS.items():
        def load(path=path):
            module, _, name = path.rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            return callable(getattr(cls, "propose", None)) and callable(
                getattr(cls, "load_model", None))

        result["checks"][f"proposer class {method} imports ({path})"] = _check(load)

    def cli_parser_builds() -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())

    # vLLM builds its CLI defaults with a DeviceConfig, which needs a detected platform: on a
    # machine without a GPU the GPU build detects none. Then the platform's device name is set
    # to what a GPU would give, and the plugin's spellings are parsed with that.
    parser_check = _check(cli_parser_builds)
    result["vllm_limits"] = {}
    device_note = ""
    if not parser_check["ok"]:
        result["vllm_limits"]["vLLM's CLI parser without a GPU (AsyncEngineArgs.add_cli_args)"] = \
            parser_check
        from vllm.platforms import current_platform

        type(current_platform).device_type = "cuda"
        device_note = " [device_type set to cuda]"
    front = result["front_end"]
    for method, name, k, slots in CONFIGS:
        model = models[name]
        spellings = {
            "--speculative-config": ["--speculative-config",
                                     json.dumps({"method": method, "num_speculative_tokens": k})],
            "--spec-method": ["--spec-method", method, "--spec-tokens", str(k)],
            "--speculative-model": ["--speculative-model", f"[{method}]",
                                    "--num-speculative-tokens", str(k)],
        }
        for spelling, flags in spellings.items():
            front[f"{spelling} {method} k {k} -> SpeculativeConfig{device_note}"] = _check(
                _front_end, method, model, flags, None, slots)
        front[f"LLM(speculative_config={{'method': '{method}'}}) -> SpeculativeConfig"] = _check(
            _front_end, method, model, None, {"method": method, "num_speculative_tokens": k},
            slots)
    from vllm_cllm.patches import speculative_config as sc

    refused = getattr(sc, "refused_fields", lambda: {})()
    for field, (value, _reason) in refused.items():
        front[f"refused before the engine: {field}={value!r}"] = _check(
            _refused, models["tiny-random-llama"], field, value)
    return result


if __name__ == "__main__":
    sys.exit(main())
