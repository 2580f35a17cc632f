"""Pictures of models and runs: attention heatmaps and the HTML explorer, rollout, positional encodings,
loss curves, confusion matrices. matplotlib is imported only when a picture is drawn.

    attention.py       plot_attention (PNG heatmaps per layer and head), plot_rollout
    views.py           what the attention pictures draw: a model's attention on one text, by view
    explorer.py        write_attention_page: the self-contained HTML attention explorer (weights inside)
    explorer_page.py   the explorer's HTML skeleton; its style and script in explorer.css and explorer.js
    plots.py           plot_positional_encoding, plot_loss_curves
    confusion.py       plot_confusion
    grid_attention.py  plot_grid_attention (a caption decoder's attention over a feature grid, per word)
"""

from lmforge.viz.attention import plot_attention, plot_rollout
from lmforge.viz.confusion import plot_confusion
from lmforge.viz.explorer import attention_page, page_data, write_attention_page
from lmforge.viz.grid_attention import plot_grid_attention
from lmforge.viz.plots import plot_loss_curves, plot_positional_encoding

__all__ = [
    "attention_page",
    "page_data",
    "plot_attention",
    "plot_confusion",
    "plot_grid_attention",
    "plot_loss_curves",
    "plot_positional_encoding",
    "plot_rollout",
    "write_attention_page",
]
