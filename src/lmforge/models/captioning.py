"""Image captioning as translation with attention (seed 001, problem 2): a decoder that attends over a feature grid.

A translation decoder attends over the source positions M[t_in, J]. For an image the "source" is a
feature tensor M[x, y, K] from any image feature extractor (a CNN's last convolution, a ViT's patches,
or a synthetic grid): the X·Y cells take the place of the source words.

    α[x, y]  = softmax_{x, y}  h[t-1, J] W^key[J, K] M[x, y, K]        which cells to look at
    V[K]     = Σ_{x, y} α[x, y] M[x, y, K]                             what is read from them
    h[t, J]  = CELL(h[t-1, J], V[K], e[w_t, I])                        the decoder state

Here CELL is a Transformer decoder layer (``lmforge.nn.TransformerLayer`` with cross-attention), so α
is one head's cross-attention weights and W^key its query and key projections. Attention by itself
cannot tell cells apart, so every cell gets a 2-D position before the grid is flattened into X·Y memory
positions:

    memory[x·Y + y] = LN(M[x, y, :] W_inᵀ + P2D[x, y])                  (B, X·Y, D)

P2D writes the row x into one half of the channels and the column y into the other, with the fixed
sinusoids of Vaswani et al. (``lmforge.nn.attention2d.sinusoidal_positions_2d``).

Generation reuses ``lmforge.generation`` unchanged (``lmforge.generation.captions.caption``): the model has
``encode`` / ``decode`` / ``new_caches`` like ``Seq2Seq``. ``generate`` takes 2-D inputs, so the grid goes
in flattened to (B, X·Y·K); ``encode`` accepts either shape.

    >>> cfg = GridCaptionerConfig(vocab_size=20, d_feature=8, grid_x=3, grid_y=3, d_model=32, n_heads=4, d_ff=64)
    >>> model = GridCaptioner(cfg).eval()
    >>> out = model(torch.randn(2, 3, 3, 8), torch.tensor([[1, 5, 6], [1, 7, 2]]), output_attentions=True)
    >>> out.logits.shape, out.cross_attentions[0].shape          # (B, T, V), (B, H, T, X·Y)
    (torch.Size([2, 3, 20]), torch.Size([2, 4, 3, 9]))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models.common import check_ids, check_length, padding_mask, token_loss
from lmforge.models.config import (
    CONFIG_CLASSES,
    VOCAB,
    Activation,
    ConfigMixin,
    count,
    epsilon,
    kind,
    rate,
    size,
    token_id,
    where,
)
from lmforge.models.heads import LMHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn import LayerCache, SinusoidalPositions, TransformerLayer, scale_embedding
from lmforge.nn.attention2d import flatten_grid, sinusoidal_positions_2d
from lmforge.schema import setting


@dataclass
class GridCaptionerConfig(ConfigMixin):
    """A caption decoder over an X x Y grid of K-dimensional features.

    d_feature (K), grid_x (X), grid_y (Y): the feature grid; n_grid_layers self-attention layers may
    contextualise the cells first (0: the extractor's features are used as they are). max_length bounds
    the caption (start token included). positions_2d=False leaves out P2D (an ablation: the cells are
    then an unordered set). The decoder is pre-LN (a final LayerNorm before the LM head).
    """

    vocab_size: int = size(help=VOCAB)
    d_feature: int = size(help="K: the width of each grid cell's feature vector")
    grid_x: int = size(help="X: grid cells across")
    grid_y: int = size(help="Y: grid cells down")
    d_model: int = size(64, "model width d_model (even: half the channels per axis)")
    n_layers: int = count(2, "caption decoder layers")
    n_grid_layers: int = count(0, "self-attention layers over the grid cells first")
    n_heads: int = size(4, "attention heads (divide d_model)")
    d_ff: int = size(128, "feed-forward width")
    max_length: int = size(64, "longest caption, start token included")
    positions_2d: bool = setting(True, "add the 2-D positions P2D to the cells (False: an unordered set)")
    dropout: float = rate(0.0)
    activation: Activation = setting("relu", "feed-forward non-linearity: relu | gelu | gelu_tanh")
    eps: float = epsilon(1e-5)
    pad_id: int | None = token_id(0, "padding token id")
    bos_id: int | None = token_id(1, "first caption token")
    eos_id: int | None = token_id(2, "end of a caption")
    kind: str = kind("grid-captioner")

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if self.d_model % 2:
            raise LmforgeError(f"{where(source)}d_model={self.d_model} must be even (half the channels per axis)")


CONFIG_CLASSES.setdefault(GridCaptionerConfig.kind, GridCaptionerConfig)  # config.json kind "grid-captioner"


class GridCaptioner(nn.Module):
    """Transformer caption decoder with cross-attention over a flattened, 2-D-positioned feature grid."""

    def __init__(self, config: GridCaptionerConfig) -> None:
        super().__init__()
        self.config = c = config
        c.validate()

        def layer(decoder: bool) -> TransformerLayer:
            return TransformerLayer(c.d_model, c.n_heads, c.d_ff, norm_position="pre", activation=c.activation,
                                    dropout=c.dropout, eps=c.eps, causal=decoder, cross_attention=decoder)

        # -- the image side: M[x, y, K] -> memory (B, X·Y, D)
        self.feature_proj = nn.Linear(c.d_feature, c.d_model)  # W_in: (D, K)
        pos = sinusoidal_positions_2d(c.grid_x, c.grid_y, c.d_model).float().flatten(0, 1)  # (X·Y, D)
        self.register_buffer("grid_pos", pos if c.positions_2d else torch.zeros_like(pos), persistent=False)
        self.grid_norm = nn.LayerNorm(c.d_model, eps=c.eps)
        self.grid_layers = nn.ModuleList(layer(decoder=False) for _ in range(c.n_grid_layers))
        self.grid_norm_f = nn.LayerNorm(c.d_model, eps=c.eps) if c.n_grid_layers else None
        # -- the caption side: a pre-LN decoder with a tied LM head
        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # e: (V, D)
        self.positions = SinusoidalPositions(c.max_length, c.d_model)
        self.scale = scale_embedding(c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(layer(decoder=True) for _ in range(c.n_layers))
        self.norm_f = nn.LayerNorm(c.d_model, eps=c.eps)
        self.lm_head = LMHead(c.d_model, c.vocab_size)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(p)
        nn.init.normal_(self.embed.weight, mean=0.0, std=c.d_model**-0.5)
        self.lm_head.tie(self.embed)

    @property
    def n_cells(self) -> int:
        return self.config.grid_x * self.config.grid_y

    def as_grid(self, grid: torch.Tensor) -> torch.Tensor:
        """(B, X, Y, K) as is, or a flattened (B, X·Y·K) (what ``generate`` passes) reshaped to it."""
        c = self.config
        if grid.dim() == 2 and grid.shape[1] == self.n_cells * c.d_feature:
            grid = grid.view(grid.shape[0], c.grid_x, c.grid_y, c.d_feature)
        if grid.dim() != 4 or tuple(grid.shape[1:]) != (c.grid_x, c.grid_y, c.d_feature):
            raise LmforgeError(f"grid must have shape (batch, {c.grid_x}, {c.grid_y}, {c.d_feature}) or "
                               f"(batch, {self.n_cells * c.d_feature}), got {tuple(grid.shape)}")
        return grid.to(self.feature_proj.weight.dtype)

    def encode(self, grid: torch.Tensor, grid_mask: torch.Tensor | None = None) -> ModelOutput:
        """M[x, y, K] (B, X, Y, K) -> last_hidden_state = memory (B, X·Y, D), cell (x, y) at row x·Y + y.

        grid_mask: (B, X·Y) 1 = a real cell (None: all are).
        """
        m = flatten_grid(self.as_grid(grid))  # (B, X·Y, K), cell (x, y) at x·Y + y
        h = self.grid_norm(self.feature_proj(m) + self.grid_pos)  # (B, X·Y, D)
        mask = padding_mask(grid_mask)
        for layer in self.grid_layers:
            h = layer(h, key_padding_mask=mask).hidden
        if self.grid_norm_f is not None:
            h = self.grid_norm_f(h)
        return ModelOutput(last_hidden_state=self.drop(h))

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor | None,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        position_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """tgt_ids (B, T) (only the new ones with caches), memory (B, X·Y, D) -> logits (B, T, V).

        src_mask: (B, X·Y) 1 = real cell; tgt_mask: (B, T_total) 1 = real token. With caches the
        cross-attention keys and values are projected from memory once and reused (memory may be None).
        """
        check_ids(tgt_ids, "tgt_ids")
        past = caches[0].self_attention.length if caches else 0
        t = tgt_ids.shape[1]
        check_length(past + t, self.config.max_length, "caption")
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=tgt_ids.device)
        y = self.drop(self.embed(tgt_ids) * self.scale + self.positions(position_ids))  # (B, T, D)
        src, tgt = padding_mask(src_mask), padding_mask(tgt_mask)
        self_attentions, cross_attentions = [], []
        for i, layer in enumerate(self.layers):
            out = layer(y, memory, key_padding_mask=tgt, memory_padding_mask=src, need_weights=output_attentions,
                        cache=caches[i] if caches else None)
            y = out.hidden
            self_attentions.append(out.self_attention)
            cross_attentions.append(out.cross_attention)
        y = self.norm_f(y)
        return ModelOutput(
            logits=self.lm_head(y),  # (B, T, V)
            last_hidden_state=y,
            attentions=tuple(self_attentions) if output_attentions else None,
            cross_attentions=tuple(cross_attentions) if output_attentions else None,  # (B, H, T, X·Y) each
        )

    def forward(
        self,
        grid: torch.Tensor,
        tgt_ids: torch.Tensor,
        tgt_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """Teacher forcing: tgt_ids = [bos] + caption[:-1], labels = caption (-100 where no loss is wanted)."""
        memory = self.encode(grid).last_hidden_state
        out = self.decode(tgt_ids, memory, tgt_mask=tgt_mask, output_attentions=output_attentions)
        if labels is not None:
            out.loss = token_loss(out.logits, labels)
        return out

    def new_caches(
        self,
        batch: int,
        max_len: int,
        memory_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> list[LayerCache]:
        """Per decoder layer: self-attention cache of max_len, cross-attention cache of the X·Y cells.

        ``memory_len`` is what ``Seq2SeqSteps`` passes (the flattened input's width); the memory always
        has X·Y positions, so it is ignored.
        """
        check_length(max_len, self.config.max_length, "cache")
        weight = self.embed.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        return [layer.new_cache(batch, max_len, self.n_cells, dtype, device) for layer in self.layers]

    # -- captions and where they looked -------------------------------------------------------------
    @torch.no_grad()
    def attention_maps(self, grid: torch.Tensor, caption: list[int], layer: int | None = None) -> torch.Tensor:
        """α[t, x, y] for each word of ``caption`` (one grid (X, Y, K)): (T, X, Y), heads averaged.

        Row t holds the weights of the query that *produced* word t (it reads the words before it),
        as in α[x, y] = softmax h[t-1] W^key M[x, y]. ``layer`` picks one decoder layer; None averages them.
        """
        c = self.config
        ids = torch.tensor([[c.bos_id, *caption]], device=self.embed.weight.device)[:, :-1] if caption else None
        if ids is None:
            return torch.zeros(0, c.grid_x, c.grid_y)
        out = self(grid[None] if grid.dim() == 3 else grid, ids, output_attentions=True)
        weights = torch.stack(out.cross_attentions)[:, 0].mean(dim=1)  # (L, T, X·Y) heads averaged
        weights = weights.mean(dim=0) if layer is None else weights[layer]  # (T, X·Y)
        return weights.view(len(caption), c.grid_x, c.grid_y).cpu()
