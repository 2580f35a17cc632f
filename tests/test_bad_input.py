"""Every command, fed what careful users and careless scripts feed it: a binary file, invalid UTF-8 (in a file
and on standard input), a missing file, and each out-of-range option. Each must exit 2 with one line on
standard error that names the file or flag at fault, and never a traceback.

The table has a row for every command the parser knows (a new command fails test_every_command_is_covered
until it gets its rows)."""

from __future__ import annotations

import io
import shlex
import sys

import pytest
import torch

from lmforge.cli import main
from test_cli import LEAVES

BINARY = bytes(range(256)) * 8
BAD_UTF8 = b"label,text\ncertain,hello \xff\xfe world\n"


@pytest.fixture(scope="module")
def w(tmp_path_factory):
    """A workspace: tiny GPT, BERT, Seq2Seq and classifier directories, a tokenizer and the bad files."""
    from lmforge.models import Decoder, EncoderForPreTraining, Seq2Seq, Seq2SeqConfig, get_preset, save_pretrained
    from lmforge.tokenizers import KINDS
    from lmforge.workflows.finetune import FinetuneArgs, finetune

    root = tmp_path_factory.mktemp("bad")
    texts = ["the cat sat on the mat", "a dog barks at the moon", "it may rain today", "it rains"] * 4
    bb = KINDS["byte-bpe"].train(texts, 270, 1)
    wp = KINDS["wordpiece"].train(texts, 80, 1)
    torch.manual_seed(0)
    save_pretrained(Decoder(get_preset("gpt-tiny", vocab_size=bb.vocab_size, max_positions=64)), root / "gpt", bb)
    save_pretrained(EncoderForPreTraining(get_preset("bert-tiny", vocab_size=wp.vocab_size)), root / "bert", wp)
    s2s = Seq2SeqConfig(vocab_size=bb.vocab_size, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                        n_decoder_layers=1, max_positions=64, bos_id=bb.eos_id, eos_id=bb.eos_id, pad_id=0)
    save_pretrained(Seq2Seq(s2s), root / "s2s", bb)
    wp.save(root / "tok")
    (root / "train.csv").write_text("label,text\n" + "".join(f"{'ab'[i % 2]},{t}\n" for i, t in enumerate(texts)))
    (root / "text.txt").write_text("\n".join(texts) + "\n")
    (root / "pairs.tsv").write_text("hi\tthere\n")
    (root / "bin.dat").write_bytes(BINARY)
    (root / "bad.csv").write_bytes(BAD_UTF8)
    (root / "adir").mkdir()
    finetune(FinetuneArgs(model=str(root / "bert"), task="seq-cls", train=str(root / "train.csv"),
                          out=str(root / "cls"), max_steps=1, progress=False))
    return root


# command -> [(argv with {w} for the workspace, stdin bytes or None, what the one line must name)]
CASES: dict[str, list[tuple[str, bytes | None, str]]] = {
    "demo": [("demo --steps 0", None, "--steps"), ("demo --finetune-steps -1", None, "--finetune-steps"),
             ("demo --examples {w}/adir --out {w}/demo", None, "--examples")],
    "tokenizer train": [
        ("tokenizer train --kind bpe --vocab-size 100 --out {w}/t1 {w}/bin.dat", None, "bin.dat"),
        ("tokenizer train --kind bpe --vocab-size 100 --out {w}/t1 {w}/bad.csv", None, "bad.csv"),
        ("tokenizer train --kind bpe --vocab-size 100 --out {w}/t1 {w}/missing.txt", None, "missing.txt"),
        ("tokenizer train --kind bpe --vocab-size 0 --out {w}/t1 {w}/text.txt", None, "--vocab-size"),
        ("tokenizer train --kind bpe --vocab-size 100 --min-frequency -3 --out {w}/t1 {w}/text.txt", None,
         "--min-frequency"),
    ],
    "tokenizer encode": [
        ("tokenizer encode --tokenizer {w}/bin.dat hello", None, "bin.dat"),
        ("tokenizer encode --tokenizer {w}/missing hello", None, "missing"),
        ("tokenizer encode --tokenizer {w}/tok", b"hello \xff\xfe world\n", "<stdin> line 1"),
    ],
    "tokenizer decode": [
        ("tokenizer decode --tokenizer {w}/tok '[1, x]'", None, "IDS"),
        ("tokenizer decode --tokenizer {w}/tok", b"[1, 2]\n\xff\n", "<stdin> line 2"),
    ],
    "data prepare": [
        ("data prepare --tokenizer {w}/tok --out {w}/d1 {w}/bin.dat", None, "bin.dat"),
        ("data prepare --tokenizer {w}/tok --out {w}/d1 {w}/missing.txt", None, "missing.txt"),
        ("data prepare --tokenizer {w}/tok --out {w}/d1 --val-fraction 1.5 {w}/text.txt", None, "--val-fraction"),
        ("data prepare --tokenizer {w}/tok --out {w}/d1 --val-fraction -0.5 {w}/text.txt", None, "--val-fraction"),
    ],
    "pretrain": [
        ("pretrain --config {w}/bin.dat", None, "bin.dat"),
        ("pretrain --config {w}/bad.csv", None, "bad.csv"),
        ("pretrain --config {w}/missing.yaml", None, "missing.yaml"),
    ],
    "convert": [
        ("convert --from-hf {w}/missing --out {w}/c1", None, "missing"),
        ("convert --to-hf {w}/bin.dat --out {w}/c1", None, "bin.dat"),
    ],
    "generate": [
        ("generate --model {w}/gpt --prompt hi --beams 0", None, "--beams"),
        ("generate --model {w}/gpt --prompt hi --temperature nan", None, "--temperature"),
        ("generate --model {w}/gpt --prompt hi --top-k 0", None, "--top-k"),
        ("generate --model {w}/gpt --prompt hi --top-p 1.5", None, "--top-p"),
        ("generate --model {w}/gpt --prompt hi --max-new-tokens -1", None, "--max-new-tokens"),
        ("generate --model {w}/gpt --json --batch-size 0", b"hi\n", "--batch-size"),
        ("generate --model {w}/gpt --device cuda --prompt hi", None, "--device"),
        ("generate --model {w}/missing --prompt hi", None, "missing"),
        ("generate --model {w}/bert --prompt hi", None, "--model"),
        ("generate --model {w}/gpt", b"hi \xff\n", "<stdin> line 1"),
    ],
    "chat": [
        ("chat --model {w}/gpt", b'{"messages": [{"role": "user", "content": "hi"}]}\n', "chat template"),
        ("chat --model {w}/missing", None, "missing"),
        ("chat --model {w}/gpt --temperature -1", None, "--temperature"),
    ],
    "serve": [
        ("serve --model {w}/missing", None, "missing"),
        ("serve --model {w}/gpt --port 0", None, "--port"),
        ("serve --model {w}/gpt --slots 0", None, "--slots"),
    ],
    "translate": [
        ("translate --model {w}/gpt hello", None, "--model"),
        ("translate --model {w}/s2s --eval {w}/missing.tsv", None, "missing.tsv"),
        ("translate --model {w}/s2s --eval {w}/bin.dat", None, "bin.dat"),
        ("translate --model {w}/s2s --eval {w}/pairs.tsv --limit 0", None, "--limit"),
        ("translate --model {w}/s2s --eval {w}/pairs.tsv --out {w}/adir", None, "--out"),
        ("translate --model {w}/s2s --batch-size 0 hello", None, "--batch-size"),
        ("translate --model {w}/s2s --align {w}/a.txt hello", None, "--align"),
        ("translate --model {w}/s2s", b"\xfe\n", "<stdin> line 1"),
    ],
    "finetune": [
        ("finetune --model {w}/bert --task seq-cls --train {w}/bin.dat --out {w}/f1", None, "bin.dat"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/bad.csv --out {w}/f1", None, "bad.csv"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/missing.csv --out {w}/f1", None, "missing.csv"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --eval {w}/bin.dat --out {w}/f1", None,
         "bin.dat"),
        ("finetune --model {w}/bert --task token-cls --train {w}/train.csv --out {w}/f1", None, "train.csv"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --out {w}/f1 --epochs 0", None, "--epochs"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --out {w}/f1 --strategy lora --lora-r 0",
         None, "--lora-r"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --out {w}/f1 --lr -1", None, "--lr"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --out {w}/f1 --limit -1", None, "--limit"),
        ("finetune --model {w}/bert --task seq-cls --train {w}/train.csv --out {w}/f1 --batch-size 0", None,
         "--batch-size"),
        ("finetune --model {w}/missing --task seq-cls --train {w}/train.csv --out {w}/f1", None, "missing"),
    ],
    "evaluate": [
        ("evaluate --model {w}/cls --data {w}/missing.csv", None, "missing.csv"),
        ("evaluate --model {w}/cls --data {w}/bin.dat", None, "bin.dat"),
        ("evaluate --model {w}/cls --data {w}/train.csv --batch-size 0", None, "--batch-size"),
        ("evaluate --model {w}/gpt --tasks {w}/bin.dat", None, "bin.dat"),
        ("evaluate --model {w}/gpt --tasks {w}/text.txt", None, "text.txt:1: not JSON"),
        ("evaluate --model {w}/gpt --tasks {w}/missing.jsonl", None, "missing.jsonl"),
    ],
    "predict": [
        ("predict --model {w}/cls", b"hello \xff\xfe world\n", "<stdin> line 1"),
        ("predict --model {w}/bert hello", None, "bert"),
    ],
    "attention": [
        ("attention --model {w}/gpt --text hi --out {w}/a.png --head -1", None, "--head"),
        ("attention --model {w}/gpt --text hi --out {w}/a.png --layer 99", None, "--layer"),
        ("attention --model {w}/gpt --text hi --out {w}/a.txt", None, "--out"),
        ("attention --model {w}/gpt --out {w}/a.png", b"\xff\n", "<stdin> line 1"),
    ],
    "embed": [
        ("embed --model {w}/bert -k 0 --similar cat", None, "-k"),
        ("embed --model {w}/bert --layer 99 hello", None, "--layer"),
        ("embed --model {w}/bert --out {w}/x.txt hello", None, "--out"),
        ("embed --model {w}/bert", b"\xff\n", "<stdin> line 1"),
    ],
}


def test_every_command_is_covered():
    assert sorted(CASES) == sorted(LEAVES)


@pytest.mark.parametrize("argv, stdin, names", [pytest.param(*case, id=f"{cmd}: {case[0][len(cmd) + 1:][:60]}")
                                                 for cmd, cases in CASES.items() for case in cases])
def test_bad_input_is_one_line_naming_the_culprit(w, capsys, monkeypatch, argv, stdin, names):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    with pytest.raises(SystemExit) as stop:  # argparse's usage errors exit; everything else returns 2
        raise SystemExit(main(shlex.split(argv.format(w=w))))
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmforge: error: "), err
    assert names in lines[0], lines[0]
