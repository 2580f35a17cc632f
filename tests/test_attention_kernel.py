"""The attention kernel a training run uses on a GPU, chosen by measurement (train/attention_kernel.py)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend

from lmforge.models import Decoder, get_preset
from lmforge.train.attention_kernel import fastest_attention, measure, ranked

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent GPU machine)")


def gpt(n_kv_heads: int | None = None) -> Decoder:
    return Decoder(get_preset("gpt-tiny", vocab_size=64, n_layers=1, d_model=128, n_heads=4, n_kv_heads=n_kv_heads,
                              max_positions=256, dropout=0.0, attention_dropout=0.0))


def test_the_order_puts_the_fastest_first_and_keeps_every_kernel():
    order = ranked({"efficient": 0.5, "flash": 0.7, "cudnn": 0.6})
    assert order[:3] == [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]
    assert order[3:] == [SDPBackend.MATH]
    assert ranked({"cudnn": 1.0})[0] == SDPBackend.CUDNN_ATTENTION and len(ranked({"cudnn": 1.0})) == 4


def test_on_a_cpu_nothing_is_timed_and_torchs_order_stays():
    before = torch._C._get_sdp_priority_order()
    said: list[str] = []
    with fastest_attention(gpt(), 2, 64, torch.bfloat16, torch.device("cpu"), say=said.append) as times:
        assert times == {} and torch._C._get_sdp_priority_order() == before
    assert said == [] and measure(gpt(), 2, 64, torch.bfloat16, torch.device("cpu")) == {}


@cuda
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_on_cuda_the_measured_order_holds_inside_the_block_and_goes_after(n_kv_heads):
    model, before = gpt(n_kv_heads).cuda(), torch._C._get_sdp_priority_order()
    said: list[str] = []
    with fastest_attention(model, 4, 256, torch.bfloat16, torch.device("cuda"), say=said.append) as times:
        assert times and all(t > 0 for t in times.values())
        if len(times) > 1:
            assert torch._C._get_sdp_priority_order()[0] == int(ranked(times)[0]) and said
    assert torch._C._get_sdp_priority_order() == before
