"""docs/img/serve_throughput.png: completion tokens per second of lmforge serve and transformers serve, from one
bench/serve.py run (short and long replies, 1, 4 and 16 clients).

    .venv/bin/python scripts/serve_figure.py                      # docs/results/serve-cpu-2026-11-26e.jsonl
    .venv/bin/python scripts/serve_figure.py RESULTS.jsonl        # another run's rows (bench/serve.py's output)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lmforge.viz.plots import pyplot, save_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results" / "serve-cpu-2026-11-26e.jsonl"
OUT = ROOT / "docs" / "img" / "serve_throughput.png"
SERVERS = {"lmforge serve": "#1f77b4", "transformers serve --continuous-batching": "#ff7f0e",
           "transformers serve --no-continuous-batching": "#bbbbbb"}


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS
    rows = [json.loads(line) for line in source.read_text().splitlines() if '"bench": "serve"' in line]
    kinds = [k for k in ("short", "long") if any(r["prompts"] == k for r in rows)]
    fig, axes = pyplot().subplots(1, len(kinds), figsize=(5 * len(kinds), 3.6), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=True):
        clients = sorted({r["clients"] for r in rows if r["prompts"] == kind})
        width = 0.8 / len(SERVERS)
        for i, (server, color) in enumerate(SERVERS.items()):
            speed = {r["clients"]: r["tokens_per_s"] for r in rows if r["prompts"] == kind and r["server"] == server}
            xs = [c + (i - (len(SERVERS) - 1) / 2) * width for c in range(len(clients))]
            compiled = any(r.get("compile") for r in rows if r["server"] == server)
            label = f"{server} --compile" if compiled else server
            bars = ax.bar(xs, [speed.get(c, 0) for c in clients], width, color=color, label=label)
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set(xticks=range(len(clients)), xticklabels=[f"{c} client{'s' if c > 1 else ''}" for c in clients],
               ylabel="completion tokens / s", title=f"{kind} replies, SmolLM2-135M, 2 CPU cores")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    print(save_figure(fig, OUT, dpi=130))


if __name__ == "__main__":
    main()
