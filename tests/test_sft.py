"""Instruction tuning (data/chat.py, workflows/sft.py): the loss on the assistant's tokens only, packing that
changes nothing, truncation that never drops the answer, the run end to end, the course-scale GPT, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.cli import main
from lmforge.data.chat import collate, encode_conversation, pack, read_conversations, unpacked
from lmforge.errors import LmforgeError
from lmforge.models import Decoder, get_preset, save_pretrained
from lmforge.models.config import DecoderConfig
from lmforge.nn.loss import IGNORE_INDEX
from lmforge.tokenizers import ByteLevelBPETokenizer
from lmforge.tokenizers.chat import ChatTemplate

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = "what is two plus two? four. and three plus three? six. name a colour: red, blue, green. " * 6
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "what is two plus two?"},
                {"role": "assistant", "content": "four."}, {"role": "user", "content": "and three plus three?"},
                {"role": "assistant", "content": "six, of course."}]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (conftest.py)."""


def tokenizer():
    tok = ByteLevelBPETokenizer.train([TEXT], 330, 1, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.set_role("eos", "<|im_end|>")
    tok.chat_template, tok.specials_in_text = CHATML, True
    return tok


def tiny_llama(vocab: int, dtype=torch.float32) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=vocab, d_model=48, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                           max_positions=160, dropout=0.0, attention_dropout=0.0, activation="swiglu",
                           norm="rmsnorm", positions="rotary", bias=False)
    return Decoder(config).to(dtype).eval()


def test_labels_fall_on_the_assistant_replies_and_their_end_markers_only():
    tok = tokenizer()
    encoded = encode_conversation(ChatTemplate(CHATML), tok, CONVERSATION, 200)
    labelled = [i for i, label in zip(encoded.ids, encoded.labels, strict=True) if label != IGNORE_INDEX]
    text = tok.decode(labelled, skip_special_tokens=False)
    assert text == "four.<|im_end|>six, of course.<|im_end|>"
    assert all(label in (IGNORE_INDEX, token) for token, label in zip(encoded.ids, encoded.labels, strict=True))


def test_a_long_conversation_loses_its_oldest_turns_never_the_answer():
    tok, template = tokenizer(), ChatTemplate(CHATML)
    whole = encode_conversation(template, tok, CONVERSATION, 200)
    cut = encode_conversation(template, tok, CONVERSATION, len(whole.ids) - 5)
    assert cut.dropped == 2 and tok.decode([i for i, lab in zip(cut.ids, cut.labels, strict=True) if lab != -100],
                                           skip_special_tokens=False) == "six, of course.<|im_end|>"
    assert tok.decode(cut.ids, skip_special_tokens=False).startswith("<|im_start|>system\nBe brief.")
    with pytest.raises(LmforgeError, match="over max_len 10 even with only its last exchange"):
        encode_conversation(template, tok, CONVERSATION, 10)


def test_packed_rows_give_the_same_loss_as_each_conversation_alone():
    tok, template = tokenizer(), ChatTemplate(CHATML)
    conversations = [CONVERSATION, CONVERSATION[1:3], [{"role": "user", "content": "name a colour:"},
                                                       {"role": "assistant", "content": "red."}]]
    encoded = [encode_conversation(template, tok, c, 150) for c in conversations]
    model = tiny_llama(tok.vocab_size, torch.float64)
    rows = pack(encoded, 150)
    assert len(rows) < len(encoded)  # several conversations share a row
    with torch.no_grad():
        packed = model(**collate(rows, 0)).loss
        alone = model(**collate(unpacked(encoded), 0)).loss
        by_hand = []
        for e in encoded:  # each conversation on its own, no padding at all
            ids, labels = torch.tensor([e.ids]), torch.tensor([e.labels])
            logits = model(ids).logits[0, :-1]
            by_hand += torch.nn.functional.cross_entropy(logits, labels[0, 1:], reduction="none")[
                labels[0, 1:] != IGNORE_INDEX].tolist()
    assert abs(packed.item() - alone.item()) < 1e-10
    assert abs(packed.item() - sum(by_hand) / len(by_hand)) < 1e-10


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    pairs = [("what is two plus two?", "four."), ("and three plus three?", "six."), ("name a colour:", "red."),
             ("what is two plus two?", "four, surely."), ("name a colour:", "blue.")]
    write_jsonl(root / "train.jsonl", [{"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]} for q, a in pairs * 4]
                + [{"prompt": "name a colour:", "completion": "green."}])
    write_jsonl(root / "dev.jsonl", [{"messages": [{"role": "user", "content": q},
                                                   {"role": "assistant", "content": a}]} for q, a in pairs[:3]])
    tok = tokenizer()
    save_pretrained(pretrained_base(tok), root / "base", tok)
    return root


def pretrained_base(tok) -> Decoder:
    """A tiny Llama that has read the words (causal LM on TEXT), as a real base has: LoRA then has features to
    steer; on random weights its small updates barely move the near-uniform logits."""
    model = tiny_llama(tok.vocab_size).train()
    ids = torch.tensor(tok.encode(TEXT).ids[:150])[None]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
    return model


@pytest.mark.parametrize(("strategy", "steps", "lr"), [("lora", "60", "2e-2"), ("full", "30", "5e-3")])
def test_chat_finetuning_runs_learns_and_loads_in_chat(chat_data, tmp_path, capsys, strategy, steps, lr):
    import lmforge
    from lmforge.data.chat import ChatSource
    from lmforge.workflows.chat import chat
    from lmforge.workflows.sft import encode_all, eval_loss

    out = tmp_path / strategy
    assert main(["finetune", "--task", "chat", "--model", str(chat_data / "base"), "--train",
                 str(chat_data / "train.jsonl"), "--eval", str(chat_data / "dev.jsonl"), "--strategy", strategy,
                 "--max-steps", steps, "--batch-size", "4", "--lr", lr, "--eval-every", "10", "--max-len", "64",
                 "--out", str(out), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    evals = json.loads((out / "finetune.json").read_text())["evals"]
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.5  # it learnt the replies
    assert report["eval"]["eval_loss"] == pytest.approx(min(e["eval_loss"] for e in evals), rel=1e-5)  # best kept
    model, tok = lmforge.load(out)  # LoRA: the base and the adapter, merged on load
    dev = pack(encode_all(ChatTemplate(tok.chat_template), tok, str(chat_data / "dev.jsonl"), 0, 64), 64)
    with torch.no_grad():
        reloaded = eval_loss(model.eval(), ChatSource(dev, 4, 0, 0, eval_rows=dev, eval_batch_size=4))
    assert reloaded == pytest.approx(report["eval"]["eval_loss"], rel=1e-5)  # the saved model is the kept one
    if strategy == "full":  # enough to answer in the format
        assert chat(model, tok, [{"role": "user", "content": "what is two plus two?"}]).startswith("four")


def test_a_course_gpt_learns_a_chat_format(chat_data, tmp_path, capsys):
    """No template: the markers become special tokens, the embedding grows by their rows, each the mean row."""
    import lmforge

    words = ByteLevelBPETokenizer.train([TEXT], 300, 1)  # no special tokens at all
    base = Decoder(get_preset("gpt-tiny", vocab_size=words.vocab_size, dropout=0.0, attention_dropout=0.0,
                              max_positions=128))
    save_pretrained(base, tmp_path / "gpt", words)
    out = tmp_path / "gpt-chat"
    assert main(["finetune", "--task", "chat", "--model", str(tmp_path / "gpt"), "--train",
                 str(chat_data / "train.jsonl"), "--strategy", "full", "--max-steps", "4", "--batch-size", "4",
                 "--max-len", "64", "--out", str(out), "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens_added"] == 2
    model, tok = lmforge.load(out)
    assert tok.vocab_size == words.vocab_size + 2 == model.config.vocab_size and tok.chat_template
    assert [tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")] == [words.vocab_size, words.vocab_size + 1]


@pytest.mark.parametrize(("rows", "extra", "message"), [
    ([{"messages": [{"role": "user", "content": "hi"}]}], [], "without an assistant turn"),
    ([{"messages": [{"role": "bot", "content": "hi"}]}], [], r"role: 'bot' is not one of"),
    ([], [], "no conversations"),
    ([{"text": "hi"}], [], "expected"),
])
def test_bad_conversations_are_one_line(chat_data, tmp_path, capsys, rows, extra, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + ("\n" if rows else ""))
    code = main(["finetune", "--task", "chat", "--model", str(chat_data / "base"), "--train", str(path),
                 "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message.replace("\\", "") in err.replace("\\", ""), err


def test_a_template_that_refuses_the_roles_and_a_non_decoder_are_one_line(chat_data, tmp_path, capsys):
    from lmforge.models import save_pretrained as save
    from lmforge.models.encoder import Encoder

    strict = tmp_path / "strict"
    tok = tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System messages are not supported') }}{% endif %}"
                         "{{ m['content'] }}{% endfor %}")
    save(tiny_llama(tok.vocab_size), strict, tok)
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": CONVERSATION}])
    assert main(["finetune", "--task", "chat", "--model", str(strict), "--train", str(path),
                 "--out", str(tmp_path / "o1")]) == 2
    assert "System messages are not supported" in capsys.readouterr().err
    encoder = tmp_path / "bert"
    save(Encoder(get_preset("bert-tiny", vocab_size=tok.vocab_size)), encoder, tok)
    assert main(["finetune", "--task", "chat", "--model", str(encoder), "--train", str(path),
                 "--out", str(tmp_path / "o2")]) == 2
    assert "--task chat tunes a decoder" in capsys.readouterr().err


def test_read_conversations_accepts_both_formats(chat_data):
    conversations = read_conversations(chat_data / "train.jsonl")
    assert conversations[-1] == [{"role": "user", "content": "name a colour:"},
                                 {"role": "assistant", "content": "green."}]


def test_the_course_example_learns_to_answer_held_out_sums(tmp_path, capsys):
    """examples/chat_sft_course.py: a tiny GPT given a chat format answers sums it never saw (19 of 20 here)."""
    import runpy
    from pathlib import Path

    example = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "chat_sft_course.py"))
    result = example["main"](tmp_path)
    assert result["added"] == 2 and result["last"] < result["first"] - 0.3
    assert result["right"] >= 15, result  # of 20 held-out questions; 0 before tuning (no chat format at all)
    assert "held-out questions answered exactly" in capsys.readouterr().out


def test_loss_only_scores_the_same_targets_with_the_same_gradients():
    """``loss_only`` computes the LM head on the labelled positions only: the loss and every gradient equal the
    full (B, T, V) computation (float64), with packed segments and a row without any target."""
    torch.manual_seed(0)
    model = tiny_llama(97, dtype=torch.float64)
    ids = torch.randint(3, 97, (3, 12))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 4:9], labels[1, 2:4], labels[1, 8:] = ids[0, 4:9], ids[1, 2:4], ids[1, 8:]  # row 2: no target
    segments = torch.tensor([[0] * 6 + [1] * 6, [0] * 12, [0] * 4 + [1] * 8])
    positions = torch.cat([torch.arange(6), torch.arange(6)]).repeat(3, 1)
    batch = dict(input_ids=ids, labels=labels, segment_ids=segments, position_ids=positions)
    full = model(**batch)
    full.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    sparse = model(**batch, loss_only=True)
    sparse.loss.backward()
    n_targets = int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert sparse.logits.shape == (n_targets, 97) and full.logits.shape == (3, 12, 97)
    torch.testing.assert_close(sparse.loss, full.loss, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-10, atol=1e-12, msg=n)


def test_loss_only_in_chunks_gives_the_same_loss_and_gradients():
    """Over ``loss_chunk_rows`` targets the LM head and the loss run chunk by chunk (nn/loss.py): the same loss and
    gradients as the full (B, T, V) computation (float64), and no logits come back."""
    torch.manual_seed(0)
    model = tiny_llama(97, dtype=torch.float64)
    ids = torch.randint(3, 97, (3, 12))
    labels = ids.clone()
    labels[1, :5] = IGNORE_INDEX  # 28 targets: chunks of 8, 8, 8 and 4
    full = model(input_ids=ids, labels=labels)
    full.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.loss_chunk_rows = 8
    chunked = model(input_ids=ids, labels=labels, loss_only=True)
    chunked.loss.backward()
    assert chunked.logits is None
    torch.testing.assert_close(chunked.loss, full.loss, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-10, atol=1e-12, msg=n)


def head_rows(monkeypatch) -> list[int]:
    """The number of positions each call of any LM head scores, appended as the calls happen."""
    from lmforge.models.heads import LMHead

    calls, forward = [], LMHead.forward

    def counted(self, h):
        calls.append(h.shape[:-1].numel())
        return forward(self, h)

    monkeypatch.setattr(LMHead, "forward", counted)
    return calls


def test_a_chat_run_never_computes_logits_for_every_position(chat_data, tmp_path, capsys, monkeypatch):
    """Training steps, the trainer's evaluation and the final eval loss run the LM head on the assistant's tokens
    only, in chunks of at most ``loss_chunk_rows``: (B, T, V) logits never exist (4 rows x 64 tokens here)."""
    calls = head_rows(monkeypatch)
    monkeypatch.setattr(Decoder, "loss_chunk_rows", 8, raising=False)
    assert main(["finetune", "--task", "chat", "--model", str(chat_data / "base"), "--train",
                 str(chat_data / "train.jsonl"), "--eval", str(chat_data / "dev.jsonl"), "--strategy", "lora",
                 "--max-steps", "3", "--batch-size", "4", "--max-len", "64", "--eval-every", "2",
                 "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert max(calls) <= 8, calls  # before: every position of the evaluation rows (112), and N > 8 in training
    assert report["eval"]["eval_loss"] > 0 and len(calls) > 6  # 3 steps, 2 evaluations, the final eval loss
    assert report["peak_rss_bytes"] >= report["peak_rss_delta_bytes"] >= 0  # what the run measured of itself
    events = [json.loads(line) for line in (tmp_path / "out" / "run" / "log.jsonl").read_text().splitlines()]
    assert any("eval_loss" in e for e in events if e.get("event") == "eval")


@pytest.mark.parametrize("options", [["--micro-batch-size", "1"], ["--activation-checkpointing"]])
def test_passes_and_recomputation_change_the_memory_not_the_run(chat_data, tmp_path, capsys, options):
    """A step of 4 rows in 4 passes of 1 row (the trainer weights each pass by its targets), or with each layer
    recomputed in the backward pass: the same losses and the same tuned weights as 4 rows in one pass."""
    from safetensors.torch import load_file

    def run(name: str, extra: list[str]) -> dict:
        assert main(["finetune", "--task", "chat", "--model", str(chat_data / "base"), "--train",
                     str(chat_data / "train.jsonl"), "--eval", str(chat_data / "dev.jsonl"), "--strategy", "lora",
                     "--lora-dropout", "0", "--max-steps", "3", "--batch-size", "4", "--max-len", "64",
                     "--lr", "1e-2", "--out", str(tmp_path / name), "--no-progress", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    one, other = run("one", ["--micro-batch-size", "4"]), run("other", options)
    assert one["rows_per_pass"] == 4 and other["rows_per_pass"] == (1 if "1" in options else 4)
    assert other["train_loss"] == pytest.approx(one["train_loss"], rel=1e-5)
    assert other["eval"]["eval_loss"] == pytest.approx(one["eval"]["eval_loss"], rel=1e-5)
    weights = [load_file(next((tmp_path / name).glob("*.safetensors"))) for name in ("one", "other")]
    assert weights[0].keys() == weights[1].keys()
    for key in weights[0]:
        torch.testing.assert_close(weights[1][key], weights[0][key], rtol=1e-4, atol=1e-6, msg=key)


def test_a_micro_batch_size_that_does_not_divide_the_batch_is_one_line(chat_data, tmp_path, capsys):
    assert main(["finetune", "--task", "chat", "--model", str(chat_data / "base"), "--train",
                 str(chat_data / "train.jsonl"), "--batch-size", "4", "--micro-batch-size", "3",
                 "--out", str(tmp_path / "x"), "--no-progress"]) != 0
    assert "--micro-batch-size 3 must divide --batch-size 4" in capsys.readouterr().err
