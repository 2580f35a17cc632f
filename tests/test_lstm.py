"""nn/lstm.py against its oracles: the NumPy cell, its own explicit path, and torch.nn.LSTM; padding semantics."""

from __future__ import annotations

import pytest
import torch

from lmforge.nn.lstm import LSTM, LSTMCell, reverse_padded
from lmforge.reference import lstm_cell

pytestmark = pytest.mark.usefixtures("single_thread")


def padded_batch(lengths: list[int], size: int, dtype=torch.double, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t = max(lengths)
    x = torch.randn(len(lengths), t, size, generator=g, dtype=dtype)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T) right-padded
    return x * mask[..., None], mask


def initial_state(lstm: LSTM, batch: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    shape = (lstm.num_layers * lstm.dirs, batch, lstm.hidden_size)
    return (torch.randn(*shape, generator=g, dtype=torch.double), torch.randn(*shape, generator=g, dtype=torch.double))


def test_cell_equals_the_numpy_reference():
    torch.manual_seed(0)
    cell = LSTMCell(5, 3).double()
    x, h, c = torch.randn(4, 5, dtype=torch.double), torch.randn(4, 3, dtype=torch.double), torch.randn(4, 3,
                                                                                                       dtype=torch.double)
    h_t, c_t = cell(x, (h, c))
    h_ref, c_ref, _ = lstm_cell(x.numpy(), h.numpy(), c.numpy(), cell.weight.detach().numpy(),
                                cell.bias.detach().numpy())
    torch.testing.assert_close(h_t, torch.from_numpy(h_ref), atol=1e-12, rtol=0)
    torch.testing.assert_close(c_t, torch.from_numpy(c_ref), atol=1e-12, rtol=0)
    assert cell.weight.shape == (12, 8) and torch.equal(cell.weight[:, :3], cell.weight_hh)  # [W_hh | W_ih]
    assert torch.all(cell.bias[3:6] == 1.0)  # the forget gate's bias starts at 1


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_fused_equals_explicit_on_a_padded_batch(bidirectional, with_state):
    torch.manual_seed(1)
    lstm = LSTM(4, 3, num_layers=2, bidirectional=bidirectional).double()
    x, mask = padded_batch([6, 3, 1, 5], 4)
    state = initial_state(lstm, 4) if with_state else None
    fused, explicit = lstm(x, mask, state), lstm(x, mask, state, explicit=True)
    for a, b in zip([fused.output, *fused.layers, fused.h_n, fused.c_n],
                    [explicit.output, *explicit.layers, explicit.h_n, explicit.c_n], strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    assert torch.all(fused.output[1, 3:] == 0) and torch.all(fused.output[2, 1:] == 0)  # padding outputs 0


def test_gradients_are_equal_between_the_paths():
    torch.manual_seed(2)
    lstm = LSTM(4, 3, num_layers=2, bidirectional=True).double()
    x, mask = padded_batch([5, 2, 4], 4)
    x.requires_grad_(True)
    state = tuple(s.requires_grad_(True) for s in initial_state(lstm, 3))
    inputs = [x, *state, *lstm.parameters()]
    grads = []
    for explicit in (False, True):
        out = lstm(x, mask, state, explicit=explicit)
        loss = out.output.square().sum() + out.h_n.sum() + out.c_n.square().sum()
        grads.append(torch.autograd.grad(loss, inputs))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_equals_torch_nn_lstm_with_copied_weights(bidirectional):
    torch.manual_seed(3)
    lstm = LSTM(4, 3, num_layers=2, bidirectional=bidirectional).double()
    ref = torch.nn.LSTM(4, 3, num_layers=2, bidirectional=bidirectional, batch_first=True).double()
    with torch.no_grad():
        for layer in range(2):
            for d in range(lstm.dirs):
                cell, suffix = lstm.cells[layer * lstm.dirs + d], f"_l{layer}" + ("_reverse" if d else "")
                getattr(ref, "weight_ih" + suffix).copy_(cell.weight_ih)
                getattr(ref, "weight_hh" + suffix).copy_(cell.weight_hh)
                getattr(ref, "bias_ih" + suffix).copy_(cell.bias)
                getattr(ref, "bias_hh" + suffix).zero_()
    x = torch.randn(2, 5, 4, dtype=torch.double)
    state = initial_state(lstm, 2)
    out = lstm(x, state=state)
    ref_out, (h_n, c_n) = ref(x, state)
    torch.testing.assert_close(out.output, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.h_n, h_n, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.c_n, c_n, atol=1e-12, rtol=0)
    # padded: the same as torch's packed sequence
    lengths = [5, 2]
    x, mask = padded_batch(lengths, 4)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lengths), batch_first=True)
    ref_out, (h_n, _) = ref(packed)
    ref_out, _ = torch.nn.utils.rnn.pad_packed_sequence(ref_out, batch_first=True)
    out = lstm(x, mask)
    torch.testing.assert_close(out.output, ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.h_n, h_n, atol=1e-12, rtol=0)


@pytest.mark.parametrize("explicit", [False, True])
def test_a_padded_row_equals_the_same_row_alone(explicit):
    torch.manual_seed(4)
    lstm = LSTM(4, 3, num_layers=2, bidirectional=True).double()
    lengths = [6, 2, 4]
    x, mask = padded_batch(lengths, 4)
    x = x + (1 - mask[..., None]) * 7.0  # garbage in the padding must not matter
    out = lstm(x, mask, explicit=explicit)
    for i, n in enumerate(lengths):
        alone = lstm(x[i: i + 1, :n], explicit=explicit)
        torch.testing.assert_close(out.output[i, :n], alone.output[0], atol=1e-12, rtol=0)
        torch.testing.assert_close(out.h_n[:, i], alone.h_n[:, 0], atol=1e-12, rtol=0)
        torch.testing.assert_close(out.c_n[:, i], alone.c_n[:, 0], atol=1e-12, rtol=0)
        assert torch.all(out.output[i, n:] == 0)


def test_an_empty_row_keeps_its_initial_state():
    torch.manual_seed(6)
    lstm = LSTM(2, 3, bidirectional=True).double()
    x, mask = padded_batch([3, 0], 2)
    state = initial_state(lstm, 2)
    for explicit in (False, True):
        out = lstm(x, mask, state, explicit=explicit)
        assert torch.equal(out.h_n[:, 1], state[0][:, 1]) and torch.equal(out.c_n[:, 1], state[1][:, 1])
        assert torch.all(out.output[1] == 0)


def test_reverse_padded_reverses_only_the_real_steps():
    x = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 7], [8, 0, 0, 0]])
    r = reverse_padded(x[..., None], torch.tensor([3, 4, 1]))[..., 0]
    assert r.tolist() == [[3, 2, 1, 0], [7, 6, 5, 4], [8, 0, 0, 0]]
    assert torch.equal(reverse_padded(r[..., None], torch.tensor([3, 4, 1]))[..., 0], x)  # its own inverse
