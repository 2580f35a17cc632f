"""docs/img/engine_slots.png: which request holds which slot at each step of a real engine run.

    .venv/bin/python scripts/engine_figure.py

Twelve requests of different lengths arrive over time at an engine of 8 slots (a tiny GPT, greedy); each bar is a
request in its slot from its prefill (the dot: its first token) to its last token; when a request ends below
others, the highest one moves down into its slot (``Engine.compact``, the thin line); the rows the steps ran are
shaded, and the queue waits when every slot is taken.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lmforge.generation.engine import Engine, Request
from lmforge.generation.slots import bucket
from lmforge.models import Decoder, get_preset
from lmforge.viz.plots import pyplot, save_figure

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "engine_slots.png"


def main() -> None:
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0)).eval()
    engine = Engine(model, slots=8)
    arrivals = {0: [14, 30, 9], 2: [22, 6], 5: [40, 12, 18], 9: [25], 12: [8, 35, 16]}  # step -> output lengths
    held: dict[int, list[tuple[int, int]]] = {}  # request -> [(step, slot)] of each step that decoded it
    first: dict[int, tuple[int, int]] = {}  # request -> (step, slot) of its prefill
    handles: list = []
    step = 0
    decode = engine.decode

    def watched_decode() -> None:  # the slots as this step decodes them (after compact and admit)
        for i, s in enumerate(engine.scheduler.slots):
            if s is not None:
                r = next(r for r, h in enumerate(handles) if h is s.generation)
                held.setdefault(r, []).append((step, i))
                first.setdefault(r, (step, i))
        decode()

    engine.decode = watched_decode
    while step <= max(arrivals) or not engine.idle():
        for n in arrivals.get(step, []):
            handles.append(engine.submit(Request([5, 6, 7], max_new_tokens=n, stop_ids=[])))
        engine.step()
        step += 1
    rows_per_step = [0] * step
    for spans in held.values():
        for s, slot in spans:
            rows_per_step[s] = max(rows_per_step[s], bucket(slot + 1, engine.runner.row_buckets))
    fig, ax = pyplot().subplots(figsize=(9, 3.6))
    for s, rows in enumerate(rows_per_step):
        ax.axvspan(s - 0.5, s + 0.5, ymin=0, ymax=rows / engine.n_slots, color="#eeeeee", zorder=0)
    colors = pyplot().get_cmap("tab20")
    for r, spans in held.items():
        for k, (s, slot) in enumerate(spans):
            ax.barh(slot, 1, left=s - 0.5, height=0.7, color=colors(r % 20), zorder=2)
            if k and spans[k - 1][1] != slot:  # moved down into a freed slot (Scheduler.compact)
                ax.plot([s - 0.5, s - 0.5], [spans[k - 1][1], slot], color=colors(r % 20), lw=1, zorder=1)
        ax.plot(*first[r], "o", color="black", markersize=3, zorder=3)
        ax.text(first[r][0] + 0.2, first[r][1], f"r{r}", va="center", fontsize=7, zorder=4)
    ax.set(xlabel="engine step", ylabel="slot", yticks=range(engine.n_slots), ylim=(-0.6, engine.n_slots - 0.4),
           title="Continuous batching: requests take free slots between steps, the last ones move down into holes")
    fig.tight_layout()
    print(save_figure(fig, OUT, dpi=130))


if __name__ == "__main__":
    main()
