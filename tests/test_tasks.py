"""Task readers, label checks, subword alignment, the batch source and the metrics."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import assert_picture
from lmforge.data import tasks
from lmforge.errors import LmforgeError
from lmforge.tokenizers import KINDS
from lmforge.train.scores import accuracy, bio_chunks, chunk_f1, classification_report, confusion_matrix, macro_f1


@pytest.fixture(scope="module")
def tok():
    texts = ["the cat sat on the mat", "Vinken joined the board", "a nonexecutive director"] * 5
    return KINDS["wordpiece"].train(texts, 120, 1)


def test_headerless_csv_with_bom_is_label_then_text(tmp_path):
    path = tmp_path / "u.csv"
    path.write_bytes('\ufeff"1","Prelingual deafness"\r\n"-1","It may, perhaps, rain."\r\n'.encode())
    ex = tasks.read_classification(path)
    assert [(e.label, e.text, e.pair) for e in ex] == [("1", "Prelingual deafness", None),
                                                        ("-1", "It may, perhaps, rain.", None)]
    assert tasks.label_names(ex) == ["-1", "1"]


def test_header_csv_tsv_and_jsonl_with_pairs(tmp_path):
    (tmp_path / "a.csv").write_text("text,text_pair,label\nhi,there,yes\nbye,now,no\n")
    (tmp_path / "a.tsv").write_text("label\ttext\ttext_pair\nyes\thi\tthere\nno\tbye\tnow\n")
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"text": "hi", "text_pair": "there", "label": "yes"}, {"text": "bye", "text_pair": "now", "label": "no"}]))
    for name in ("a.csv", "a.tsv", "a.jsonl"):
        ex = tasks.read_classification(tmp_path / name)
        assert [(e.text, e.pair, e.label) for e in ex] == [("hi", "there", "yes"), ("bye", "now", "no")], name


@pytest.mark.parametrize("content, message", [
    ("label,body\nyes,hi\n", "a.csv:2: missing column 'text'"),
    ("label,text\nyes,  \n", "a.csv:2: empty 'text'"),
    ("label,text\n,hello\n", "a.csv:2: missing or empty 'label'"),
])
def test_bad_columns_are_one_line_errors(tmp_path, content, message):
    (tmp_path / "a.csv").write_text(content)
    with pytest.raises(LmforgeError, match=message) as err:
        tasks.read_classification(tmp_path / "a.csv")
    assert "\n" not in str(err.value)


def test_unseen_label_names_file_and_line(tmp_path):
    (tmp_path / "e.jsonl").write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "zzz"}\n')
    with pytest.raises(LmforgeError, match=r"e.jsonl:2: label 'zzz' never seen in training \(known: x, y\)"):
        tasks.check_labels(tasks.read_classification(tmp_path / "e.jsonl"), ["x", "y"])


def test_word_tag_splits_on_the_last_slash_and_conll_columns(tmp_path):
    (tmp_path / "t.txt").write_text("1/2/CD and/CC A/B/NNP ./.\n\nPierre/NNP\n")
    ex = tasks.read_tagged(tmp_path / "t.txt")
    assert [(e.words, e.tags) for e in ex] == [(["1/2", "and", "A/B", "."], ["CD", "CC", "NNP", "."]),
                                              (["Pierre"], ["NNP"])]
    (tmp_path / "t.conll").write_text("-DOCSTART- O\n\nEU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\n")
    ex = tasks.read_tagged(tmp_path / "t.conll")
    assert (ex[0].words, ex[0].tags, ex[0].source.endswith(":3")) == (["EU", "rejects"], ["B-ORG", "O"], True)
    assert ex[1].tags == ["B-PER"]


def test_labels_go_on_the_first_sub_token_and_come_back_through_word_ids(tok):
    ex = [tasks.Example("x", words=["Vinken", "boarded", "cat"], tags=["B-PER", "I-PER", "O"])]
    names = ["B-PER", "I-PER", "O"]
    (f,) = tasks.encode_tokens(ex, tok, names, 64)
    pieces = [tok.encode_sequence(w).ids for w in ex[0].words]
    assert len(pieces[1]) > 1  # "boarded" is split, so the test means something
    assert f.input_ids == [tok.cls_id, *pieces[0], *pieces[1], *pieces[2], tok.sep_id]
    want = [-100]
    for w, p in enumerate(pieces):
        want += [w % 3 if w != 1 else 1] + [-100] * (len(p) - 1)
    assert f.label == [*want, -100]
    (g,) = tasks.encode_tokens(ex, tok, names, 64, label_all=True)
    assert [x for x in g.label if x != -100] == [0] * len(pieces[0]) + [1] * len(pieces[1]) + [2] * len(pieces[2])
    assert tasks.word_predictions([f], [list(range(len(f.input_ids)))], 1) == [[1, 1 + len(pieces[0]),
                                                                                 1 + len(pieces[0]) + len(pieces[1])]]


def test_long_sentences_become_several_rows_and_keep_every_word(tok):
    words = ["the", "cat", "sat", "on", "the", "mat"] * 5
    ex = [tasks.Example("x", words=words, tags=["O"] * len(words))]
    feats = tasks.encode_tokens(ex, tok, ["O"], 8)
    assert len(feats) > 1 and all(len(f.input_ids) <= 8 for f in feats)
    preds = tasks.word_predictions(feats, [[0] * len(f.input_ids) for f in feats], 1)
    assert len(preds[0]) == len(words)


def test_task_source_is_deterministic_and_covers_an_epoch(tok):
    ex = [tasks.Example(f"l{i}", text=f"the cat {i}", label=str(i % 2)) for i in range(10)]
    feats = tasks.encode_classification(ex, tok, ["0", "1"], 16)
    src = tasks.TaskSource(feats, 5, tok.pad_id, seed=3)
    again = tasks.TaskSource(feats, 5, tok.pad_id, seed=3)
    assert torch.equal(src.batch(2)["input_ids"], again.batch(2)["input_ids"])
    seen = torch.cat([src.batch(1)["labels"], src.batch(2)["labels"]])
    assert sorted(seen.tolist()) == [0] * 5 + [1] * 5
    b = src.batch(1)
    assert b["input_ids"].shape == b["attention_mask"].shape and b["labels"].shape == (5,)


def test_classification_metrics_by_hand():
    gold, pred = [0, 0, 1, 1, 2], [0, 1, 1, 1, 0]
    assert accuracy(gold, pred) == 0.6
    assert confusion_matrix(gold, pred, 3).tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    assert macro_f1(gold, pred, 3) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    report = classification_report(gold, pred, ["a", "b", "c"])
    assert report["per_class"]["b"] == {"precision": 2 / 3, "recall": 1.0, "f1": 0.8, "support": 2}


def test_bio_chunk_f1_matches_seqeval_conventions():
    assert bio_chunks(["B-PER", "I-PER", "O", "I-LOC"]) == {("PER", 0, 2), ("LOC", 3, 4)}
    assert bio_chunks(["B-PER", "I-LOC"]) == {("PER", 0, 1), ("LOC", 1, 2)}
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-ORG", "B-ORG"]]
    # gold chunks 3, predicted 3, 2 exact matches: P = R = F1 = 2/3
    assert chunk_f1(gold, pred) == pytest.approx({"chunk_precision": 2 / 3, "chunk_recall": 2 / 3,
                                                  "chunk_f1": 2 / 3})


def test_confusion_png(tmp_path):
    from lmforge.viz.confusion import plot_confusion

    path = plot_confusion([[3, 1], [0, 4]], ["no", "yes"], tmp_path / "c.png")
    assert_picture(path, min_colours=4)  # four cells of different counts, and their labels
