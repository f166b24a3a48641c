"""Pure Jacobi tokens per verify step against training wall time on the 2 cores (left) and
against optimizer steps (right, the GPU run too), one line per recipe and prompt format with
its prompts per step in the legend, from ``wide.py`` results (``results/rounds.json`` lists
which model each round left, the recipe's minutes when it was done and its optimizer steps by
then).

    .venv/bin/python experiments/cllm_own_drafts/plot_rounds.py
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent


def main() -> None:
    spec = json.loads((HERE / "results" / "rounds.json").read_text())
    figure, (by_time, by_steps) = plt.subplots(1, 2, figsize=(12, 7), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for recipe, color in zip(spec["recipes"], colors[:len(spec["recipes"])], strict=True):
        for fmt, style in (("instruction", "-o"), ("bare", "--s")):
            y = [spec["base"][fmt]] + [r[fmt] for r in recipe["rounds"]]
            label = f"{recipe['name']}, {recipe['rounds'][0]['prompts_per_step']}/step, {fmt}"
            if not recipe.get("gpu"):
                by_time.plot([0.0] + [r["minutes"] for r in recipe["rounds"]], y, style,
                             color=color, label=label)
            by_steps.plot([0] + [r["steps"] for r in recipe["rounds"]], y, style,
                         color=color, label=label)
    for ax in (by_time, by_steps):
        ax.axhline(spec["target"], color="gray", lw=0.8, ls=":")
    by_time.axvline(spec["budget_minutes"], color="gray", lw=0.8, ls=":")
    by_time.set_xlabel("training wall time on 2 cores (min)")
    by_steps.set_xlabel("optimizer steps")
    by_time.set_ylabel("pure Jacobi tokens / verify step")
    figure.suptitle(f"own drafts on {spec['problems']} unseen problems (k 15, fill tail)")
    figure.legend(*by_steps.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=7)
    figure.tight_layout(rect=(0, 0.22, 1, 1))  # the legend below both panels
    figure.savefig(HERE / "rounds.png", dpi=110)


if __name__ == "__main__":
    main()
