"""`space` k 5 tokens per verify step over a SPACE run's training, from its saved checkpoints.

Each saved Trainer checkpoint of ``vllm-cllm train space`` (``RUN/trainer/checkpoint-N``, which
records its mask token as the run's adapter does) is merged into the base and measured
by ``wide.py --config space`` on the unseen problems (both prompt formats, answer quality
beside). Resumable: a checkpoint whose ``OUT/NAME-N/wide.json`` exists is not measured again.
Writes ``OUT/curve.json`` and ``space_curve.png`` here (drafts against optimizer steps, and
the first mask slot's accuracy on training batches from the run's ``log_history.json``).

    .venv/bin/python experiments/cllm_own_drafts/space_curve.py --out results/space_curve \\
        --run 3_epochs=results/space-anchor4/run --run 2_epochs=results/space-anchor2/run --every 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def saved_steps(run: Path) -> dict[int, Path]:
    """Optimizer step → checkpoint folder, for every checkpoint that holds an adapter."""
    steps = {}
    for folder in (run / "trainer").glob("checkpoint-*"):
        if (folder / "adapter_model.safetensors").exists():
            steps[int(folder.name.rsplit("-", 1)[1])] = folder
    return dict(sorted(steps.items()))


def measure(name: str, run: Path, checkpoint: Path, out: Path, problems: int) -> dict:
    """``wide.py --config space``'s results for one checkpoint, merged and measured once."""
    from vllm_cllm.runtime.checkpoints import merged_checkpoint, model_path

    if not (out / "wide.json").exists():
        base = json.loads((run / "train_config.json").read_text())["base_model"]
        with merged_checkpoint(Path(model_path(base)), checkpoint) as model:
            subprocess.run([sys.executable, str(HERE / "wide.py"), "--out", str(out),
                            "--config", "space", "--problems", str(problems),
                            "--model", f"{name}={model}"], check=True)
    return json.loads((out / "wide.json").read_text())


def mask_accuracy(run: Path, window: int = 100) -> list[tuple[int, float]]:
    """The first mask slot's accuracy on training batches, averaged over ``window`` steps."""
    buckets: dict[int, list[float]] = {}
    for entry in json.loads((run / "log_history.json").read_text()):
        if "mask_accuracy" in entry:
            end = -(-entry["step"] // window) * window  # the window's last step
            buckets.setdefault(end, []).append(entry["mask_accuracy"])
    return [(end, sum(values) / len(values)) for end, values in sorted(buckets.items())]


def plot(curve: dict, runs: dict[str, Path], target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (drafts, accuracy) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for (name, points), color in zip(curve["runs"].items(), colors, strict=False):
        for fmt, style in (("instruction", "-o"), ("bare", "--s")):
            drafts.plot([p["step"] for p in points], [p[fmt] for p in points], style,
                        color=color, label=f"{name}, {fmt}")
        smoothed = mask_accuracy(runs[name])
        accuracy.plot([s for s, _ in smoothed], [a for _, a in smoothed], color=color,
                      label=name)
    drafts.axhline(target, color="gray", lw=0.8, ls=":")
    drafts.set_xlabel("optimizer steps")
    drafts.set_ylabel("space k 5 tokens / verify step")
    drafts.set_xlim(left=0)
    drafts.set_title(f"{curve['problems']} unseen problems (seed {curve['seed']})")
    drafts.legend(fontsize=7)
    accuracy.set_xlabel("optimizer steps")
    accuracy.set_xlim(left=0)
    accuracy.set_ylabel("first mask slot right, training batches (100-step mean)")
    accuracy.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(HERE / "space_curve.png", dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", required=True, metavar="NAME=RUN_DIR")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", type=int, default=24)
    parser.add_argument("--every", type=int, default=1,
                        help="measure every n-th saved checkpoint (the last always)")
    args = parser.parse_args()
    runs = {}
    for item in args.run:
        name, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "trainer").is_dir():
            parser.error(f"--run wants NAME=RUN_DIR of a `vllm-cllm train space` run: {item}")
        runs[name] = Path(folder)
    curve = {"problems": args.problems, "seed": None, "runs": {}}
    for name, run in runs.items():
        steps = list(saved_steps(run).items())
        chosen = steps[args.every - 1::args.every]
        if steps and steps[-1] not in chosen:
            chosen.append(steps[-1])
        points = []
        for step, checkpoint in chosen:
            where = args.out / f"{name}-{step}"
            measured = measure(name, run, checkpoint, where, args.problems)
            curve["seed"], rows = measured["seed"], measured["rows"]
            points.append({"step": step, **{r["prompt"]: r["tokens_per_verify_step"]
                                            for r in rows},
                           "quality": {r["prompt"]: {k: r[k] for k in (
                               "distinct_4", "nll_under_base", "answer_tokens", "accuracy")}
                               for r in rows}})
            print(json.dumps({"run": name, **points[-1]}), flush=True)
        curve["runs"][name] = points
    (args.out / "curve.json").write_text(json.dumps(curve, indent=1))
    plot(curve, runs, target=3.0)


if __name__ == "__main__":
    main()
