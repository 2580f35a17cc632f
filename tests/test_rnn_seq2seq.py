"""The RNN encoder-decoder with attention: attention against the NumPy reference, cached decoding, generation
with beams and padding, model directories, a recipe run, and learning a reversal task."""

import numpy as np
import pytest
import torch

import lmforge
from beam_reference import reference_beam_search
from lmforge import reference as ref
from lmforge.errors import LmforgeError
from lmforge.generation import generate, pad_prompts
from lmforge.generation.steps import make_steps
from lmforge.models import RNNSeq2Seq, get_preset, load_config, load_pretrained, save_pretrained
from lmforge.models.config import RNNSeq2SeqConfig
from lmforge.nn.rnn_attention import AdditiveAttention, MultiplicativeAttention, make_attention
from lmforge.workflows.pretrain import build_pretraining_model, pretrain

pytestmark = pytest.mark.usefixtures("single_thread")

KINDS = ["additive", "general", "dot"]


def model(attention: str = "additive", input_feeding: bool = True, **overrides) -> RNNSeq2Seq:
    torch.manual_seed(0)
    config = get_preset("rnn-seq2seq-tiny", attention=attention, input_feeding=input_feeding, dropout=0.0,
                        vocab_size=50, d_embed=16, d_hidden=16, **overrides)
    return RNNSeq2Seq(config).double().eval()


# -- attention ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_attention_matches_reference_with_padding(kind):
    torch.manual_seed(0)
    attention = make_attention(kind, 6, 6, attention_size=5).double()
    query, memory = torch.randn(3, 4, 6, dtype=torch.float64), torch.randn(3, 7, 6, dtype=torch.float64)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 2 + [0] * 5])
    context, weights = attention(query, memory, mask)
    args = {"additive": lambda: (attention.w_q.weight, attention.w_k.weight, attention.v),
            "general": lambda: (attention.w.weight,), "dot": lambda: ()}[kind]()
    numpy = [a.detach().numpy() for a in (query, memory, *args)]
    fn = ref.additive_attention if kind == "additive" else ref.multiplicative_attention
    want_context, want_weights = fn(*numpy, mask=mask.numpy().astype(bool))
    np.testing.assert_allclose(weights.detach().numpy(), want_weights, rtol=0, atol=1e-10)
    np.testing.assert_allclose(context.detach().numpy(), want_context, rtol=0, atol=1e-10)
    assert (weights[1, :, 5:] == 0).all() and (weights[2, :, 2:] == 0).all()
    np.testing.assert_allclose(weights.sum(-1).detach().numpy(), 1.0, atol=1e-12)
    garbage = memory.clone()
    garbage[1, 5:], garbage[2, 2:] = 1e3, -1e3  # whatever sits under the padding changes nothing
    context2, weights2 = attention(query, garbage, mask)
    assert torch.equal(weights2, weights) and torch.equal(context2, context)
    keys = attention.keys(memory)  # precomputed keys: the same result as computing them inside
    assert torch.equal(attention(query, memory, mask, keys=keys)[0], context)


def test_reference_scores_by_hand():
    s, h = np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 3.0]])
    w = np.array([[2.0, 0.0], [0.0, 1.0]])  # general: e_j = sᵀ W h_j = [2, 2, 12]
    _, alpha = ref.multiplicative_attention(s, h, w, mask=np.array([True, True, False]))
    np.testing.assert_allclose(alpha, [[0.5, 0.5, 0.0]])
    w_q, w_k, v = np.eye(2), np.eye(2), np.array([1.0, -1.0])  # e_j = tanh(1 + h_j0) - tanh(2 + h_j1)
    _, alpha = ref.additive_attention(s, h, w_q, w_k, v)
    e = np.tanh(1 + h[:, 0]) - np.tanh(2 + h[:, 1])
    np.testing.assert_allclose(alpha[0], np.exp(e) / np.exp(e).sum())


def test_attention_rejects_bad_settings():
    with pytest.raises(LmforgeError, match="dot"):
        MultiplicativeAttention(4, 6, score="dot")
    with pytest.raises(LmforgeError, match="additive, general or dot"):
        make_attention("cosine", 4, 4)
    assert isinstance(make_attention("additive", 4, 6), AdditiveAttention)
    with pytest.raises(LmforgeError, match="tie_embeddings"):
        get_preset("rnn-seq2seq-tiny", d_embed=32)
    with pytest.raises(LmforgeError, match="attention"):
        RNNSeq2SeqConfig.from_dict({"vocab_size": 10, "attention": "bilinear"})


# -- decoding -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("input_feeding", [True, False])
def test_cached_steps_equal_teacher_forcing(kind, input_feeding):
    m = model(kind, input_feeding)
    src, tgt = torch.randint(3, 50, (3, 7)), torch.randint(3, 50, (3, 6))
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    full = m(src, tgt, mask, output_attentions=True)
    memory = m.encode(src, mask).last_hidden_state
    caches = m.new_caches(3, 6, 7)
    steps = [m.decode(tgt[:, :1], memory, mask, caches=caches, output_attentions=True)]
    steps += [m.decode(tgt[:, t: t + 1], None, caches=caches, output_attentions=True) for t in range(1, 6)]
    torch.testing.assert_close(torch.cat([s.logits for s in steps], 1), full.logits, rtol=0, atol=1e-12)
    weights = torch.cat([s.cross_attentions[0] for s in steps], 2)  # (B, 1, T, S)
    torch.testing.assert_close(weights, full.cross_attentions[0], rtol=0, atol=1e-12)
    assert (weights[1, ..., 5:] == 0).all() and caches[0].steps == 6


def test_all_padding_columns_are_skipped_without_changing_the_loss():
    m = model("additive")
    batch = reversal_batch(np.random.default_rng(1), 4)  # padded to 7 / 8 columns, rows shorter
    batch = {k: torch.nn.functional.pad(v, (0, 3), value=-100 if k == "labels" else 0) for k, v in batch.items()}
    skipped, full = m(**batch), m(**batch, output_attentions=True)  # output_attentions runs every column
    torch.testing.assert_close(skipped.loss, full.loss, rtol=0, atol=1e-12)
    assert skipped.logits.shape == full.logits.shape and (skipped.logits[:, -3:] == 0).all()
    real = batch["labels"] != -100
    torch.testing.assert_close(skipped.logits[real], full.logits[real], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_cache_beams_and_padding(kind):
    m = model(kind)
    with torch.no_grad():  # sharper logits: no near-ties for rounding to flip
        m.lm_head.proj.weight.mul_(20.0)
    sources = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    ids, mask = pad_prompts(sources)
    for beams in (1, 3):
        cached = generate(m, ids, mask, max_new_tokens=8, beams=beams, stop_ids=[])
        uncached = generate(m, ids, mask, max_new_tokens=8, beams=beams, stop_ids=[], use_cache=False)
        alone = [generate(m, torch.tensor([s]), max_new_tokens=8, beams=beams, stop_ids=[]).tokens[0]
                 for s in sources]
        assert torch.equal(cached.tokens, uncached.tokens)
        assert torch.equal(cached.tokens, torch.stack(alone))
        assert len(set(map(tuple, cached.tokens.tolist()))) > 1  # the source matters
    right = torch.tensor([[11, 12, 0, 0, 0, 0]])  # teacher forcing: a right-padded row = the source alone
    tgt = torch.tensor([[1, 20, 21]])
    torch.testing.assert_close(m(right, tgt, (right != 0).long()).logits, m(right[:, :2], tgt).logits)


# -- model directories and the recipe ----------------------------------------------------------------------------
def test_save_and_load_give_the_same_logits(tmp_path):
    m = model("general", tie_embeddings=False).float()
    save_pretrained(m, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    assert isinstance(loaded, RNNSeq2Seq) and load_config(tmp_path / "m") == m.config
    src, tgt = torch.randint(3, 50, (2, 5)), torch.randint(3, 50, (2, 4))
    assert torch.equal(loaded(src, tgt).logits, m(src, tgt).logits)


def test_pretrain_recipe_builds_a_loadable_rnn(tmp_path):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    lines = [" ".join(rng.choice(words, rng.integers(2, 6))) for _ in range(120)]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("\n".join(f"{line}\t{' '.join(reversed(line.split()))}" for line in lines))
    recipe = {"tokenizer": {"kind": "byte-bpe", "vocab_size": 300},
              "data": {"objective": "seq2seq", "files": [str(tsv)], "seq_len": 16, "eval_batches": 1, "workers": 1},
              "model": {"preset": "rnn-seq2seq-tiny", "d_embed": 16, "d_hidden": 16, "attention": "general"},
              "train": {"max_steps": 40, "lr": 3e-2, "warmup_steps": 1, "batch_size": 4, "eval_every": 40,
                        "save_every": 40, "log_every": 1, "progress": False, "plot": False, "tensorboard": False}}
    result, model_dir = pretrain(recipe, tmp_path / "run")
    loaded, tokenizer = lmforge.load(model_dir)
    # an untrained model guesses uniformly (ln V a token): 40 steps on 8 words must be far below that
    assert result.step == 40 and result.eval["eval_loss"] < np.log(loaded.config.vocab_size) - 2
    assert isinstance(loaded, RNNSeq2Seq) and loaded.config.attention == "general"
    source = torch.tensor([tokenizer.encode("alpha beta gamma", add_special_tokens=False).ids])
    stop = [loaded.config.eos_id]
    out = generate(loaded, source, max_new_tokens=5, beams=2, stop_ids=stop, pad_id=0)
    with torch.inference_mode():  # the plain list-based beam search over the same loaded model
        want, scores = reference_beam_search(make_steps(loaded, source, None, 5), 1, 2, 5, stop, 0)
    assert out.to_lists() == want and len(want[0]) >= 1
    torch.testing.assert_close(out.scores, torch.tensor(scores, dtype=out.scores.dtype))
    with pytest.raises(LmforgeError, match="not an encoder-decoder"):
        build_pretraining_model({"preset": "gpt-tiny"}, tokenizer, "seq2seq")


# -- learning -------------------------------------------------------------------------------------------------
def reversal_batch(rng: np.random.Generator, n: int, bos: int = 1, eos: int = 2) -> dict[str, torch.Tensor]:
    """Sources of 3-7 tokens from 3..15; the target is the source reversed, then EOS."""
    s = 7
    src, tgt = torch.zeros(n, s, dtype=torch.long), torch.zeros(n, s + 1, dtype=torch.long)
    labels, src_mask = torch.full((n, s + 1), -100), torch.zeros(n, s, dtype=torch.long)
    for i in range(n):
        x = rng.integers(3, 16, rng.integers(3, s + 1)).tolist()
        y = x[::-1]
        src[i, : len(x)], src_mask[i, : len(x)] = torch.tensor(x), 1
        tgt[i, : len(y) + 1] = torch.tensor([bos, *y])
        labels[i, : len(y) + 1] = torch.tensor([*y, eos])
    return {"src_ids": src, "src_mask": src_mask, "tgt_ids": tgt, "labels": labels}


def test_learns_to_reverse():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    m = RNNSeq2Seq(get_preset("rnn-seq2seq-tiny", vocab_size=16, d_embed=48, d_hidden=48, dropout=0.0))
    test = reversal_batch(rng, 64)
    with torch.no_grad():
        untrained = m(**test).loss.item()
    steps = 120
    optimizer = torch.optim.AdamW(m.parameters(), lr=2e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    for _ in range(steps):
        loss = m(**reversal_batch(rng, 32)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    m.eval()
    with torch.no_grad():
        trained = m(**test).loss.item()
    # Without reading the source the best is ~ln(13) = 2.56 nats per token; the untrained model is near ln(16).
    assert untrained > 2.5 and trained < 0.3, (untrained, trained)
    out = generate(m, test["src_ids"], test["src_mask"], max_new_tokens=8)
    want = [[t for t in row if t != -100] for row in test["labels"].tolist()]
    exact = sum(row == w for row, w in zip(out.to_lists(), want, strict=True)) / len(want)
    assert exact > 0.8, exact


def test_docstring_examples_run():
    import doctest

    from lmforge.models import rnn_seq2seq
    from lmforge.nn import rnn_attention
    from lmforge.reference import rnn_attention as reference_rnn_attention

    for module in (rnn_seq2seq, rnn_attention, reference_rnn_attention):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
