"""Model configurations: one dataclass per architecture, saved as ``config.json`` in a model directory.

    EncoderConfig   BERT (Devlin et al. 2018): bidirectional, post-LN, GELU, learned positions, segments
    DecoderConfig   GPT-2 (Radford et al. 2019): causal, pre-LN, tanh-GELU, learned positions, tied head;
                    switches for the modern recipe (RMSNorm, rotary, QK-norm, ReLU²/SwiGLU, ...: docs/modern.md)
    Seq2SeqConfig   Transformer (Vaswani et al. 2017): encoder-decoder, post-LN, ReLU, sinusoidal positions
    RNNSeq2SeqConfig  BiLSTM encoder + LSTM decoder with additive / multiplicative attention (Bahdanau, Luong)
    BiLMConfig, CNNConfig, GridCaptionerConfig, DualEncoderConfig: in their model files (elmo.py, cnn.py,
                    captioning.py, dual_encoder.py), each adding itself to CONFIG_CLASSES

Each config round-trips: ``Config.from_dict(c.to_dict()) == c`` and ``Config.load(c.save(dir)) == c``.
The ``kind`` field says which class a ``config.json`` belongs to (``load_config`` dispatches on it).

>>> get_preset("gpt-tiny", n_layers=3).n_layers
3
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8, write_text_atomic

# Keys a model directory's config.json may hold beside the architecture's fields (which head sits on
# top, the label names of a fine-tuned model, ...). ``from_dict`` accepts and ignores them.
MODEL_KEYS = frozenset({"architecture", "num_labels", "labels", "task", "lmforge_version", "label_names",
                        "tokenizer"})  # tokenizer: a checkpoint's path to its run's tokenizer directory


class ConfigMixin:
    """to_dict / from_dict / save / load shared by the three configs."""

    kind: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config"):
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        kind = d.get("kind", cls.kind)
        if kind != cls.kind:
            raise LmforgeError(f"{source}: kind is {kind!r}, expected {cls.kind!r}")
        unknown = sorted(set(d) - names - MODEL_KEYS)
        if unknown:
            raise LmforgeError(f"{source}: unknown {cls.__name__} field(s) {', '.join(unknown)}")
        values = {k: v for k, v in d.items() if k in names}
        check_values(cls, values, source)
        try:
            config = cls(**values)
        except TypeError as err:  # a required field is missing
            raise LmforgeError(f"{source}: {err}") from None
        config.validate(source)  # type: ignore[attr-defined]
        return config

    def save(self, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
        """Write ``directory/config.json`` atomically (temporary file, then rename); return its path."""
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**self.to_dict(), **(extra or {})}
        write_text_atomic(path, json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read a ``config.json`` (or the one inside a directory)."""
        return cls.from_dict(read_json(config_path(path)), source=str(config_path(path)))

    def validate(self, source: str = "config") -> None:
        d_model, n_heads = getattr(self, "d_model"), getattr(self, "n_heads")  # noqa: B009
        if d_model % n_heads:
            raise LmforgeError(f"{source}: d_model={d_model} is not divisible by n_heads={n_heads}")
        if getattr(self, "activation") not in ("relu", "gelu", "gelu_tanh"):  # noqa: B009
            raise LmforgeError(f"{source}: activation must be relu, gelu or gelu_tanh")


def check_values(cls: type, values: dict[str, Any], source: str) -> None:
    """Check each value of a config.json by type and range before any tensor is built; errors name the field.

    Integers are sizes (>= 1), layer counts (n_*layers, >= 0) or token ids (>= 0); dropout-like rates lie
    in [0, 1); eps and temperature are > 0. ``"d_model": "64"`` or ``-64`` is one line, not a traceback.

    >>> check_values(EncoderConfig, {"vocab_size": 10, "d_model": "64"}, "config.json")
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: config.json: d_model must be an integer, got '64'
    """
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        hint = hints.get(name)
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
        if value is None and optional:
            continue
        base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
        if base is bool and not isinstance(value, bool):
            raise LmforgeError(f"{source}: {name} must be true or false, got {value!r}")
        if base is str and not isinstance(value, str):
            raise LmforgeError(f"{source}: {name} must be a string, got {value!r}")
        if base is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LmforgeError(f"{source}: {name} must be an integer, got {value!r}")
            low = 0 if name.endswith("_id") or (name.startswith("n_") and name.endswith("layers")) else 1
            if value < low:
                raise LmforgeError(f"{source}: {name} must be >= {low}, got {value}")
        if base is float:
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise LmforgeError(f"{source}: {name} must be a number, got {value!r}")
            if ("dropout" in name or name == "label_smoothing") and not 0 <= value < 1:
                raise LmforgeError(f"{source}: {name} must be in [0, 1), got {value}")
            if name in ("eps", "temperature") and value <= 0:
                raise LmforgeError(f"{source}: {name} must be > 0, got {value}")


@dataclass
class EncoderConfig(ConfigMixin):
    """BERT: token + position + segment embeddings, post-LN GELU layers, a tanh pooler on [CLS]."""

    vocab_size: int
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_positions: int = 512
    type_vocab_size: int = 2
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    eps: float = 1e-12
    pad_id: int | None = 0
    kind: str = field(default="encoder")


@dataclass
class DecoderConfig(ConfigMixin):
    """GPT-2: token + learned positions, pre-LN tanh-GELU layers, a final LayerNorm, the LM head tied.

    The defaults are GPT-2 exactly. The switches of the modern recipe (docs/modern.md):
        norm                   layernorm | rmsnorm              every norm of the model, the final one too
        positions              learned | rotary                 added table P, or q and k rotated per head
        rope_base              the rotary angles' base b: pair j turns by pos · b^(-2j/d_head) (Llama 3: 500000)
        n_kv_heads             key/value heads shared by groups of query heads (None: n_heads; grouped-query
                               attention, docs/models.md)
        qk_norm                RMSNorm of each head's q and k before the dot product
        activation             gelu_tanh | relu | gelu | relu2 | swiglu
        bias                   biases on projections and norms (False: none anywhere)
        tie_embeddings         LM head = token embedding matrix (False: a separate W_out)
        logit_softcap          c: logits = c · tanh(logits / c) (None: off)
        zero_init_projections  attention and FFN output projections (and an untied head) start at 0
    """

    vocab_size: int
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    d_ff: int = 3072
    max_positions: int = 1024
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu_tanh"
    eps: float = 1e-5
    tie_embeddings: bool = True
    pad_id: int | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    norm: str = "layernorm"
    positions: str = "learned"
    qk_norm: bool = False
    bias: bool = True
    logit_softcap: float | None = None
    zero_init_projections: bool = False
    n_kv_heads: int | None = None
    rope_base: float = 10000.0
    kind: str = field(default="decoder")

    def validate(self, source: str = "config") -> None:
        if self.d_model % self.n_heads:
            raise LmforgeError(f"{source}: d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        choices = {"activation": ("gelu_tanh", "relu", "gelu", "relu2", "swiglu"),
                   "norm": ("layernorm", "rmsnorm"), "positions": ("learned", "rotary")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise LmforgeError(f"{source}: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise LmforgeError(f"{source}: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}")
        if not self.rope_base > 0:
            raise LmforgeError(f"{source}: rope_base must be > 0, got {self.rope_base!r}")
        d_head = self.d_model // self.n_heads
        if self.positions == "rotary" and d_head % 2:
            raise LmforgeError(f"{source}: rotary positions need an even head width, got {d_head}")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise LmforgeError(f"{source}: logit_softcap must be a positive number or null, got {self.logit_softcap!r}")

    def is_gpt2(self) -> bool:
        """True when every switch is at GPT-2's setting (what Hugging Face's GPT2LMHeadModel can hold)."""
        return not self.non_gpt2_settings()

    def non_gpt2_settings(self) -> list[str]:
        """The switches set away from GPT-2, as ``name=value`` (zero-init is only an initialisation: not listed)."""
        gpt2 = {"norm": "layernorm", "positions": "learned", "qk_norm": False, "bias": True, "logit_softcap": None}
        changed = [f"{k}={getattr(self, k)}" for k, v in gpt2.items() if getattr(self, k) != v]
        if self.n_kv_heads not in (None, self.n_heads):
            changed.append(f"n_kv_heads={self.n_kv_heads}")
        if self.activation in ("relu2", "swiglu"):
            changed.append(f"activation={self.activation}")
        return changed


@dataclass
class Seq2SeqConfig(ConfigMixin):
    """Vaswani et al.: shared embeddings * sqrt(d_model), sinusoids, post-LN ReLU encoder and decoder."""

    vocab_size: int
    d_model: int = 512
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    n_heads: int = 8
    d_ff: int = 2048
    max_positions: int = 512
    dropout: float = 0.1
    activation: str = "relu"
    eps: float = 1e-5
    pad_id: int | None = 0
    bos_id: int | None = 1
    eos_id: int | None = 2
    attention_dropout: float = 0.0  # the paper drops sublayer outputs only
    label_smoothing: float = 0.0  # the paper's ε_ls = 0.1 (§5.4); training loss only
    kind: str = field(default="seq2seq")


@dataclass
class RNNSeq2SeqConfig(ConfigMixin):
    """Bahdanau/Luong et al. 2015: a bidirectional LSTM encoder, an LSTM decoder with attention and input feeding.

    The encoder runs d_hidden // 2 units per direction, so its states [→h; ←h] have d_hidden like the
    decoder's (Luong's "dot" score needs equal sizes). ``attention``: additive | general | dot.
    ``tie_embeddings`` shares the embedding with the output projection (needs d_embed = d_hidden).
    """

    vocab_size: int
    d_embed: int = 256
    d_hidden: int = 256
    n_encoder_layers: int = 2
    n_decoder_layers: int = 2
    attention: str = "additive"
    input_feeding: bool = True
    dropout: float = 0.2
    pad_id: int | None = 0
    bos_id: int | None = 1
    eos_id: int | None = 2
    label_smoothing: float = 0.0  # training loss only
    max_positions: int = 512  # no position table: only a cap on source and generated lengths
    tie_embeddings: bool = True
    kind: str = field(default="rnn-seq2seq")

    def validate(self, source: str = "config") -> None:
        if self.attention not in ("additive", "general", "dot"):
            raise LmforgeError(f"{source}: attention must be additive, general or dot, got {self.attention!r}")
        if self.d_hidden % 2:
            raise LmforgeError(f"{source}: d_hidden={self.d_hidden} must be even (two encoder directions)")
        if self.tie_embeddings and self.d_embed != self.d_hidden:
            raise LmforgeError(f"{source}: tie_embeddings needs d_embed ({self.d_embed}) = d_hidden ({self.d_hidden})")
        if min(self.n_encoder_layers, self.n_decoder_layers) < 1:
            raise LmforgeError(f"{source}: n_encoder_layers and n_decoder_layers must be >= 1")


Config = EncoderConfig | DecoderConfig | Seq2SeqConfig | RNNSeq2SeqConfig
# The configs defined in their model's file (BiLMConfig, CNNConfig, GridCaptionerConfig, DualEncoderConfig) add
# themselves when lmforge.models is imported, which lmforge.models.registry always does.
CONFIG_CLASSES: dict[str, type] = {"encoder": EncoderConfig, "decoder": DecoderConfig, "seq2seq": Seq2SeqConfig,
                                   "rnn-seq2seq": RNNSeq2SeqConfig}

PRESETS: dict[str, Config] = {
    # Devlin et al. Table/§3: BERT-base L=12, H=768, A=12 (110M); BERT-large L=24, H=1024, A=16 (340M).
    "bert-base": EncoderConfig(vocab_size=30522, d_model=768, n_layers=12, n_heads=12, d_ff=3072),
    "bert-large": EncoderConfig(vocab_size=30522, d_model=1024, n_layers=24, n_heads=16, d_ff=4096),
    "minilm-l6": EncoderConfig(vocab_size=30522, d_model=384, n_layers=6, n_heads=12, d_ff=1536),
    # Radford et al. 2019, the smallest GPT-2 (124M with the tied head).
    "gpt2": DecoderConfig(vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
                          bos_id=50256, eos_id=50256),
    # Vaswani et al. Table 3, the base model (d_model 512, 6+6 layers, 8 heads, d_ff 2048, dropout 0.1).
    "transformer-base": Seq2SeqConfig(vocab_size=37000),
    # Tiny ones for tests and quick experiments.
    "bert-tiny": EncoderConfig(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_positions=128),
    "gpt-tiny": DecoderConfig(vocab_size=1000, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_positions=128),
    "seq2seq-tiny": Seq2SeqConfig(vocab_size=1000, d_model=64, n_encoder_layers=2, n_decoder_layers=2,
                                  n_heads=4, d_ff=128, max_positions=128),
    "rnn-seq2seq-tiny": RNNSeq2SeqConfig(vocab_size=1000, d_embed=64, d_hidden=64, n_encoder_layers=1,
                                         n_decoder_layers=1, max_positions=128),
    # The size of configs/rnn-seq2seq-mini.yaml, about as many parameters as seq2seq-mini's Transformer.
    "rnn-seq2seq-mini": RNNSeq2SeqConfig(vocab_size=8000, d_embed=352, d_hidden=352, n_encoder_layers=2,
                                         n_decoder_layers=2, max_positions=256),
}


def get_preset(name: str, **overrides: Any) -> Config:
    """A fresh copy of a preset, with fields replaced: ``get_preset("bert-tiny", vocab_size=500)``."""
    if name not in PRESETS:
        raise LmforgeError(f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    base = PRESETS[name]
    fields = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise LmforgeError(f"preset {name!r}: unknown field(s) {', '.join(unknown)}")
    config = dataclasses.replace(base, **overrides)
    config.validate(f"preset {name!r}")
    return config


def config_from_dict(d: dict[str, Any], source: str = "config") -> Config:
    """Build the config class named by ``d["kind"]``."""
    kind = d.get("kind")
    if kind not in CONFIG_CLASSES:
        raise LmforgeError(f"{source}: 'kind' must be one of {', '.join(CONFIG_CLASSES)}, got {kind!r}")
    return CONFIG_CLASSES[kind].from_dict(d, source)


def load_config(path: str | os.PathLike) -> Config:
    """Read any lmforge ``config.json`` (or the one inside a directory)."""
    p = config_path(path)
    return config_from_dict(read_json(p), str(p))


# -- small file helpers used by the model I/O too ---------------------------------------------------
def config_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file; a missing file, bad bytes or bad JSON is one line naming the file."""
    if not path.exists():
        raise LmforgeError(f"{path}: no such file")
    try:
        data = json.loads(read_text_utf8(path, "JSON file"))
    except json.JSONDecodeError as err:
        raise LmforgeError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise LmforgeError(f"{path}: expected a JSON object")
    return data
