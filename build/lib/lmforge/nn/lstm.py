"""The LSTM of Hochreiter & Schmidhuber (1997), a cell and a stacked, optionally bidirectional layer.

One step, in the notation of seed 000 question 9 (and of ``lmforge.reference.lstm_cell``):

    z   = W [h_{t-1}; x_t] + b                 W = [W_hh | W_ih]: (4J, J + I), split in gates i, f, g, o
    i_t = σ(z_i)   f_t = σ(z_f)   g_t = tanh(z_g)   o_t = σ(z_o)
    c_t = f_t ⊙ c_{t-1} + i_t ⊙ g_t
    h_t = o_t ⊙ tanh(c_t)

The weight is stored as its two column blocks, ``weight_hh`` (4J, J) and ``weight_ih`` (4J, I), which is
also PyTorch's layout: ``LSTM`` then runs a whole sequence in PyTorch's fused kernel (the fast path) with
exactly these parameters, and ``explicit=True`` runs the same equations one step at a time in Python
(the path the tests compare with the NumPy reference). Both give the same numbers.

Padding. Sequences are right-padded, ``mask`` (B, T) 1 = real token. Padded steps neither read nor change
the state, so the final state of a row is its state after its last real token, and the backward
direction of a bidirectional layer starts at each row's own last token. Outputs at padded steps are 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

State = tuple[torch.Tensor, torch.Tensor]


class LSTMCell(nn.Module):
    """One LSTM step, (x_t, (h_{t-1}, c_{t-1})) -> (h_t, c_t); equals ``reference.lstm_cell``.

    >>> cell = LSTMCell(3, 2)
    >>> h, c = cell(torch.zeros(1, 3))               # state starts at zeros
    >>> h.shape, c.shape, cell.weight.shape          # weight = [W_hh | W_ih] acting on [h; x]
    (torch.Size([1, 2]), torch.Size([1, 2]), torch.Size([8, 5]))
    """

    def __init__(self, input_size: int, hidden_size: int, forget_bias: float = 1.0) -> None:
        super().__init__()
        self.input_size, self.hidden_size = input_size, hidden_size
        j = hidden_size
        self.weight_hh = nn.Parameter(torch.empty(4 * j, j))  # (4J, J): acts on h_{t-1}
        self.weight_ih = nn.Parameter(torch.empty(4 * j, input_size))  # (4J, I): acts on x_t
        self.bias = nn.Parameter(torch.empty(4 * j))  # b: (4J,)
        self.reset_parameters(forget_bias)

    def reset_parameters(self, forget_bias: float = 1.0) -> None:
        """U(-1/√J, 1/√J) as in PyTorch; the forget gate's bias starts at ``forget_bias`` (remember by default)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in (self.weight_hh, self.weight_ih, self.bias):
            nn.init.uniform_(p, -bound, bound)
        with torch.no_grad():
            self.bias[self.hidden_size: 2 * self.hidden_size].fill_(forget_bias)

    @property
    def weight(self) -> torch.Tensor:
        """W = [W_hh | W_ih] (4J, J + I), the reference's single matrix acting on [h_{t-1}; x_t]."""
        return torch.cat([self.weight_hh, self.weight_ih], dim=1)

    def zero_state(self, batch: int, like: torch.Tensor) -> State:
        h = like.new_zeros(batch, self.hidden_size)
        return h, h.clone()

    def forward(self, x: torch.Tensor, state: State | None = None) -> State:
        """x (B, I), state (h, c) each (B, J) or None for zeros -> (h_t, c_t) each (B, J)."""
        h, c = state if state is not None else self.zero_state(x.shape[0], x)
        z = x @ self.weight_ih.T + h @ self.weight_hh.T + self.bias  # (B, 4J)
        z_i, z_f, z_g, z_o = z.chunk(4, dim=-1)  # each (B, J)
        c = torch.sigmoid(z_f) * c + torch.sigmoid(z_i) * torch.tanh(z_g)
        h = torch.sigmoid(z_o) * torch.tanh(c)
        return h, c


@dataclass
class LSTMOutput:
    """output: the last layer (B, T, dirs·J); layers: every layer's output, bottom to top;
    h_n, c_n: final states (layers·dirs, B, J), ordered layer by layer, forward before backward."""

    output: torch.Tensor
    layers: list[torch.Tensor]
    h_n: torch.Tensor
    c_n: torch.Tensor


class LSTM(nn.Module):
    """A stack of LSTM layers over (B, T, I); bidirectional layers concatenate [forward; backward].

    Cell k = layer · dirs + direction. Dropout (training only) applies between layers, not after the last.

    >>> lstm = LSTM(4, 3, num_layers=2, bidirectional=True)
    >>> out = lstm(torch.randn(2, 5, 4), mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]))
    >>> out.output.shape, len(out.layers), out.h_n.shape
    (torch.Size([2, 5, 6]), 2, torch.Size([4, 2, 3]))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                 dropout: float = 0.0, forget_bias: float = 1.0) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.dirs = 2 if bidirectional else 1
        self.cells = nn.ModuleList(
            LSTMCell(input_size if layer == 0 else hidden_size * self.dirs, hidden_size, forget_bias)
            for layer in range(num_layers) for _ in range(self.dirs)
        )
        self.drop = nn.Dropout(dropout)

    @property
    def output_size(self) -> int:
        return self.hidden_size * self.dirs

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, state: State | None = None,
                explicit: bool = False) -> LSTMOutput:
        """x (B, T, I), mask (B, T) 1 = real (right-padded), state (h_0, c_0) each (layers·dirs, B, J)."""
        b, t, _ = x.shape
        lengths = mask.long().sum(1) if mask is not None else torch.full((b,), t, dtype=torch.long)
        layers, h_n, c_n = [], [], []
        for layer in range(self.num_layers):
            if layer > 0:
                x = self.drop(x)
            ks = range(layer * self.dirs, (layer + 1) * self.dirs)  # this layer's cells: forward (, backward)
            if explicit:
                outs = []
                for d, k in enumerate(ks):
                    s0 = (state[0][k], state[1][k]) if state is not None else None
                    out, (h, c) = self._explicit(self.cells[k], x, lengths, s0, reverse=d == 1)
                    outs.append(out)
                    h_n.append(h[None])
                    c_n.append(c[None])
                x = torch.cat(outs, dim=-1) if self.dirs == 2 else outs[0]  # (B, T, dirs·J)
            else:
                s0 = (state[0][ks.start:ks.stop], state[1][ks.start:ks.stop]) if state is not None else None
                x, (h, c) = self._fused([self.cells[k] for k in ks], x, lengths, s0)
                h_n.append(h)
                c_n.append(c)
            layers.append(x)
        return LSTMOutput(x, layers, torch.cat(h_n), torch.cat(c_n))

    @staticmethod
    def _explicit(cell: LSTMCell, x: torch.Tensor, lengths: torch.Tensor, state: State | None,
                  reverse: bool) -> tuple[torch.Tensor, State]:
        """The equations step by step; a padded step keeps the state and outputs 0."""
        b, t, _ = x.shape
        h, c = state if state is not None else cell.zero_state(b, x)
        real = (torch.arange(t, device=x.device)[None, :] < lengths.to(x.device)[:, None]).to(x.dtype)  # (B, T)
        outputs: list[torch.Tensor] = [x.new_zeros(0)] * t
        for step in (range(t - 1, -1, -1) if reverse else range(t)):
            h_new, c_new = cell(x[:, step], (h, c))
            keep = real[:, step, None]  # (B, 1): 1 = real step, 0 = padding
            h, c = keep * h_new + (1 - keep) * h, keep * c_new + (1 - keep) * c
            outputs[step] = keep * h_new
        return torch.stack(outputs, dim=1), (h, c)  # (B, T, J), ((B, J), (B, J))

    @staticmethod
    def _fused(cells: list[LSTMCell], x: torch.Tensor, lengths: torch.Tensor,
               state: State | None) -> tuple[torch.Tensor, State]:
        """One layer (one or both directions) in PyTorch's fused LSTM kernel with the cells' own weights.

        state: (h_0, c_0) each (dirs, B, J). Padded batches are packed by length, so each row's backward
        direction starts at its own last token. Returns output (B, T, dirs·J) and (h_n, c_n) each (dirs, B, J).
        """
        b, t, _ = x.shape
        dirs, j = len(cells), cells[0].hidden_size
        h, c = state if state is not None else (x.new_zeros(dirs, b, j), x.new_zeros(dirs, b, j))
        weights = [w for cell in cells  # PyTorch's layout per direction: W_ih, W_hh, b_ih, b_hh (= 0 here)
                   for w in (cell.weight_ih, cell.weight_hh, cell.bias, torch.zeros_like(cell.bias))]
        bidirectional = dirs == 2
        if bool((lengths == t).all()):
            out, h_n, c_n = torch.lstm(x, (h, c), weights, True, 1, 0.0, False, bidirectional, True)
            return out, (h_n, c_n)
        packed = pack_padded_sequence(x, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
        order, unorder = packed.sorted_indices, packed.unsorted_indices  # packing sorts rows by length
        data, h_n, c_n = torch.lstm(packed.data, packed.batch_sizes, (h[:, order], c[:, order]), weights,
                                    True, 1, 0.0, False, bidirectional)
        h_n, c_n = h_n[:, unorder], c_n[:, unorder]  # (dirs, B, J) back in the batch's order
        out, _ = pad_packed_sequence(packed._replace(data=data), batch_first=True, total_length=t)
        if bool((lengths == 0).any()):  # an empty row: no step ran, its state stays the initial one
            empty = (lengths == 0).to(x.device)
            out = out.masked_fill(empty[:, None, None], 0.0)
            h_n = torch.where(empty[None, :, None], h, h_n)
            c_n = torch.where(empty[None, :, None], c, c_n)
        return out, (h_n, c_n)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each row's first ``lengths[b]`` steps, leaving the padding where it is.

    >>> reverse_padded(torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7]])[..., None], torch.tensor([3, 4]))[..., 0].tolist()
    [[3, 2, 1, 0], [7, 6, 5, 4]]
    """
    b, t = x.shape[:2]
    steps = torch.arange(t, device=x.device)[None, :]  # (1, T)
    n = lengths.to(x.device)[:, None]  # (B, 1)
    index = torch.where(steps < n, n - 1 - steps, steps)  # (B, T)
    return x.gather(1, index.view(b, t, *([1] * (x.dim() - 2))).expand_as(x))
