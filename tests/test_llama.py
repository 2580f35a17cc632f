"""The Llama mapping (interop/llama.py): a small random transformers LlamaForCausalLM, made here, and lmforge's
Decoder compute the same logits, hidden states and greedy continuations; the mapping round-trips both ways;
save_pretrained folders (one file or sharded) load with safetensors only; what lmforge cannot represent is refused."""

from __future__ import annotations

import json
import re

import pytest
import torch

transformers = pytest.importorskip("transformers")

from lmforge.errors import LmforgeError  # noqa: E402
from lmforge.generation import generate  # noqa: E402
from lmforge.interop.llama import (  # noqa: E402
    decoder_config_from_llama,
    decoder_state_from_llama,
    llama_config_from_decoder,
    llama_state_from_decoder,
    load_llama_folder,
)
from lmforge.models import Decoder  # noqa: E402
from lmforge.models.registry import state_dict_untied  # noqa: E402

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=128, rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
             bos_token_id=1, eos_token_id=2)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Small models: one torch thread (conftest.py)."""


def hf_llama(tied: bool, seed: int = 0, **more) -> transformers.LlamaForCausalLM:
    """A random Llama with every parameter drawn, norm gains included, large enough for decisive argmaxes."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE, tie_word_embeddings=tied, **more))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 0.25)
    return model.eval()


def ours_from(hf: transformers.LlamaForCausalLM) -> Decoder:
    config = decoder_config_from_llama(hf.config.to_dict())
    model = Decoder(config)
    model.load_state_dict(decoder_state_from_llama(hf.state_dict(), config), strict=False)
    if config.tie_embeddings:
        assert model.lm_head.proj.weight is model.tok_emb.weight
    return model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- parity with transformers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_logits_and_hidden_states_equal_transformers(tied):
    hf = hf_llama(tied)
    ours = ours_from(hf)
    c = ours.config
    assert (c.n_heads, c.n_kv_heads, c.d_model, c.d_ff, c.rope_base, c.eps) == (4, 2, 64, 96, 100000.0, 1e-5)
    assert (c.norm, c.positions, c.activation, c.bias, c.tie_embeddings) == ("rmsnorm", "rotary", "swiglu", False, tied)
    ids = torch.randint(0, 128, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(ids, output_hidden_states=True)
        mine = ours(ids, output_hidden_states=True)
    # 1e-5 relative to the largest logit (~30 here, so ~3e-4 absolute; measured 4e-5): fp32 rounding scales
    # with the values, and weights this large make every greedy step decisive
    assert mine.logits.abs().max() > 10.0
    assert max_diff(mine.logits, theirs.logits) < 1e-5 * theirs.logits.abs().max().item()
    assert len(mine.hidden_states) == len(theirs.hidden_states) == 3
    for a, b in zip(mine.hidden_states, theirs.hidden_states, strict=True):
        assert max_diff(a, b) < 1e-5 * max(1.0, b.abs().max().item())


def test_padded_batch_equals_transformers():
    hf = hf_llama(tied=True, seed=2)
    ours = ours_from(hf)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0  # left padding
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, position_ids=positions).logits
        mine = ours(ids, attention_mask=mask, position_ids=positions).logits
    assert max_diff(mine[0], theirs[0]) < 1e-4 and max_diff(mine[1, 4:], theirs[1, 4:]) < 1e-4


@pytest.mark.parametrize("tied", [True, False])
def test_greedy_continuation_identical_and_cache_equals_no_cache(tied):
    hf = hf_llama(tied, seed=4)
    ours = ours_from(hf)
    prompt = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=24,
                             min_new_tokens=24, pad_token_id=0)[:, 7:]
    cached = generate(ours, prompt, max_new_tokens=24, use_cache=True)
    uncached = generate(ours, prompt, max_new_tokens=24, use_cache=False)
    assert cached.tokens.tolist() == theirs.tolist()
    assert uncached.tokens.tolist() == cached.tokens.tolist()
    assert len(set(theirs[0].tolist())) > 3  # a continuation, not one token repeated


# -- the mapping both ways ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_lmforge_hf_lmforge_is_identical(tied):
    hf = hf_llama(tied, seed=6)
    ours = ours_from(hf)
    config = ours.config
    hf_state = llama_state_from_decoder(state_dict_untied(ours), config)
    assert set(hf_state) == {k for k in hf.state_dict() if not (tied and k == "lm_head.weight")}
    for name, tensor in hf_state.items():
        assert torch.equal(tensor, hf.state_dict()[name]), name
    again = decoder_state_from_llama(hf_state, config)
    assert set(again) == set(state_dict_untied(ours))
    assert all(torch.equal(again[k], v) for k, v in state_dict_untied(ours).items())
    assert decoder_config_from_llama(llama_config_from_decoder(config)) == config


def test_exported_decoder_gives_transformers_the_same_logits():
    """A Decoder built in lmforge (not loaded): its config and tensors make a LlamaForCausalLM computing the same."""
    cfg = decoder_config_from_llama({**SHAPE, "num_key_value_heads": 1, "tie_word_embeddings": False,
                                     "attention_bias": True, "mlp_bias": True})
    torch.manual_seed(7)
    ours = Decoder(cfg).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.05 * torch.randn_like(p))  # biases and norm gains away from their initial values
    hf_config = llama_config_from_decoder(cfg)
    theirs = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config)).eval()
    missing, unexpected = theirs.load_state_dict(llama_state_from_decoder(state_dict_untied(ours), cfg), strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k]
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        assert max_diff(ours(ids).logits, theirs(ids).logits) < 1e-5


def test_export_refuses_what_llama_cannot_hold():
    from lmforge.models import get_preset

    with pytest.raises(LmforgeError, match="norm=layernorm, positions=learned, activation=gelu_tanh"):
        llama_config_from_decoder(get_preset("gpt-tiny"))
    modern = decoder_config_from_llama(SHAPE)
    with pytest.raises(LmforgeError, match="qk_norm=True"):
        llama_config_from_decoder(type(modern)(**{**modern.to_dict(), "qk_norm": True}))


# -- save_pretrained folders ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("sharded", [False, True])
def test_load_llama_folder(tmp_path, sharded):
    hf = hf_llama(tied=False, seed=9)
    hf.save_pretrained(tmp_path, max_shard_size="100KB" if sharded else "5GB")
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded
    model, hf_config = load_llama_folder(tmp_path)
    assert hf_config["num_key_value_heads"] == 2 and not model.training
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        assert max_diff(model(ids).logits, hf(ids).logits) < 1e-4


def test_folder_with_pickled_weights_only_is_refused(tmp_path):
    hf = hf_llama(tied=True, seed=11)
    hf.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
    with pytest.raises(LmforgeError, match="only pickled weights"):
        load_llama_folder(tmp_path)


# -- what lmforge cannot represent: one line each ------------------------------------------------------------------
@pytest.mark.parametrize("change, match", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_scaling of type 'llama3'"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_parameters of type 'yarn'"),
    ({"head_dim": 32}, "head_dim=32 with 4 heads is not hidden_size=64"),
    ({"attention_bias": True}, "attention_bias=True with mlp_bias=False"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, "not a Llama causal LM"),
    ({"num_key_value_heads": 3}, "n_heads=4 is not divisible by n_kv_heads=3"),
])
def test_unrepresentable_configs_are_refused(change, match):
    with pytest.raises(LmforgeError, match=match) as err:
        decoder_config_from_llama({**SHAPE, **change}, "folder/config.json")
    assert str(err.value).startswith("folder/config.json: ") and "\n" not in str(err.value)


def test_old_and_new_rope_settings_read_alike():
    old = decoder_config_from_llama({**SHAPE, "rope_scaling": None})
    new = {k: v for k, v in SHAPE.items() if k != "rope_theta"}
    new = decoder_config_from_llama({**new, "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}})
    assert old == new and old.rope_base == 100000.0
    assert decoder_config_from_llama({**SHAPE, "eos_token_id": [2, 7]}).eos_id == 2


def test_bad_tensors_are_refused(tmp_path):
    hf = hf_llama(tied=True, seed=12)
    config = decoder_config_from_llama(hf.config.to_dict())
    state = dict(hf.state_dict())
    extra = {**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(16)}
    with pytest.raises(LmforgeError, match=re.escape("unexpected tensor 'layers.0.self_attn.q_norm.weight'")):
        decoder_state_from_llama(extra, config, "ckpt")
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(LmforgeError, match=re.escape("ckpt: missing tensor 'layers.1.mlp.up_proj.weight'")):
        decoder_state_from_llama(state, config, "ckpt")
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 80}))
    with pytest.raises(LmforgeError, match=re.escape("layers.0.ffn.fc1.weight' has shape")):
        load_llama_folder(tmp_path)
