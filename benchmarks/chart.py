"""Draw the benchmark results as one PNG (matplotlib).

    python -m benchmarks.chart benchmarks/results/*.json -o benchmarks/results.png

Takes the files written by the scripts' ``--json PATH`` option (any subset of decode, fanout and
paging) and draws one panel per figure: decode time and retained memory of the largest page,
requests per second of the bulk fetch, and wall time of the paging walks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SDK_COLOR = "#2a6fdb"
OTHER_COLOR = "#9aa5b1"
BASELINE_COLOR = "#3c4650"


def _color(name: str, baseline: str) -> str:
    if name == baseline:
        return BASELINE_COLOR
    return SDK_COLOR if name.startswith("asyncsearch") else OTHER_COLOR


def _barh(ax: Any, labels: list[str], values: list[float], colors: list[str], fmt: str) -> None:
    positions = range(len(labels))
    ax.barh(list(positions), values, color=colors)
    ax.set_yticks(list(positions), labels, fontsize=8)
    ax.invert_yaxis()
    top = max(values) if values else 1.0
    for y, value in zip(positions, values, strict=True):
        ax.text(value + top * 0.01, y, fmt.format(value), va="center", fontsize=7)
    ax.set_xlim(0, top * 1.22)
    ax.tick_params(axis="x", labelsize=7)


def _decode_panels(axes: list[Any], data: dict[str, Any]) -> None:
    size = max(data["sizes"], key=int)
    variants = data["sizes"][size]["variants"]
    names = list(variants)
    colors = [_color(n, "msgspec untyped") for n in names]
    _barh(axes[0], names, [variants[n]["seconds"] * 1000 for n in names], colors, "{:.0f} ms")
    axes[0].set_title(f"Decode a {size}-hit page with embeddings (ms, lower is better)", fontsize=9)
    retained = [variants[n]["retained"] / 1e6 for n in names]
    _barh(axes[1], names, retained, colors, "{:.1f} MB")
    axes[1].set_title(f"Memory kept by the decoded {size}-hit page (MB)", fontsize=9)


def _fanout_panel(ax: Any, data: dict[str, Any]) -> None:
    variants = data["variants"]
    names = list(variants)
    colors = [_color(n, "bare aiohttp + msgspec") for n in names]
    _barh(ax, names, [variants[n]["rps"] for n in names], colors, "{:,.0f}")
    latency = (
        f"{data.get('latency', 0) * 1000:g} ms latency" if data.get("latency") else "no latency"
    )
    ax.set_title(f"Fetch ~3 KB jobs, requests per second ({latency}, {data['loop']})", fontsize=9)


def _paging_panel(ax: Any, data: dict[str, Any]) -> None:
    labels: list[str] = []
    values: list[float] = []
    colors: list[str] = []
    for kind, walks in data["kinds"].items():
        for name, figures in walks.items():
            labels.append(f"{kind}: {name}")
            values.append(figures["wall"] * 1000)
            colors.append(_color(name, "hand-written sequential walk"))
    _barh(ax, labels, values, colors, "{:.0f} ms")
    p = data["params"]
    ax.set_title(
        f"Walk {p['pages']} pages, {p['latency'] * 1000:g} ms latency + {p['work'] * 1000:g} ms "
        "work per page (ms)",
        fontsize=9,
    )


def draw(results: Sequence[dict[str, Any]], output: Path) -> None:
    """One figure with a panel per result; SDK bars in blue, baselines in dark grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_name = {r["benchmark"]: r for r in results}
    panels = 2 * ("decode" in by_name) + ("fanout" in by_name) + ("paging" in by_name)
    if panels == 0:
        raise SystemExit("no decode, fanout or paging results given")
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels), squeeze=False)
    flat = [row[0] for row in axes]
    at = 0
    if "decode" in by_name:
        _decode_panels(flat[at : at + 2], by_name["decode"])
        at += 2
    if "fanout" in by_name:
        _fanout_panel(flat[at], by_name["fanout"])
        at += 1
    if "paging" in by_name:
        _paging_panel(flat[at], by_name["paging"])
    env = results[0]["environment"]["machine"]
    fig.suptitle(
        f"asyncsearch benchmarks: {env['cores']} cores, {env['cpu']}, {env['python']}",
        fontsize=10,
    )
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.chart", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("results", nargs="+", type=Path, help="JSON files written with --json")
    parser.add_argument("-o", "--output", type=Path, default=Path("benchmarks/results.png"))
    args = parser.parse_args(argv)
    results = [json.loads(path.read_text(encoding="utf-8")) for path in args.results]
    draw(results, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
