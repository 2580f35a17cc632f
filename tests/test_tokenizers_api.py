"""The shared interface: Encoding, templates, truncation, padding, save/load, errors, CLI, doctests."""

from __future__ import annotations

import doctest
import importlib
import io
import json

import pytest

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.tokenizers import (
    KINDS,
    BPETokenizer,
    WordPieceTokenizer,
    from_huggingface,
    load_tokenizer,
    save_huggingface,
    to_huggingface,
)
from lmforge.tokenizers.template import truncate_pair_lengths

CORPUS = ["The cat sat on the mat, and the dog sat on the log.\n"] * 10 + ["Ünïcödé 中文 naïve.\n"]


@pytest.fixture(scope="module", params=sorted(KINDS))
def tok(request):
    size = {"bpe": 80, "byte-bpe": 300, "wordpiece": 80}[request.param]
    return KINDS[request.param].train(CORPUS, vocab_size=size)


def test_special_ids_are_exposed():
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=60)
    assert [wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id] == [0, 1, 2, 3, 4]
    assert wp.bos_id is None and wp.special_ids == frozenset(range(5))
    bpe = BPETokenizer.train(CORPUS, vocab_size=60)
    assert (bpe.pad_id, bpe.unk_id, bpe.bos_id, bpe.eos_id, bpe.cls_id) == (0, 1, 2, 3, None)


def test_encoding_fields_are_parallel(tok):
    enc = tok.encode_pair("The cat sat.", "The dog sat on the log.")
    n = len(enc)
    assert all(len(f) == n for f in (enc.tokens, enc.offsets, enc.word_ids, enc.type_ids,
                                      enc.special_tokens_mask, enc.attention_mask))
    assert enc.type_ids[0] == 0 and enc.type_ids[-1] == 1
    assert [tok.id_to_token[i] for i in enc.ids] == enc.tokens


def test_bert_pair_template():
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=80)
    enc = wp.encode_pair("the cat", "the dog")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc) - first_sep - 1)
    assert enc.special_tokens_mask[0] == enc.special_tokens_mask[-1] == 1
    assert wp.decode(enc.ids) == "[CLS] the cat [SEP] the dog [SEP]"
    assert wp.decode(enc.ids, skip_special_tokens=True) == "the cat the dog"


@pytest.mark.parametrize(("n1", "n2", "m", "expected"), [
    (3, 4, 10, (3, 4)), (3, 10, 8, (3, 5)), (10, 3, 8, (5, 3)), (9, 10, 7, (3, 4)), (10, 10, 5, (2, 3))])
def test_longest_first_truncation(n1, n2, m, expected):
    assert truncate_pair_lengths(n1, n2, m) == expected


def test_truncation_and_padding(tok):
    text = "the cat sat on the mat and the dog sat on the log " * 3
    assert len(tok.encode(text, max_length=7)) == 7
    assert len(tok.encode_pair(text, text, max_length=9)) == 9
    padded = tok.encode("cat", max_length=12, padding="max_length")
    assert len(padded) == 12 and padded.ids[-1] == tok.pad_id and padded.attention_mask[-1] == 0
    batch = tok.encode_batch(["cat", "the cat sat on the mat"], padding=True, pad_to_multiple_of=8)
    assert len({len(e) for e in batch}) == 1 and len(batch[0]) % 8 == 0
    assert sum(batch[0].attention_mask) == len(tok.encode("cat"))


def test_special_tokens_are_never_split(tok):
    special = next(iter(tok.special_tokens))
    enc = tok.encode(f"cat{special}cat", allowed_special="all", add_special_tokens=False)
    assert enc.tokens.count(special) == 1
    assert tok.special_tokens[special] not in tok.encode(f"cat{special}cat", add_special_tokens=False).ids


def test_save_load_round_trip(tok, tmp_path):
    tok.save(tmp_path)
    back = load_tokenizer(tmp_path)
    assert type(back) is type(tok) and back.id_to_token == tok.id_to_token
    text = "The cat, naïve, sat on 中文 the log."
    assert back.encode_pair(text, text) == tok.encode_pair(text, text)
    readable = (tmp_path / "tokenizer.vocab").read_text(encoding="utf-8").splitlines()
    assert len(readable) == tok.vocab_size and readable[0].startswith("0\t")


def test_huggingface_round_trip(tok, tmp_path):
    save_huggingface(tok, tmp_path)
    back = load_tokenizer(tmp_path / "tokenizer.json")
    assert back.special_tokens == tok.special_tokens and back.template == tok.template
    text = "The cat sat on the mat, and the dog sat."
    hf_form = from_huggingface(to_huggingface(tok))
    assert hf_form.decode(hf_form.encode(text).ids) == tok.decode(tok.encode(text).ids)


def test_minilm_file_ignores_baked_in_padding():
    from lmforge.data.sources import minilm_path

    tok = load_tokenizer(minilm_path())  # its tokenizer.json pads to 128
    assert tok.encode("Hello world").ids == [101, 7592, 2088, 102]
    assert load_tokenizer(minilm_path() / "tokenizer.json").encode("Hello world").ids == [101, 7592, 2088, 102]


@pytest.mark.parametrize(("content", "message"), [
    ("{", "corrupt JSON at line 1"),
    ("[1, 2]", "not a tokenizer"),
    ('{"format": "lmforge-tokenizer", "kind": "nope"}', "unknown field 'kind'"),
    ('{"format": "lmforge-tokenizer", "kind": "bpe", "tokens": ["a"]}', "missing field 'model'"),
    ('{"format": "lmforge-tokenizer", "kind": "bpe", "tokens": ["a"], "model": {"merges": [["a", "b"]], '
     '"end_of_word": null, "pattern": "whitespace"}}', "merge 0"),
    ('{"model": {"type": "Unigram", "vocab": {}}}', "not supported"),
    ('{"model": {"type": "WordPiece", "vocab": {"a": 0, "b": 2}}}', "not contiguous"),
])
def test_corrupt_tokenizer_files_give_one_line_errors(tmp_path, content, message):
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(LmforgeError, match=message) as err:
        load_tokenizer(tmp_path)
    assert "\n" not in str(err.value) and "tokenizer.json" in str(err.value)


def test_missing_tokenizer_and_bad_ids(tmp_path, tok):
    with pytest.raises(LmforgeError, match=r"no tokenizer\.json or vocab\.txt"):
        load_tokenizer(tmp_path)
    with pytest.raises(LmforgeError, match="no such tokenizer"):
        load_tokenizer(tmp_path / "nope")
    for bad in ([tok.vocab_size], [-1], [0, "x"]):
        with pytest.raises(LmforgeError, match="unknown token id"):
            tok.decode(bad)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bad_training_input(kind):
    with pytest.raises(LmforgeError, match="empty corpus"):
        KINDS[kind].train(["", ""], vocab_size=1000)
    with pytest.raises(LmforgeError, match="smaller than the alphabet"):
        KINDS[kind].train(CORPUS, vocab_size=10)


# ---- CLI ------------------------------------------------------------------------------------

def run_cli(capsys, *argv, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(["tokenizer", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_cli_train_encode_decode(tmp_path, capsys, monkeypatch, kind):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(CORPUS), encoding="utf-8")
    out_dir = tmp_path / "tok"
    size = "300" if kind == "byte-bpe" else "80"
    code, out, _ = run_cli(capsys, "train", "--kind", kind, "--vocab-size", size, "--workers", "1",
                             "--out", str(out_dir), str(corpus))
    assert code == 0 and json.loads(out)["kind"] == kind and (out_dir / "tokenizer.json").is_file()
    code, out, _ = run_cli(capsys, "encode", "--tokenizer", str(out_dir), stdin="the cat\nthe dog sat\n",
                           monkeypatch=monkeypatch)
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(records) == 2 and set(records[0]) == {"ids", "tokens"}
    tok = load_tokenizer(out_dir)
    assert records[1]["ids"] == tok.encode("the dog sat").ids
    code, out, _ = run_cli(capsys, "decode", "--tokenizer", str(out_dir), "--skip-special",
                           json.dumps(records[1]["ids"]))
    assert code == 0 and json.loads(out)["text"].replace(" ", "") == "thedogsat"
    # encode's output pipes straight into decode (one JSON object per line).
    code, out, _ = run_cli(capsys, "decode", "--tokenizer", str(out_dir), "--skip-special",
                           stdin="\n".join(json.dumps(r) for r in records) + "\n", monkeypatch=monkeypatch)
    assert code == 0 and [json.loads(line)["text"].replace(" ", "") for line in out.splitlines()] == [
        "thecat", "thedogsat"]


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good text\nbad \xff byte")
    code, _, err = run_cli(capsys, "train", "--kind", "bpe", "--vocab-size", "50", "--out",
                             str(tmp_path / "t"), str(bad))
    assert code == 2 and err.strip() == f"lmforge: error: {bad}:2: invalid UTF-8 at byte offset 14 " \
        "(fix the file, or replace bad bytes by U+FFFD: --errors replace, or data.errors=replace in a recipe)"
    code, _, err = run_cli(capsys, "train", "--kind", "bpe", "--vocab-size", "50", "--quiet", "--errors", "replace",
                           "--out", str(tmp_path / "t"), str(bad))
    assert code == 0 and err == ""
    code, _, err = run_cli(capsys, "decode", "--tokenizer", str(tmp_path / "t"), "[1, 99999]")
    assert code == 2 and "unknown token id 99999" in err and len(err.splitlines()) == 1
    code, _, err = run_cli(capsys, "decode", "--tokenizer", str(tmp_path / "t"), "one two")
    assert code == 2 and "expected token ids" in err
    code, _, err = run_cli(capsys, "encode", "--tokenizer", str(tmp_path / "missing"), "x")
    assert code == 2 and "no such tokenizer" in err


def test_cli_progress_bar_goes_to_stderr(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(CORPUS))
    code, out, err = run_cli(capsys, "train", "--kind", "bpe", "--vocab-size", "60", "--out", str(tmp_path / "t"),
                             str(corpus))
    assert code == 0 and "merges" in err and "merges" not in out


@pytest.mark.parametrize("module", ["base", "bpe", "byte_bpe", "wordpiece", "normalize", "pretokenize", "train",
                                    "template"])
def test_docstring_examples(module):
    mod = importlib.import_module(f"lmforge.tokenizers.{module}")
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and (module == "base" or result.attempted > 0)


def test_directory_with_only_a_bert_vocab_txt(tmp_path):
    from lmforge.data.sources import minilm_path

    (tmp_path / "vocab.txt").write_text((minilm_path() / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    assert isinstance(tok, WordPieceTokenizer) and tok.encode("Hello world").ids == [101, 7592, 2088, 102]
    (tmp_path / "vocab.txt").write_text("just\nwords\n")
    with pytest.raises(LmforgeError, match="not a BERT vocabulary"):
        load_tokenizer(tmp_path)


def test_templates_only_use_known_special_tokens():
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=60, special_tokens=["[UNK]"])
    assert wp.encode("the cat").tokens == ["the", "cat"]  # no [CLS]/[SEP]: no BERT template
    with pytest.raises(LmforgeError, match=r"template uses \['\[CLS\]'\]"):
        BPETokenizer(["a"], [], template={"single": ["[CLS]", "$A"], "pair": ["$A", "$B:1"]})
