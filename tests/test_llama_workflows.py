"""Everything lmforge does with a decoder works on a Llama-family model, because it is the one Decoder: generate
(greedy, sampling, beams, stop strings), evaluate (perplexity), attention (the explorer on a chat prompt), embed,
continued pretraining (model.init_from), chat; and bad input is one line."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.cli import main
from lmforge.models import Decoder, save_pretrained
from lmforge.models.config import DecoderConfig
from lmforge.tokenizers import ByteLevelBPETokenizer

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = ("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
        "arrows of outrageous fortune, or to take arms against a sea of troubles and by opposing end them.\n")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, single_thread):
    tok = ByteLevelBPETokenizer.train([TEXT] * 4, 320, 1, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                         "<|im_end|>"])
    tok.set_role("eos", "<|im_end|>")
    tok.chat_template = CHATML
    tok.specials_in_text = True  # as a chat model converted from Hugging Face or GGUF: <|im_start|> written is one id
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                           max_positions=96, dropout=0.0, attention_dropout=0.0, activation="swiglu",
                           norm="rmsnorm", positions="rotary", bias=False, rope_base=100000.0, eos_id=tok.eos_id)
    folder = tmp_path_factory.mktemp("llama") / "model"
    save_pretrained(Decoder(config), folder, tok)
    (folder.parent / "text.txt").write_text(TEXT * 6)
    return folder


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_every_strategy(llama_dir, capsys):
    for extra in (["--max-new-tokens", "6"], ["--beams", "3", "--max-new-tokens", "6"],
                  ["--temperature", "0.8", "--top-p", "0.9", "--seed", "1", "--max-new-tokens", "6"],
                  ["--stop", "the", "--max-new-tokens", "30"]):
        code, out, err = run(["generate", "--model", str(llama_dir), "--prompt", "To be", "--json", *extra], capsys)
        assert code == 0, err
        row = json.loads(out)
        assert 1 <= row["new_tokens"] <= 30
        if "--stop" in extra and row["stopped"]:
            assert row["text"].endswith("the")


def test_evaluate_gives_the_models_own_loss_as_perplexity(llama_dir, capsys):
    import lmforge

    code, out, err = run(["evaluate", "--model", str(llama_dir), "--data", str(llama_dir.parent / "text.txt"),
                          "--stride", "90"], capsys)
    assert code == 0, err
    report = json.loads(out)
    model, tok = lmforge.load(llama_dir)
    ids = torch.tensor([tok.encode((TEXT * 6), add_special_tokens=False).ids[:91]])
    with torch.no_grad():
        first_window = model(ids[:, :91], labels=ids[:, :91]).loss.item()
    assert report["perplexity"] > 1 and report["bits_per_byte"] > 0
    assert abs(report["perplexity"] - torch.tensor(first_window).exp().item()) / report["perplexity"] < 0.25


def test_attention_explorer_on_a_chat_prompt(llama_dir, tmp_path, capsys):
    prompt = "<|im_start|>user\nTo be?<|im_end|>\n<|im_start|>assistant\n"
    code, out, err = run(["attention", "--model", str(llama_dir), "--text", prompt, "--out",
                          str(tmp_path / "a.html")], capsys)
    assert code == 0, err
    shapes = json.loads(out)["shapes"]
    assert next(iter(shapes.values()))[:2] == [2, 4]  # 2 layers x 4 query heads (2 key/value heads shared)
    assert "<|im_start|>" in json.loads(out)["tokens"]


def test_embed_and_continued_pretraining(llama_dir, tmp_path, capsys):
    code, out, err = run(["embed", "--model", str(llama_dir), "--pooling", "last", "To be", "or not"], capsys)
    assert code == 0, err
    assert [len(json.loads(line)["embedding"]) for line in out.splitlines()] == [64, 64]
    code, out, err = run(["pretrain", f"model.init_from={llama_dir}", f"data.files=[{llama_dir.parent / 'text.txt'}]",
                          "data.seq_len=32", "data.val_fraction=0", "--max-steps", "3", "--batch-size", "2",
                          "--save-every", "0", "--no-progress", "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert json.loads(out)["step"] == 3
    import lmforge

    tuned, _ = lmforge.load(tmp_path / "run" / "model")
    assert tuned.config.n_kv_heads == 2 and tuned.config.positions == "rotary"


def test_chat_and_its_bad_input(llama_dir, capsys, monkeypatch):
    import io

    lines = [json.dumps({"messages": [{"role": "user", "content": "To be?"}]}),
             json.dumps({"messages": [{"role": "user", "content": "x " * 200}]})]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("\n".join(lines).encode())))
    code, out, err = run(["chat", "--model", str(llama_dir), "--max-new-tokens", "8"], capsys)
    assert code == 2 and len(out.splitlines()) == 1  # the first answered, the second refused
    assert err.count("\n") == 1 and "the context 96" in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"messages": [{"role": "bot", "content": "x"}]}')))
    code, _, err = run(["chat", "--model", str(llama_dir)], capsys)
    assert code == 2 and "role: 'bot' is not one of" in err
