"""The four fine-tuning strategies as model surgery, and task heads put on a pretrained backbone.

    full      every weight trains
    frozen    only the head trains (mix=True: the head reads gamma * sum_j softmax(s)_j h_j of all layers)
    lora      W x + (alpha / r) B A x on the attention projections; the head trains
    adapter   bottleneck adapters after attention and feed-forward; the head trains

``task_model(base, task, num_labels)`` puts a fresh classification head on a loaded backbone (a BERT-style
encoder or an ELMo biLM); ``apply_strategy`` then marks what trains. Training and loading a fine-tuned
directory both go through these two, so a saved adapter rebuilds exactly the model that was trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn.lora import ADAPTER_TARGETS, LORA_TARGETS, inject_adapters, inject_lora, mark_trainable

STRATEGIES = ("full", "frozen", "lora", "adapter")


@dataclass
class StrategySpec:
    """What ``apply_strategy`` needs: the strategy and its hyper-parameters."""

    strategy: str = "full"
    mix: bool = False
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_targets: Sequence[str] = field(default_factory=lambda: list(LORA_TARGETS))
    adapter_size: int = 64


def task_model(base: nn.Module, task: str, num_labels: int) -> nn.Module:
    """A fresh ``task`` head ('seq-cls' | 'token-cls') on the backbone of ``base`` (in train mode)."""
    from lmforge.models.elmo import BiLM, bilm_task_model
    from lmforge.models.encoder import Encoder, EncoderForSequenceClassification, EncoderForTokenClassification

    bilm = base if isinstance(base, BiLM) else getattr(base, "encoder", None)
    if isinstance(bilm, BiLM):  # ELMo: a head on the biLM's top layer, or on its scalar mix (mix=True)
        return bilm_task_model(bilm, task, num_labels).train()
    encoder = base if isinstance(base, Encoder) else getattr(base, "encoder", None)
    if not isinstance(encoder, Encoder):
        raise LmforgeError(f"a {type(base).__name__} is not a BERT-style encoder; fine-tuning needs one")
    cls = EncoderForSequenceClassification if task == "seq-cls" else EncoderForTokenClassification
    model = cls(encoder.config, num_labels)
    model.encoder = encoder
    return model.train()


def backbone_config(model: nn.Module):
    """The config of the backbone under a task head (its vocabulary is the tokenizer's)."""
    return getattr(getattr(model, "encoder", None), "config", None) or model.config


def apply_strategy(model: nn.Module, spec: StrategySpec) -> nn.Module:
    """Wrap / freeze ``model`` for the strategy; returns the module to train (a wrapper for mix=True)."""
    from lmforge.models.elmo import BiLMForTokenClassification, apply_bilm_strategy

    if isinstance(model, BiLMForTokenClassification):  # either biLM task model (seq-cls is a subclass)
        return apply_bilm_strategy(model, spec.strategy, spec.mix)
    if spec.strategy == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    if spec.strategy == "frozen" and spec.mix:
        from lmforge.nn.mix import MixedFeatureModel

        model = MixedFeatureModel(model)
        mark_trainable(model, ("model.head.", "mix."))
        return model
    if spec.strategy == "lora":
        try:
            inject_lora(model.encoder, spec.lora_r, spec.lora_alpha, spec.lora_dropout, list(spec.lora_targets))
        except ValueError as err:
            raise LmforgeError(f"--lora-targets: {err}") from None
    elif spec.strategy == "adapter":
        inject_adapters(model.encoder, spec.adapter_size, ADAPTER_TARGETS)
    mark_trainable(model, ("head.",))
    return model


def apply_decoder_strategy(model: nn.Module, spec: StrategySpec) -> nn.Module:
    """The strategies on a decoder (instruction tuning, workflows/sft.py): full; frozen (only the LM head trains,
    the token embedding too when they are tied); lora on ``lora_targets``; bottleneck adapters."""
    if spec.strategy == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    if spec.strategy == "lora":
        try:
            inject_lora(model, spec.lora_r, spec.lora_alpha, spec.lora_dropout, list(spec.lora_targets))
        except ValueError as err:
            raise LmforgeError(f"--lora-targets: {err}") from None
        mark_trainable(model)
    elif spec.strategy == "adapter":
        inject_adapters(model, spec.adapter_size, ADAPTER_TARGETS)
        mark_trainable(model)
    else:  # frozen: the head only
        mark_trainable(model, ("lm_head.",))
    return model
