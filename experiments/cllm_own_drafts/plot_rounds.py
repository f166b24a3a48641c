"""Pure Jacobi tokens per verify step against training wall time, one line per recipe and
prompt format, from ``wide.py`` results (``results/rounds.json`` lists which model each round
left and the recipe's minutes when it was done).

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
    figure, ax = plt.subplots(figsize=(7, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for recipe, color in zip(spec["recipes"], colors[:len(spec["recipes"])], strict=True):
        for fmt, style in (("instruction", "-o"), ("bare", "--s")):
            x = [0.0] + [r["minutes"] for r in recipe["rounds"]]
            y = [spec["base"][fmt]] + [r[fmt] for r in recipe["rounds"]]
            ax.plot(x, y, style, color=color, label=f"{recipe['name']}, {fmt}")
    ax.axhline(spec["target"], color="gray", lw=0.8, ls=":")
    ax.axvline(spec["budget_minutes"], color="gray", lw=0.8, ls=":")
    ax.set_xlabel("training wall time on 2 cores (min)")
    ax.set_ylabel("pure Jacobi tokens / verify step")
    ax.set_title(f"own drafts on {spec['problems']} unseen problems (k 15, fill tail)")
    ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(HERE / "rounds.png", dpi=110)


if __name__ == "__main__":
    main()
