"""What ``vllm-cllm bench`` writes: results.json, table.md and three PNG plots."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: results.json row fields, in order (the rest of a row — acceptance by position, seconds,
#: vLLM's own acceptance length, the spec — follows them). The oracle fields
#: (:mod:`vllm_cllm.bench.oracle`) are None outside ``jacobi`` rows.
FIELDS = ("model", "method", "dataset", "batch_size", "tpf", "tokens_per_s", "speedup",
          "identical", "oracle_tpf", "oracle_cost_tpf", "selection_efficiency",
          "oracle_cost_speedup")


def config_label(row: dict[str, Any]) -> str:
    return f"{row['model']} {row['method']}"


def write_results(rows: list[dict[str, Any]], out: Path, header: dict[str, Any]) -> str:
    """results.json, table.md and the plots; returns the Markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    slim = [{**{f: r.get(f) for f in FIELDS},
             **{k: v for k, v in r.items() if k not in FIELDS and k != "tokens"}} for r in rows]
    (out / "results.json").write_text(json.dumps({**header, "rows": slim}, indent=1))
    table = markdown(rows, header)
    (out / "table.md").write_text(table)
    plot_speedups(rows, out / "speedup.png")
    plot_acceptance(rows, out / "acceptance.png")
    plot_selection(rows, out / "selection.png")
    return table


def _number(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _grid(configs: list[str], columns: list[tuple[str, int]],
          cell: dict[tuple[str, str, int], dict[str, Any]],
          text: Callable[[dict[str, Any]], str]) -> list[str]:
    """A markdown table of configurations × (data set, batch size), each cell ``text(row)``
    (empty where the configuration has no row there)."""
    lines = ["| config | " + " | ".join(f"{d} b{b}" for d, b in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for config in configs:
        cells = [text(r) if (r := cell.get((config, d, b))) is not None else ""
                 for d, b in columns]
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return lines


def markdown(rows: list[dict[str, Any]], header: dict[str, Any]) -> str:
    """A speed-up summary (configuration × data set and batch size), then every row."""
    columns = sorted({(r["dataset"], r["batch_size"]) for r in rows},
                     key=lambda c: (list(header["datasets"]).index(c[0]), c[1]))
    configs = list(dict.fromkeys(config_label(r) for r in rows))
    cell = {(config_label(r), r["dataset"], r["batch_size"]): r for r in rows}
    lines = [f"vllm-cllm bench, {header['date']}: {header['description']}", "",
             "Speed-up over the same model without speculation (tokens per verify step in "
             "brackets; * = output not identical):", "",
             *_grid(configs, columns, cell, lambda r: f"{r['speedup']:.2f}x ({r['tpf']:.2f})"
                    f"{'' if r['identical'] else '*'}")]
    oracle_configs = [c for c in configs if any(
        r.get("oracle_tpf") is not None for (k, _, _), r in cell.items() if k == c)]
    if oracle_configs:
        lines += ["", "Tokens per verify step against the oracle (`jacobi` rows; "
                  "docs/benchmarking.md): the row / the best candidate at the best length "
                  "under the cost model / the best candidate at full length; in brackets "
                  "the selection efficiency (row / cost-model oracle; full-length where no "
                  "cost model), the cost-model oracle's tokens per priced cost over the "
                  "row's, and that times the row's tokens/s over vLLM `suffix`'s (the "
                  "sources' bound against it):", "",
                  *_grid(oracle_configs, columns, cell,
                         lambda r: _oracle_text(r, cell.get((f"{r['model']} suffix",
                                                             r["dataset"], r["batch_size"]))))]
    lines += ["", "| model | method | dataset | batch | tokens/verify step | tokens/step (with "
              "prefill) | accept. length (vLLM) | oracle (cost model) | oracle (full length) "
              "| selection eff. | oracle / row, priced | accepted / expected | tokens/s "
              "| speed-up | identical |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['method']} | {r['dataset']} | {r['batch_size']} | "
                     f"{r['tpf']:.2f} | {r['tokens_per_step']:.2f} | "
                     f"{r['vllm_acceptance_length']:.2f} | "
                     f"{_number(r.get('oracle_cost_tpf'))} | {_number(r.get('oracle_tpf'))} | "
                     f"{_number(r.get('selection_efficiency'))} | "
                     f"{_number(r.get('oracle_cost_speedup'))} | "
                     f"{_number(r.get('acceptance_calibration'))} | "
                     f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['identical']} |")
    return "\n".join(lines) + "\n"


def _oracle_text(row: dict[str, Any], suffix: dict[str, Any] | None) -> str:
    """A ``jacobi`` row's oracle cell: its tokens per verify step, the two oracles', its
    selection efficiency, the priced oracle's gain and (``suffix``: vLLM ``suffix``'s row of
    the same cell) the bound that gain sets against ``suffix``."""
    if row.get("oracle_tpf") is None:
        return ""
    gain = row.get("oracle_cost_speedup")
    brackets = [f"{row['selection_efficiency']:.2f}"]
    if gain is not None:
        brackets.append(f"{gain:.2f}x")
        if suffix is not None and suffix.get("tokens_per_s"):
            brackets.append(f"{gain * row['tokens_per_s'] / suffix['tokens_per_s']:.2f}x "
                            "suffix")
    return (f"{row['tpf']:.2f} / {_number(row.get('oracle_cost_tpf')) or '-'} / "
            f"{row['oracle_tpf']:.2f} ({', '.join(brackets)})")


def _datasets(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["dataset"] for r in rows))


def plot_speedups(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per data set: speed-up bars per configuration, one colour per batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = _datasets(rows)
    spec_rows = [r for r in rows if r["method"] != "none"]
    configs = list(dict.fromkeys(config_label(r) for r in spec_rows))
    batches = sorted({r["batch_size"] for r in rows})
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 0.45 * len(
        configs) * len(batches) + 1.5), sharey=True, squeeze=False)
    height = 0.8 / len(batches)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for j, batch in enumerate(batches):
            values = {config_label(r): r["speedup"] for r in spec_rows
                      if r["dataset"] == dataset and r["batch_size"] == batch}
            ax.barh([i + j * height for i in range(len(configs))],
                    [values.get(c, 0.0) for c in configs], height=height, label=f"batch {batch}")
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_title(dataset)
        ax.set_xlabel("speed-up vs no speculation")
    axes[0][0].set_yticks([i + height * (len(batches) - 1) / 2 for i in range(len(configs))])
    axes[0][0].set_yticklabels(configs)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_acceptance(rows: list[dict[str, Any]], path: Path) -> None:
    """Batch-1 acceptance rate by draft position (vLLM's per-position counters / drafts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = _datasets(rows)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.6),
                             sharey=True, squeeze=False)
    batch = min(r["batch_size"] for r in rows)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        for r in rows:
            if r["dataset"] == dataset and r["batch_size"] == batch and r[
                    "acceptance_by_position"]:
                rates = r["acceptance_by_position"]
                if r["model"] == "space":  # the last half of its slots are masks, never accepted
                    rates = rates[:len(rates) // 2]
                ax.plot(range(1, len(rates) + 1), rates, marker=".", label=config_label(r))
        ax.set_title(f"{dataset}, batch {batch}")
        ax.set_xlabel("draft position")
    axes[0][0].set_ylabel("accepted / drafts")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_selection(rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per data set: per ``jacobi`` row (configuration and batch size) its tokens per
    verify step beside the cost-model oracle and the full-length oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r.get("oracle_tpf") is not None]
    datasets = _datasets(mine) or _datasets(rows)
    labels = list(dict.fromkeys(f"{config_label(r)} b{r['batch_size']}" for r in mine))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets),
                                                        0.5 * max(len(labels), 1) + 1.8),
                             sharey=True, squeeze=False)
    bars = (("tpf", "row"), ("oracle_cost_tpf", "oracle, cost model"),
            ("oracle_tpf", "oracle, full length"))
    height = 0.8 / len(bars)
    for ax, dataset in zip(axes[0], datasets, strict=True):
        here = {f"{config_label(r)} b{r['batch_size']}": r for r in mine
                if r["dataset"] == dataset}
        for j, (key, name) in enumerate(bars):
            ax.barh([i + j * height for i in range(len(labels))],
                    [(here[c].get(key) or 0.0) if c in here else 0.0 for c in labels],
                    height=height, label=name)
        ax.set_title(dataset)
        ax.set_xlabel("tokens per verify step")
    if labels:
        axes[0][0].set_yticks([i + height * (len(bars) - 1) / 2 for i in range(len(labels))])
        axes[0][0].set_yticklabels(labels)
        axes[0][0].invert_yaxis()
        axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
