"""A live ``lmforge serve`` for the tests: a tiny chat model written in a folder, a server on a free port of
127.0.0.1 (in a thread, or as a subprocess for the signal tests), stopped at the end."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import torch

from lmforge.models import Decoder, save_pretrained
from lmforge.models.config import DecoderConfig
from lmforge.tokenizers import ByteLevelBPETokenizer

CHATML = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
          "{{ '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}{% endif %}"
          "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = ("the cat sat on the mat and the dog slept under the tree; what is the capital of france? paris is. "
        "hello there, how are you today? fine thanks, and you? ") * 4


def chat_model(folder: Path, max_positions: int = 256, template: str = CHATML) -> Path:
    """A small Llama-shaped decoder with a ChatML template (or ``template``), weights sharp enough that greedy
    never ties."""
    tok = ByteLevelBPETokenizer.train([TEXT], 360, 1, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.set_role("eos", "<|im_end|>")
    tok.chat_template = template
    tok.specials_in_text = True
    g = torch.Generator().manual_seed(0)
    config = DecoderConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                           max_positions=max_positions, dropout=0.0, attention_dropout=0.0, activation="swiglu",
                           norm="rmsnorm", positions="rotary", bias=False, eos_id=tok.eos_id)
    model = Decoder(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        eos = model.tok_emb.weight[tok.eos_id]
        eos.mul_(0.2)  # end-of-turn unlikely early: replies run some tokens
    save_pretrained(model, folder, tok)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def live_server(model: Path | str, **options):
    """(base URL, service) of a server in a thread; shut down (and its engine thread stopped) at the end."""
    import uvicorn

    from lmforge.serve.app import create_app
    from lmforge.workflows.options import ServeOptions
    from lmforge.workflows.serving import ModelService

    port = free_port()
    settings = ServeOptions(port=port, **options)
    service = ModelService.open(model, settings)
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", service
    finally:
        server.should_exit = True
        thread.join(30)
        service.close()
