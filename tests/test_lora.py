"""LoRA, adapters and the scalar mix: parameter counts, exact starts, merge/unmerge, where gradients go."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lmforge.models import EncoderForSequenceClassification, get_preset
from lmforge.nn.lora import (
    AdapterLinear,
    LoRALinear,
    inject_adapters,
    inject_lora,
    lora_layers,
    mark_trainable,
    merge_lora,
    remove_wrappers,
    trainable_state_dict,
    unmerge_lora,
)
from lmforge.nn.mix import ScalarMix


def tiny_model(seed: int = 0) -> EncoderForSequenceClassification:
    torch.manual_seed(seed)
    return EncoderForSequenceClassification(get_preset("bert-tiny", vocab_size=50), 3).eval()


def inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 50, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def randomise_b(model: nn.Module) -> None:
    with torch.no_grad():
        for layer in lora_layers(model):
            layer.lora_B.normal_(std=0.5)


def test_seed_q5_parameter_ratio():
    lora = LoRALinear(nn.Linear(50, 200, bias=False), r=5)
    added = lora.lora_A.numel() + lora.lora_B.numel()
    assert added == 1250 and lora.base.weight.numel() == 10_000
    assert added / lora.base.weight.numel() == 0.125


def test_fresh_lora_and_adapters_equal_the_base_model_exactly():
    base = tiny_model()
    want = base(**inputs()).logits
    for inject in (lambda m: inject_lora(m.encoder, r=4, alpha=8), lambda m: inject_adapters(m.encoder, 8)):
        model = tiny_model()
        names = inject(model)
        assert names and all(n.startswith("layers.") for n in names)
        assert torch.equal(model(**inputs()).logits, want)


def test_default_targets_are_the_attention_projections():
    model = tiny_model()
    names = inject_lora(model.encoder)
    assert names == ["layers.0.self_attn.in_proj", "layers.0.self_attn.out_proj",
                     "layers.1.self_attn.in_proj", "layers.1.self_attn.out_proj"]
    with pytest.raises(ValueError, match=r"no nn\.Linear"):
        inject_lora(tiny_model().encoder, targets=["*.nothing"])


def test_merged_equals_unmerged_and_unmerge_restores_weights():
    model = tiny_model()
    inject_lora(model.encoder, r=4, alpha=8, dropout=0.1)
    randomise_b(model)
    model.eval()
    w0 = model.encoder.layers[0].self_attn.in_proj.base.weight.clone()
    unmerged = model(**inputs()).logits
    merge_lora(model)
    assert all(m.merged for m in lora_layers(model))
    assert not torch.equal(model.encoder.layers[0].self_attn.in_proj.base.weight, w0)
    torch.testing.assert_close(model(**inputs()).logits, unmerged, atol=1e-5, rtol=0)
    unmerge_lora(model)
    torch.testing.assert_close(model.encoder.layers[0].self_attn.in_proj.base.weight, w0, atol=1e-6, rtol=0)
    torch.testing.assert_close(model(**inputs()).logits, unmerged, atol=1e-6, rtol=0)


def test_remove_wrappers_gives_a_plain_model_with_the_same_outputs():
    model = tiny_model()
    inject_lora(model.encoder, r=2)
    randomise_b(model)
    want = model.eval()(**inputs()).logits
    remove_wrappers(model)
    assert not lora_layers(model)
    assert type(model.encoder.layers[0].self_attn.in_proj) is torch.nn.Linear  # the model's own layer back
    torch.testing.assert_close(model(**inputs()).logits, want, atol=1e-5, rtol=0)
    plain = tiny_model()
    plain.load_state_dict(model.state_dict())  # the merged model has the base's structure
    adapters = tiny_model()
    inject_adapters(adapters.encoder, 4)
    with pytest.raises(ValueError, match="adapters"):
        remove_wrappers(adapters)


@pytest.mark.parametrize("kind", ["lora", "adapter"])
def test_gradient_flows_only_to_the_new_parameters_and_the_head(kind):
    model = tiny_model()
    if kind == "lora":
        inject_lora(model.encoder, r=4)
        randomise_b(model)  # with B = 0, A's gradient is 0 too: make both non-trivial
    else:
        inject_adapters(model.encoder, 8)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, AdapterLinear):
                    m.up.weight.normal_(std=0.1)
    n = mark_trainable(model, ("head.",))
    model.train()
    model(**inputs(), labels=torch.tensor([0, 2])).loss.backward()
    trained = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    allowed = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trained == allowed
    assert {"head.classifier.weight", "head.classifier.bias"} <= allowed
    new = ("lora_A", "lora_B") if kind == "lora" else (".down.", ".up.")
    assert all(name.startswith("head.") or any(k in name for k in new) for name in allowed)
    assert n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert set(trainable_state_dict(model)) == allowed


def test_scalar_mix_is_a_softmax_weighted_sum_times_gamma():
    mix = ScalarMix(3)
    hs = [torch.randn(2, 4, 5) for _ in range(3)]
    torch.testing.assert_close(mix(hs), sum(hs) / 3)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.0, 1.0, 2.0]))
        mix.gamma.fill_(2.0)
    w = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
    torch.testing.assert_close(mix(hs), 2.0 * (w[0] * hs[0] + w[1] * hs[1] + w[2] * hs[2]))
    with pytest.raises(ValueError):
        mix(hs[:2])
