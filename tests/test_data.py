"""Corpus shards and the pretraining objectives: masking statistics, NSP negatives, label alignment, determinism."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from lmforge.data.collate import (
    CausalLMSource,
    MaskedLMSource,
    Seq2SeqSource,
    SpecialIds,
    mask_tokens,
    truncate_longest_first,
)
from lmforge.data.corpus import TokenShard, iter_documents, prepare_corpus
from lmforge.errors import LmforgeError
from lmforge.nn.loss import IGNORE_INDEX

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass
class _Encoding:
    ids: list[int]


class WhitespaceTokenizer:
    """A stand-in tokenizer: one id per whitespace-separated word, grown on first sight (tests only)."""

    def __init__(self, words: list[str]) -> None:
        self.vocab = {w: i for i, w in enumerate(SPECIALS + sorted(set(words)))}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = range(5)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def to_dict(self) -> dict:
        return {"vocab": self.vocab}

    def convert_ids_to_tokens(self, ids) -> list[str]:
        inverse = {i: w for w, i in self.vocab.items()}
        return [inverse[i] for i in ids]

    def encode(self, text: str, add_special_tokens: bool = True) -> _Encoding:
        return _Encoding([self.vocab.get(w, self.unk_id) for w in text.split()])


def write_docs(tmp_path, n_docs=6, n_lines=12, words_per_line=5):
    """Document d uses only words 'd<d>w<k>', so every token reveals its document."""
    paths, words = [], []
    for d in range(n_docs):
        lines = [" ".join(f"d{d}w{(i * words_per_line + k) % 17}" for k in range(words_per_line))
                 for i in range(n_lines)]
        words += [w for line in lines for w in line.split()]
        path = tmp_path / f"doc{d}.txt"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths, WhitespaceTokenizer(words)


@pytest.fixture
def corpus(tmp_path):
    paths, tok = write_docs(tmp_path)
    manifest = prepare_corpus(paths, tok, tmp_path / "corpus", val_fraction=0.34, workers=1, progress=False)
    return tmp_path / "corpus", tok, manifest


def doc_of(tok: WhitespaceTokenizer, token_id: int) -> int:
    word = {i: w for w, i in tok.vocab.items()}[token_id]
    return int(word[1: word.index("w")])


# -- corpus ------------------------------------------------------------------------------------------------
def test_prepare_writes_shards_with_boundaries(corpus):
    root, tok, manifest = corpus
    train, valid = TokenShard.open(root, "train", tok), TokenShard.open(root, "valid", tok)
    assert manifest["splits"]["valid"]["documents"] == 2 and train.n_docs == 4
    assert train.n_tokens + valid.n_tokens == 6 * 12 * 5
    assert train.tokens.dtype == np.uint16
    for d in range(train.n_docs):  # each document holds tokens of one source document only
        assert len({doc_of(tok, int(t)) for t in train.doc_tokens(d)}) == 1
    assert train.line_tokens(0).size == 5


def test_multiprocess_tokenizing_gives_the_same_shards(tmp_path):
    paths, tok = write_docs(tmp_path, n_docs=3, n_lines=3000, words_per_line=2)
    one = prepare_corpus(paths, tok, tmp_path / "a", workers=1, progress=False)
    two = prepare_corpus(paths, tok, tmp_path / "b", workers=2, progress=False)
    assert one["splits"] == two["splits"]
    assert (tmp_path / "a/train.tokens").read_bytes() == (tmp_path / "b/train.tokens").read_bytes()


def test_jsonl_csv_and_blank_line_documents(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"text": "one\\ntwo"}\n{"text": "three"}\n')
    (tmp_path / "b.csv").write_text('label,text\nx,"four five"\ny,six\n')
    (tmp_path / "c.txt").write_text("p1 l1\np1 l2\n\np2 l1\n")
    assert list(iter_documents(tmp_path / "a.jsonl")) == [["one", "two"], ["three"]]
    assert list(iter_documents(tmp_path / "b.csv")) == [["four five"], ["six"]]
    assert list(iter_documents(tmp_path / "c.txt", "blank-line")) == [["p1 l1", "p1 l2"], ["p2 l1"]]


def test_bad_input_gives_one_line_errors(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"good text\n\xff\xfe bad")
    with pytest.raises(LmforgeError, match=r"bad.txt:2: invalid UTF-8 at byte offset 10"):
        list(iter_documents(tmp_path / "bad.txt"))
    assert next(iter(iter_documents(tmp_path / "bad.txt", errors="replace")))[1].endswith("bad")
    (tmp_path / "a.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(LmforgeError, match=r"a.jsonl:2: missing string field 'text'"):
        list(iter_documents(tmp_path / "a.jsonl"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(LmforgeError, match="empty corpus"):
        prepare_corpus([tmp_path / "empty.txt"], WhitespaceTokenizer([]), tmp_path / "out", progress=False)
    with pytest.raises(LmforgeError, match="not a prepared corpus"):
        TokenShard.open(tmp_path)


def test_corpus_refuses_another_tokenizer(corpus):
    root, _, _ = corpus
    with pytest.raises(LmforgeError, match="another tokenizer"):
        TokenShard.open(root, "train", WhitespaceTokenizer(["other"]))


# -- masked LM ----------------------------------------------------------------------------------------------
def test_masking_statistics_80_10_10():
    rng = np.random.default_rng(0)
    n = 200_000
    ids = rng.integers(5, 1000, size=n)
    maskable = np.ones(n, dtype=bool)
    maskable[::10] = False  # "special" positions
    corrupted, labels = mask_tokens(ids, maskable, rng, mask_id=4, vocab_size=1000)
    chosen = labels != IGNORE_INDEX
    assert not chosen[~maskable].any()  # specials never chosen
    assert chosen[maskable].mean() == pytest.approx(0.15, abs=0.004)
    np.testing.assert_array_equal(labels[chosen], ids[chosen])  # labels are the originals
    assert (corrupted[~chosen] == ids[~chosen]).all()  # unchosen untouched
    to_mask = (corrupted[chosen] == 4).mean()
    kept = (corrupted[chosen] == ids[chosen]).mean()
    assert to_mask == pytest.approx(0.8, abs=0.01)
    assert kept == pytest.approx(0.1 + 0.1 / 1000, abs=0.01)  # 10% kept (+ random tokens that hit the original)
    assert 1 - to_mask - kept == pytest.approx(0.1, abs=0.01)


def test_whole_word_masking_takes_words_together():
    rng = np.random.default_rng(1)
    starts = np.tile([True, False, False], 10_000)  # words of three sub-tokens
    ids = np.arange(starts.size) % 900 + 5
    _, labels = mask_tokens(ids, np.ones(starts.size, bool), rng, 4, 1000, word_starts=starts)
    per_word = (labels != IGNORE_INDEX).reshape(-1, 3)
    assert (per_word.all(1) | ~per_word.any(1)).all()  # all or nothing within a word
    assert per_word[:, 0].mean() == pytest.approx(0.15, abs=0.01)


def test_mlm_nsp_batches(corpus):
    root, tok, _ = corpus
    shard = TokenShard.open(root, "train", tok)
    source = MaskedLMSource(shard, SpecialIds.from_tokenizer(tok), batch_size=64, seq_len=24, seed=3)
    batch = source.batch(step=0)
    ids, types, labels = batch["input_ids"], batch["token_type_ids"], batch["labels"]
    assert ids.shape == types.shape == labels.shape == (64, 24)
    assert (ids[:, 0] == tok.cls_id).all()
    n_random = 0
    for i in range(64):
        n = int(batch["attention_mask"][i].sum())
        assert (ids[i, n:] == tok.pad_id).all() and (labels[i, n:] == IGNORE_INDEX).all()
        seps = (ids[i, :n] == tok.sep_id).nonzero().flatten().tolist()
        assert seps[-1] == n - 1 and len(seps) >= 2
        a_end = seps[0]
        assert (types[i, : a_end + 1] == 0).all() and (types[i, a_end + 1: n] == 1).all()
        # originals: labels where masked, else the input itself; documents of A and B
        original = torch.where(labels[i] != IGNORE_INDEX, labels[i], ids[i])
        docs_a = {doc_of(tok, int(t)) for t in original[1:a_end]}
        docs_b = {doc_of(tok, int(t)) for t in original[a_end + 1: n - 1]}
        assert len(docs_a) == 1 and len(docs_b) == 1
        is_random = int(batch["next_sentence_label"][i])
        assert (docs_a != docs_b) == bool(is_random)  # negatives come from another document
        n_random += is_random
    assert 16 <= n_random <= 48


def test_nsp_ratio_and_determinism(corpus):
    root, tok, _ = corpus
    source = MaskedLMSource(TokenShard.open(root, "train", tok), SpecialIds.from_tokenizer(tok), 128, 24, seed=0)
    labels = torch.cat([source.batch(step)["next_sentence_label"] for step in range(8)])
    assert labels.float().mean().item() == pytest.approx(0.5, abs=0.07)
    a, b = source.batch(5, micro=1), source.batch(5, micro=1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(source.batch(5)["input_ids"], source.batch(6)["input_ids"])


def test_ranks_split_the_global_batch(corpus):
    root, tok, _ = corpus
    shard = TokenShard.open(root, "train", tok)
    whole = CausalLMSource(shard, batch_size=8, seq_len=10, seed=1).batch(3, micro=2)
    half = CausalLMSource(shard, batch_size=4, seq_len=10, seed=1)
    parts = [half.batch(3, micro=2, rank=r, world_size=2) for r in range(2)]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), whole["input_ids"])


def test_causal_lm_windows_are_contiguous(corpus):
    root, tok, _ = corpus
    shard = TokenShard.open(root, "train", tok)
    batch = CausalLMSource(shard, batch_size=4, seq_len=10).batch(0)
    stream = np.asarray(shard.tokens, dtype=np.int64)
    for row in batch["input_ids"].numpy():
        starts = [s for s in range(stream.size - 9) if (stream[s: s + 10] == row).all()]
        assert starts
    assert torch.equal(batch["labels"], batch["input_ids"])
    valid = TokenShard.open(root, "valid", tok)
    evals = list(CausalLMSource(shard, 4, 10, n_eval_batches=3, eval_batch_size=6, eval_shard=valid).eval_batches())
    assert len(evals) == 3 and all(e["input_ids"].shape == (6, 10) for e in evals)
    # the validation set does not depend on the training batch size (DDP ranks evaluate the same set)
    other = list(CausalLMSource(shard, 8, 10, n_eval_batches=3, eval_batch_size=6, eval_shard=valid).eval_batches())
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(evals, other, strict=True))


def test_truncate_longest_first():
    a, b = truncate_longest_first(np.arange(10), np.arange(3), 8)
    assert (a.size, b.size) == (5, 3)
    a, b = truncate_longest_first(np.arange(4), np.arange(9), 6)
    assert (a.size, b.size) == (3, 3)


def test_seq2seq_teacher_forcing_alignment(tmp_path):
    src_lines = ["a b c", "d e", "f"]
    tgt_lines = ["x y", "z", "u v w"]
    tok = WhitespaceTokenizer([*" ".join(src_lines + tgt_lines).split(), "<s>", "</s>"])
    (tmp_path / "src.txt").write_text("\n".join(src_lines))
    (tmp_path / "tgt.txt").write_text("\n".join(tgt_lines))
    prepare_corpus([tmp_path / "src.txt"], tok, tmp_path / "s", val_fraction=0.0, progress=False, workers=1)
    prepare_corpus([tmp_path / "tgt.txt"], tok, tmp_path / "t", val_fraction=0.0, progress=False, workers=1)
    bos, eos = tok.vocab["<s>"], tok.vocab["</s>"]
    source = Seq2SeqSource(TokenShard.open(tmp_path / "s"), TokenShard.open(tmp_path / "t"), batch_size=16,
                           max_len=6, bos_id=bos, eos_id=eos, pad_id=tok.pad_id)
    batch = source.batch(0)
    inverse = {i: w for w, i in tok.vocab.items()}
    for i in range(16):
        src = [inverse[int(t)] for t in batch["src_ids"][i][batch["src_mask"][i].bool()]]
        k = src_lines.index(" ".join(src))
        y = [tok.vocab[w] for w in tgt_lines[k].split()]
        n = len(y) + 1
        assert batch["tgt_ids"][i, :n].tolist() == [bos, *y]
        assert batch["labels"][i, :n].tolist() == [*y, eos]
        assert (batch["labels"][i, n:] == IGNORE_INDEX).all()


def test_nsp_on_a_one_document_split_borrows_negatives_from_training(corpus, tmp_path):
    root, tok, _ = corpus
    train = TokenShard.open(root, "train", tok)
    (tmp_path / "one").mkdir()
    paths, _ = write_docs(tmp_path / "one", n_docs=1)
    prepare_corpus(paths, tok, tmp_path / "single", val_fraction=0.0, workers=1, progress=False)
    single = TokenShard.open(tmp_path / "single", "train", tok)
    assert single.n_docs == 1
    source = MaskedLMSource(train, SpecialIds.from_tokenizer(tok), 32, 24, eval_shard=single, n_eval_batches=2)
    for batch in source.eval_batches():
        assert batch["next_sentence_label"].sum() > 0


def test_line_breaks_and_document_ends_are_kept_for_byte_level_bpe(tmp_path):
    from lmforge.tokenizers import ByteLevelBPETokenizer

    (tmp_path / "a.txt").write_text("To be, or not to be\nthat is the question\n")
    (tmp_path / "b.txt").write_text("Now is the winter\n")
    tok = ByteLevelBPETokenizer.train(["To be or not\nthat is"], vocab_size=300)
    assert tok.eos_id is not None
    prepare_corpus([tmp_path / "a.txt", tmp_path / "b.txt"], tok, tmp_path / "c", val_fraction=0.0, workers=1,
                   progress=False)
    shard = TokenShard.open(tmp_path / "c", "train", tok)
    texts = [tok.decode(shard.doc_tokens(d).tolist()) for d in range(shard.n_docs)]
    eos = tok.convert_ids_to_tokens([tok.eos_id])[0]
    assert texts == [f"To be, or not to be\nthat is the question\n{eos}", f"Now is the winter\n{eos}"]


def test_sentence_corpora_drop_line_breaks_and_end_tokens(tmp_path):
    from lmforge.tokenizers import ByteLevelBPETokenizer

    (tmp_path / "lines.txt").write_text("In the beginning\nGod said\n")
    tok = ByteLevelBPETokenizer.train(["In the beginning\nGod said"], vocab_size=300)
    prepare_corpus([tmp_path / "lines.txt"], tok, tmp_path / "c", val_fraction=0.0, workers=1, progress=False,
                   line_breaks=False)
    shard = TokenShard.open(tmp_path / "c", "train", tok)
    assert [tok.decode(shard.line_tokens(i).tolist()) for i in range(2)] == ["In the beginning", "God said"]


def test_parquet_arrow_and_saved_datasets_through_hf_datasets(tmp_path):
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets is in the dev extra")
    ds = datasets.Dataset.from_dict({"text": ["one\ntwo", "three", None], "label": [0, 1, 2]})
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    want = [["one", "two"], ["three"], []]
    for path in (tmp_path / "a.parquet", tmp_path / "saved", tmp_path / "dict", arrow):
        assert list(iter_documents(path)) == want, path
    with pytest.raises(LmforgeError, match=r"a.parquet: no column 'body' \(columns: text, label\)"):
        list(iter_documents(tmp_path / "a.parquet", field="body"))
    with pytest.raises(LmforgeError, match=r"row 0: column 'label' holds int, not text"):
        list(iter_documents(tmp_path / "a.parquet", field="label"))
    manifest = prepare_corpus([tmp_path / "a.parquet"], WhitespaceTokenizer([]), tmp_path / "out", val_fraction=0.0,
                              workers=1, progress=False)
    assert manifest["splits"]["train"]["documents"] == 2


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_single_document_holds_out_its_last_lines(tmp_path, seed):
    lines = [f"line {i}" for i in range(200)]
    (tmp_path / "one.txt").write_text("\n".join(lines) + "\n")
    tok = WhitespaceTokenizer([])
    prepare_corpus([tmp_path / "one.txt"], tok, tmp_path / "c", val_fraction=0.02, workers=1, progress=False,
                   seed=seed)
    train, valid = TokenShard.open(tmp_path / "c", "train"), TokenShard.open(tmp_path / "c", "valid")
    assert (len(train.lines) - 1, len(valid.lines) - 1) == (196, 4)  # whatever the seed: the tail, 2%
    assert valid.line_tokens(3).tolist() == tok.encode("line 199").ids


def test_validation_share_follows_val_fraction_whatever_the_documents(tmp_path):
    """Two files of very different sizes, one file, many equal files: validation is near 10% of the text."""
    from lmforge.tokenizers import KINDS

    tok = KINDS["byte-bpe"].train(["some words here and there"], 260, 1)
    line = "the quick brown fox jumps over the lazy dog"
    layouts = {"uneven": [300, 20], "one": [200], "many": [30] * 20}
    for name, lengths in layouts.items():
        files = []
        for i, n in enumerate(lengths):
            path = tmp_path / f"{name}{i}.txt"
            path.write_text("\n".join([line] * n) + "\n")
            files.append(path)
        manifest = prepare_corpus(files, tok, tmp_path / name, val_fraction=0.1, workers=1, progress=False)
        train, valid = manifest["splits"]["train"]["tokens"], manifest["splits"]["valid"]["tokens"]
        share = valid / (train + valid)
        assert 0.05 <= share <= 0.2, (name, share)
