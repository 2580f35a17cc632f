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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8, write_text_atomic
from lmforge.schema import build, check_section, setting

# Keys a model directory's config.json may hold beside the architecture's fields (which head sits on
# top, the label names of a fine-tuned model, ...). ``from_dict`` accepts and ignores them.
MODEL_KEYS = frozenset({"architecture", "num_labels", "labels", "task", "lmforge_version", "label_names",
                        "tokenizer", "quantized"})  # tokenizer: a checkpoint's path to its run's tokenizer directory;
# quantized: {layer: "int8" | "int4"}, the layers saved as nn.quant.QuantizedLinear (convert --quantize)


class ConfigMixin:
    """to_dict / from_dict / save / load shared by every model config; checks by the settings schema."""

    kind: str

    def __post_init__(self) -> None:
        """A config built in Python is checked like one read from a file: every field, then the rules across."""
        check_section(type(self), self.to_dict(), "")
        self.validate("")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config"):
        """A config from a ``config.json`` object: every value checked by its field (type, range) before any
        tensor is built; errors name the file and the field.

        >>> EncoderConfig.from_dict({"vocab_size": 10, "d_model": "64"}, "config.json")
        Traceback (most recent call last):
        ...
        lmforge.errors.LmforgeError: config.json: d_model: expected an integer, got '64'
        """
        kind = d.get("kind", cls.kind)
        if kind != cls.kind:
            raise LmforgeError(f"{source}: kind is {kind!r}, expected {cls.kind!r}")
        values = {k: v for k, v in d.items() if k not in MODEL_KEYS}
        try:
            return build(cls, values, "")
        except LmforgeError as err:
            raise LmforgeError(f"{source}: {err}") from None

    def save(self, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
        """Write ``directory/config.json`` atomically (temporary file, then rename); return its path."""
        path = Path(directory) / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        from lmforge.manifest import VERSION

        data = {**self.to_dict(), "lmforge_version": VERSION, **(extra or {})}  # the marker: a manifest follows
        write_text_atomic(path, json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike):
        """Read a ``config.json`` (or the one inside a directory)."""
        return cls.from_dict(read_json(config_path(path)), source=str(config_path(path)))

    def validate(self, source: str = "config") -> None:
        """Rules across fields (each field's own type and range are the schema's): heads divide the width."""
        d_model, n_heads = getattr(self, "d_model", 1), getattr(self, "n_heads", 1)
        if d_model % n_heads:
            raise LmforgeError(f"{where(source)}d_model={d_model} is not divisible by n_heads={n_heads}")


def where(source: str) -> str:
    """The prefix of an error message: ``config.json: `` (nothing when the schema already names the key)."""
    return f"{source}: " if source else ""


# Field declarations every architecture shares (help and range written once).
def size(default: Any = dataclasses.MISSING, help: str = "a width or count", **extra: Any) -> Any:
    return setting(default, help, min=1, **extra)


def count(default: int, help: str) -> Any:
    return setting(default, help, min=0)


def rate(default: float, help: str = "dropout probability") -> Any:
    return setting(default, help, min=0, below=1)


def token_id(default: int | None, help: str) -> Any:
    return setting(default, help, min=0)


def epsilon(default: float) -> Any:
    return setting(default, "the normalisation's epsilon", above=0)


def kind(name: str) -> Any:
    return dataclasses.field(default=name, metadata={"help": "the architecture (config.json's kind)", "flag": False})


VOCAB = "vocabulary size V (set by the tokenizer)"
Activation = Literal["relu", "gelu", "gelu_tanh"]


@dataclass
class EncoderConfig(ConfigMixin):
    """BERT: token + position + segment embeddings, post-LN GELU layers, a tanh pooler on [CLS]."""

    vocab_size: int = size(help=VOCAB)
    d_model: int = size(256, "model width d_model")
    n_layers: int = count(4, "Transformer layers")
    n_heads: int = size(4, "attention heads (divide d_model)")
    d_ff: int = size(1024, "feed-forward width")
    max_positions: int = size(512, "positions the learned table holds (longest input)")
    type_vocab_size: int = size(2, "segment embeddings (sentence A / B)")
    dropout: float = rate(0.1)
    attention_dropout: float = rate(0.1, "dropout on the attention weights")
    activation: Activation = setting("gelu", "feed-forward non-linearity: relu | gelu | gelu_tanh")
    eps: float = epsilon(1e-12)
    pad_id: int | None = token_id(0, "padding token id")
    kind: str = kind("encoder")


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

    vocab_size: int = size(help=VOCAB)
    d_model: int = size(768, "model width d_model")
    n_layers: int = count(12, "Transformer layers")
    n_heads: int = size(12, "attention heads (divide d_model)")
    d_ff: int = size(3072, "feed-forward width (per half of SwiGLU's gate and value)")
    max_positions: int = size(1024, "context length: positions a window may hold")
    dropout: float = rate(0.1)
    attention_dropout: float = rate(0.1, "dropout on the attention weights")
    activation: Literal["gelu_tanh", "relu", "gelu", "relu2", "swiglu"] = setting(
        "gelu_tanh", "feed-forward non-linearity: gelu_tanh (GPT-2) | relu | gelu | relu2 | swiglu")
    eps: float = epsilon(1e-5)
    tie_embeddings: bool = setting(True, "the LM head is the token embedding matrix")
    pad_id: int | None = token_id(None, "padding token id")
    bos_id: int | None = token_id(None, "beginning-of-text token id")
    eos_id: int | None = token_id(None, "end-of-text token id (generation stops there)")
    norm: Literal["layernorm", "rmsnorm"] = setting("layernorm", "layernorm | rmsnorm, every norm of the model")
    positions: Literal["learned", "rotary"] = setting("learned", "learned table added to E[x] | rotary q and k")
    qk_norm: bool = setting(False, "RMSNorm of each head's queries and keys")
    bias: bool = setting(True, "biases on projections and norms")
    logit_softcap: float | None = setting(None, "c: logits = c tanh(logits / c) (null: off)", above=0)
    zero_init_projections: bool = setting(False, "output projections (and an untied head) start at 0")
    n_kv_heads: int | None = size(None, "key/value heads shared by groups of query heads (null: n_heads; "
                                  "grouped-query attention)")
    rope_base: float = setting(10000.0, "rotary positions: the base of the angles pos * base^(-2j/d)", above=0)
    vocab_multiple: int = size(1, "embedding rows padded to a multiple of this (64: faster matrix products, as "
                                  "nanoGPT); the logits keep vocab_size columns")
    kind: str = kind("decoder")

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise LmforgeError(f"{where(source)}n_heads={self.n_heads} is not divisible by n_kv_heads="
                               f"{self.n_kv_heads}")
        d_head = self.d_model // self.n_heads
        if self.positions == "rotary" and d_head % 2:
            raise LmforgeError(f"{where(source)}rotary positions need an even head width, got {d_head}")

    @property
    def embedding_rows(self) -> int:
        """vocab_size rounded up to a multiple of vocab_multiple: 50257 -> 50304 with 64.

        >>> DecoderConfig(vocab_size=50257, vocab_multiple=64).embedding_rows
        50304
        """
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

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

    vocab_size: int = size(help=VOCAB)
    d_model: int = size(512, "model width d_model")
    n_encoder_layers: int = count(6, "encoder layers")
    n_decoder_layers: int = count(6, "decoder layers")
    n_heads: int = size(8, "attention heads (divide d_model)")
    d_ff: int = size(2048, "feed-forward width")
    max_positions: int = size(512, "longest source or target")
    dropout: float = rate(0.1)
    activation: Activation = setting("relu", "feed-forward non-linearity: relu | gelu | gelu_tanh")
    eps: float = epsilon(1e-5)
    pad_id: int | None = token_id(0, "padding token id")
    bos_id: int | None = token_id(1, "first decoder token")
    eos_id: int | None = token_id(2, "end of a target")
    attention_dropout: float = rate(0.0, "dropout on the attention weights (the paper: none)")
    label_smoothing: float = rate(0.0, "ε_ls of the training loss (the paper: 0.1, §5.4)")
    kind: str = kind("seq2seq")


@dataclass
class RNNSeq2SeqConfig(ConfigMixin):
    """Bahdanau/Luong et al. 2015: a bidirectional LSTM encoder, an LSTM decoder with attention and input feeding.

    The encoder runs d_hidden // 2 units per direction, so its states [→h; ←h] have d_hidden like the
    decoder's (Luong's "dot" score needs equal sizes). ``attention``: additive | general | dot.
    ``tie_embeddings`` shares the embedding with the output projection (needs d_embed = d_hidden).
    """

    vocab_size: int = size(help=VOCAB)
    d_embed: int = size(256, "embedding width")
    d_hidden: int = size(256, "LSTM state width (even: two encoder directions)")
    n_encoder_layers: int = size(2, "encoder LSTM layers")
    n_decoder_layers: int = size(2, "decoder LSTM layers")
    attention: Literal["additive", "general", "dot"] = setting("additive", "additive (Bahdanau) | general | dot")
    input_feeding: bool = setting(True, "feed the last attentional state to the next step (Luong)")
    dropout: float = rate(0.2)
    pad_id: int | None = token_id(0, "padding token id")
    bos_id: int | None = token_id(1, "first decoder token")
    eos_id: int | None = token_id(2, "end of a target")
    label_smoothing: float = rate(0.0, "ε_ls of the training loss")
    max_positions: int = size(512, "a cap on source and generated lengths (no position table)")
    tie_embeddings: bool = setting(True, "share the embedding with the output projection (d_embed = d_hidden)")
    kind: str = kind("rnn-seq2seq")

    def validate(self, source: str = "config") -> None:
        if self.d_hidden % 2:
            raise LmforgeError(f"{where(source)}d_hidden={self.d_hidden} must be even (two encoder directions)")
        if self.tie_embeddings and self.d_embed != self.d_hidden:
            raise LmforgeError(f"{where(source)}tie_embeddings needs d_embed ({self.d_embed}) = d_hidden "
                               f"({self.d_hidden})")


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
    try:
        return build(type(base), {**base.to_dict(), **overrides}, "")
    except LmforgeError as err:
        raise LmforgeError(f"preset {name!r}: {err}") from None


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
