"""``lmforge generate``: streamed text and --json output agree with the Python API."""

from __future__ import annotations

import io
import json

import pytest
import torch

from lmforge.cli import main
from lmforge.generation import generate
from lmforge.generation.text import TextStream
from lmforge.models import Decoder, get_preset
from lmforge.models.registry import save_pretrained
from lmforge.tokenizers import ByteLevelBPETokenizer


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    text = ["the quick brown fox jumps over the lazy dog, and the dog sleeps in the sun."] * 20
    tok = ByteLevelBPETokenizer.train(text, vocab_size=300)
    config = get_preset("gpt-tiny", vocab_size=tok.vocab_size, eos_id=tok.special_tokens["<|endoftext|>"])
    torch.manual_seed(0)
    model = Decoder(config).eval()
    folder = tmp_path_factory.mktemp("gpt")
    save_pretrained(model, folder, tokenizer=tok)
    return folder, model, tok


def test_streamed_text_equals_api(model_dir, capsys) -> None:
    folder, model, tok = model_dir
    args = ["generate", "--model", str(folder), "--prompt", "the dog", "--max-new-tokens", "12"]
    assert main([*args, "--temperature", "0.9", "--top-k", "50", "--seed", "3"]) == 0
    out = capsys.readouterr()
    ids = torch.tensor([tok.encode("the dog", add_special_tokens=False).ids])
    expected = generate(model, ids, max_new_tokens=12, temperature=0.9, top_k=50, seed=3).to_lists()[0]
    assert out.out == tok.decode(expected, skip_special_tokens=True) + "\n"
    assert "tokens/s" in out.err


def test_compile_flag_gives_the_same_text(model_dir, capsys) -> None:
    """--compile: each token from one compiled fixed-shape step (torch.compile runs on CPU too)."""
    folder = model_dir[0]
    args = ["generate", "--model", str(folder), "--prompt", "the dog", "--max-new-tokens", "10", "--seed", "1",
            "--temperature", "0.8"]
    assert main([*args, "--no-compile"]) == 0
    eager = capsys.readouterr().out
    assert main([*args, "--compile"]) == 0
    assert capsys.readouterr().out == eager


def test_json_lines_from_stdin(model_dir, capsys, monkeypatch) -> None:
    folder, model, tok = model_dir
    monkeypatch.setattr("sys.stdin", io.StringIO("the dog\nthe quick fox\n"))
    assert main(["generate", "--model", str(folder), "--json", "--beams", "3", "--max-new-tokens", "6"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["prompt"] for line in lines] == ["the dog", "the quick fox"]
    ids = torch.tensor([tok.encode("the quick fox", add_special_tokens=False).ids])
    best = generate(model, ids, max_new_tokens=6, beams=3)
    assert lines[1]["ids"] == best.to_lists()[0]
    assert lines[1]["text"] == tok.decode(lines[1]["ids"], skip_special_tokens=True)


def test_bad_option_is_one_line_error(model_dir, capsys) -> None:
    folder, _, _ = model_dir
    with pytest.raises(SystemExit) as stop:
        main(["generate", "--model", str(folder), "--prompt", "x", "--top-p", "2", "--temperature", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("lmforge: error:") and "--top-p" in err and len(err.strip().splitlines()) == 1


def test_top_k_alone_samples_and_a_long_prompt_keeps_its_last_window(model_dir, capsys) -> None:
    folder, _, _ = model_dir
    base = ["generate", "--model", str(folder), "--json", "--prompt", "to be or not", "--max-new-tokens", "8"]
    assert main([*base, "--top-k", "5", "--seed", "1"]) == 0
    sampled = json.loads(capsys.readouterr().out)["ids"]
    assert main(base) == 0
    greedy = json.loads(capsys.readouterr().out)["ids"]
    assert sampled != greedy  # --top-k implies sampling (temperature 1) unless a temperature is given
    assert main([*base, "--top-k", "5", "--temperature", "0"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["ids"] == greedy and "--top-k / --top-p have no effect" in out.err
    from lmforge import load

    model, tok = load(folder)
    long = " ".join(["to be or not"] * 40)
    n = len(tok.encode(long, add_special_tokens=False).ids)
    assert n + 8 > model.config.max_positions
    assert main(["generate", "--model", str(folder), "--json", "--prompt", long, "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["new_tokens"] == 8
    assert f"kept its last {model.config.max_positions - 8}" in out.err


def test_text_stream_holds_back_split_characters() -> None:
    tok = ByteLevelBPETokenizer.train(["plain ascii text"] * 5, vocab_size=270)
    ids = tok.encode("é!").ids  # é is two bytes: two tokens in a byte-level vocabulary this small
    out = io.StringIO()
    stream = TextStream(tok, out)
    stream.add(ids[0])
    assert out.getvalue() == ""  # half a character: nothing printed yet
    for i in ids[1:]:
        stream.add(i)
    stream.close()
    assert out.getvalue() == "é!\n"


def test_stop_strings_and_repetition_penalty_from_the_command_line(model_dir, capsys) -> None:
    folder, _, _ = model_dir
    base = ["generate", "--model", str(folder), "--prompt", "to be", "--max-new-tokens", "30"]
    assert main([*base, "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    stop = free["text"][5:8]
    assert len(stop) == 3
    assert main([*base, "--json", "--stop", stop]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["stopped"] and cut["text"] == free["text"][: free["text"].find(stop) + 3]
    assert main([*base, "--stop", stop]) == 0  # streamed text stops at the same place
    assert capsys.readouterr().out == cut["text"] + "\n"
    assert main([*base, "--json", "--repetition-penalty", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"] != free["ids"]
