"""Draw the three attention masks of lmforge.nn (causal, padding, both) for a 6-token batch row with 2 pads.

Run: python examples/attention_masks.py   (writes $LMFORGE_OUT/attention_masks.png, default out/examples/)
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from lmforge.nn.attention import build_mask


def masks(t: int = 6, n_pad: int = 2) -> dict[str, torch.Tensor]:
    pad = torch.ones(1, t, dtype=torch.bool)
    pad[0, t - n_pad:] = False
    return {
        "causal (decoder)": build_mask(t, t, True, None, None, torch.device("cpu")),
        "padding (encoder)": build_mask(t, t, False, pad, None, torch.device("cpu"))[0, 0].expand(t, t),
        "causal + padding": build_mask(t, t, True, pad, None, torch.device("cpu"))[0, 0],
    }


def main() -> None:
    out = Path(os.environ.get("LMFORGE_OUT", "out/examples"))
    out.mkdir(parents=True, exist_ok=True)
    tokens = ["The", "cat", "sat", "down", "[PAD]", "[PAD]"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, (title, mask) in zip(axes, masks().items(), strict=True):
        ax.imshow(mask.int().numpy(), cmap="Greens", vmin=0, vmax=1.3)
        ax.set_title(title)
        ax.set_xticks(range(6), tokens, rotation=45)
        ax.set_yticks(range(6), tokens)
        ax.set_xlabel("key (attended to)")
    axes[0].set_ylabel("query (attending)")
    fig.suptitle("Boolean masks: green = may attend", y=1.03)
    fig.tight_layout()
    fig.savefig(out / "attention_masks.png", dpi=90, bbox_inches="tight")
    print(f"wrote {out / 'attention_masks.png'}")


if __name__ == "__main__":
    main()
