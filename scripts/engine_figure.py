"""docs/img/engine_slots.png: which request holds which slot at each step of a real engine run.

    .venv/bin/python scripts/engine_figure.py

Twelve requests of different lengths arrive over time at an engine of 8 slots (a tiny GPT, greedy); each bar is a
request in its slot from its prefill (the dot: its first token) to its last token, the row buckets the steps ran
at are shaded, and the queue waits when every slot is taken.
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
    spans: dict[int, list] = {}  # request -> [slot, first step, last step]
    rows_per_step, handles, step = [], [], 0
    while step <= max(arrivals) or not engine.idle():
        for n in arrivals.get(step, []):
            handles.append(engine.submit(Request([5, 6, 7], max_new_tokens=n, stop_ids=[])))
        before = {id(s.generation): i for i, s in enumerate(engine.slots) if s is not None}
        engine.step()
        for r, h in enumerate(handles):  # held during this step: in a slot now, or in one before that it left
            held = [i for i, s in enumerate(engine.slots) if s is not None and s.generation is h]
            slot = held[0] if held else before.get(id(h))
            if slot is None and h.done and r not in spans:  # admitted and finished within this one step
                slot = next(i for i, s in enumerate(engine.slots) if s is None)
            if slot is not None and (held or h.done) and (r not in spans or spans[r][2] >= step - 1):
                spans.setdefault(r, [slot, step, step])[2] = step
        during = [slot for slot, _, last in spans.values() if last == step]  # the slots this step decoded
        rows_per_step.append(bucket(max(during) + 1, engine.row_buckets) if during else 0)
        step += 1
    fig, ax = pyplot().subplots(figsize=(9, 3.6))
    for s, rows in enumerate(rows_per_step):
        ax.axvspan(s - 0.5, s + 0.5, ymin=0, ymax=rows / engine.n_slots, color="#eeeeee", zorder=0)
    colors = pyplot().get_cmap("tab20")
    for r, (slot, first, last) in spans.items():
        ax.barh(slot, last - first + 1, left=first - 0.5, height=0.7, color=colors(r % 20), zorder=2)
        ax.plot(first, slot, "o", color="black", markersize=3, zorder=3)
        ax.text(first + 0.2, slot, f"r{r}", va="center", fontsize=7, zorder=4)
    ax.set(xlabel="engine step", ylabel="slot", yticks=range(engine.n_slots), ylim=(-0.6, engine.n_slots - 0.4),
           title="Continuous batching: requests take free slots between steps (grey: the rows a step ran)")
    fig.tight_layout()
    print(save_figure(fig, OUT, dpi=130))


if __name__ == "__main__":
    main()
