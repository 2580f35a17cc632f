"""Pretraining from a recipe: tokenizer → corpus shards → model → trainer → a loadable model directory.

A recipe is a YAML file with four sections (see ``configs/``)::

    tokenizer: {kind: wordpiece, vocab_size: 8192}        # trained on data.files; or {path: DIR}
    data:      {objective: mlm+nsp, files: [shakespeare], seq_len: 128}
    model:     {preset: bert-tiny, d_model: 256, n_layers: 4}
    train:     {lr: 5.0e-4, max_steps: 2000, batch_size: 32}

Everything lands in the run directory ``out``: ``tokenizer/``, ``corpus/``, ``config.yaml``,
``checkpoints/``, ``log.jsonl``, ``loss.png`` and, at the end, ``model/`` (config.json, model.safetensors,
tokenizer.json: ``lmforge.load(out / "model")``), and ``lmforge-output.json``, the list of the files the run
wrote (``lmforge.outputs``: a folder holding anything else is refused). Running the same command again resumes
the run; one run at a time holds ``out`` (``lmforge.lock``), and a rerun whose data, tokenizer or model section differs
from the run's ``config.yaml`` is refused before anything is prepared (``pretrain_args.PRETRAIN``: its fixed
sections and may-change keys).
In ``data.files``, ``shakespeare`` stands for the 42 works and ``bible-en-es`` for the training verse pairs,
both fetched by ``lmforge.data.sources``.

Continued pretraining (domain-adaptive pretraining, Gururangan et al. 2020): ``model: {init_from: DIR}``
starts from the weights of DIR (an lmforge model directory or a Hugging Face BERT / GPT-2 folder) and
tokenizes with DIR's tokenizer as it is; see ``configs/bert-dapt.yaml`` and docs/pretraining.md.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from lmforge.data import sources
from lmforge.data.collate import CausalLMSource, MaskedLMSource, Seq2SeqSource, SpecialIds
from lmforge.data.corpus import MANIFEST, TokenShard, prepare_corpus, tokenizer_fingerprint
from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8, write_text_atomic
from lmforge.outputs import claim_output
from lmforge.schema import plain
from lmforge.workflows.pretrain_args import DEFAULT_PRESETS, PRETRAIN, DataSection, TokenizerSection

ARCHITECTURES = {"clm": "Decoder", "mlm": "EncoderForPreTraining", "mlm+nsp": "EncoderForPreTraining",
                 "seq2seq": "Seq2Seq",  # or RNNSeq2Seq: the preset's kind decides (build_pretraining_model)
                 "bilm": "BiLM"}  # ELMo (models/elmo.py): forward + backward LM on the clm windows
NAMED_CORPORA = {
    "shakespeare": sources.shakespeare_files,
    "bible-en-es": lambda: [sources.bible_pairs()["train"]],  # TSV english<TAB>spanish, test books held out
}


def expand_files(names: list[str]) -> list[Path]:
    """Paths of the data files, with named corpora ('shakespeare') fetched and expanded."""
    paths: list[Path] = []
    for name in names:
        if name in NAMED_CORPORA:
            paths.extend(NAMED_CORPORA[name]())
        else:
            paths.append(Path(name))
    return paths


# -- tokenizer ----------------------------------------------------------------------------------------------
def get_tokenizer(section: TokenizerSection, files: list[Path], out: Path, objective: str, errors: str = "strict"):
    """The run's tokenizer: reuse out/tokenizer, else load ``path``, else train ``kind`` on the data files."""
    from lmforge.tokenizers import KINDS, load_tokenizer
    from lmforge.tokenizers.train import read_corpus

    saved = out / "tokenizer"
    if (saved / "tokenizer.json").is_file():  # a resumed run's: saved with its manifest, verified
        return load_tokenizer(saved, manifest_required=True)
    if section.path is not None:
        tokenizer = load_tokenizer(section.path)
    elif not files:
        raise LmforgeError("tokenizer.path: with data.prepared and no data.files, give the tokenizer the shards "
                           "were prepared with")
    else:
        kind = section.kind or ("wordpiece" if objective.startswith("mlm") else "byte-bpe")
        section = dataclasses.replace(section, kind=kind)
        texts = read_corpus(files, errors) if objective != "seq2seq" else _pair_texts(files)
        print(f"training a {kind} tokenizer ({section.vocab_size} tokens)", file=sys.stderr)
        tokenizer = KINDS[kind].train(texts, section.vocab_size, section.min_frequency, progress=True,
                                      workers=section.workers or 1, **section.options())
    tokenizer.save(saved)
    return tokenizer


# -- corpus ------------------------------------------------------------------------------------------------
def get_corpus(data: DataSection, files: list[Path], tokenizer, out: Path) -> Path:
    """Prepare out/corpus once (reused on resume, rebuilt if the tokenizer changed), or use data.prepared."""
    if data.prepared:
        prepared = Path(data.prepared)
        if not (prepared / MANIFEST).is_file():
            raise LmforgeError(f"data.prepared: {prepared} holds no {MANIFEST} (make it with lmforge data prepare)")
        if not _prepared(prepared, tokenizer):
            raise LmforgeError(f"data.prepared: {prepared} was tokenized with another tokenizer than this run's; "
                               "set tokenizer.path to the directory given to lmforge data prepare --tokenizer")
        return prepared
    corpus = out / "corpus"
    if _prepared(corpus, tokenizer):
        return corpus
    prepare_corpus(files, tokenizer, corpus, data.val_fraction, data.doc_separator, data.field, data.workers,
                   errors=data.errors)
    return corpus


def _prepared(corpus: Path, tokenizer) -> bool:
    import json

    manifest = corpus / MANIFEST
    return manifest.is_file() and json.loads(manifest.read_text()).get("tokenizer_hash") == tokenizer_fingerprint(
        tokenizer)


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """source<TAB>target lines of a TSV file; a line without a tab names the file and line."""
    pairs = []
    text = io.StringIO(read_text_utf8(path, "source<TAB>target file"), newline="")
    for number, row in enumerate(csv.reader(text, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2:
            raise LmforgeError(f"{path}:{number}: expected source<TAB>target, found {len(row)} fields")
        if row[0].strip() and row[1].strip():
            pairs.append((row[0].strip(), row[1].strip()))
    if not pairs:
        raise LmforgeError(f"{path}: no source/target pairs")
    return pairs


def _pair_texts(files: list[Path]) -> list[str]:
    return [side for path in files for pair in read_pairs(path) for side in pair]


def get_pair_corpora(data: DataSection, files: list[Path], tokenizer, out: Path) -> tuple[Path, Path]:
    """Two aligned corpora (source, target), one line per pair; validation = the same tail lines of both."""
    roots = out / "corpus-source", out / "corpus-target"
    if all(_prepared(r, tokenizer) for r in roots):
        return roots
    pairs = [p for path in files for p in read_pairs(path)]
    for side, root in enumerate(roots):
        root.mkdir(parents=True, exist_ok=True)
        text = root / "lines.txt"
        write_text_atomic(text, "\n".join(pair[side] for pair in pairs) + "\n")
        prepare_corpus([text], tokenizer, root, data.val_fraction, workers=data.workers, line_breaks=False)
    return roots


# -- model and data source ------------------------------------------------------------------------------------
def build_pretraining_model(section: dict[str, Any], tokenizer, objective: str):
    """A fresh model for the objective, or, with ``init_from``, the checkpoint's weights under its heads."""
    from lmforge.models import build_model, get_preset

    if section.get("init_from"):
        return _only_mlm(model_from_checkpoint(section, objective), objective)
    section = {k: v for k, v in section.items() if k != "init_from"}
    preset = section.pop("preset", None) or DEFAULT_PRESETS.get(objective, "bert-tiny")
    ids = {"vocab_size": tokenizer.vocab_size}
    for name in ("pad_id", "bos_id", "eos_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            ids[name] = value
    config = get_preset(preset, **{**_known(preset, ids), **section})
    architecture = ARCHITECTURES[objective]
    if objective == "seq2seq":  # a Transformer (seq2seq-*) or an RNN with attention (rnn-seq2seq-*): the preset says
        if config.kind not in ("seq2seq", "rnn-seq2seq"):
            raise LmforgeError(f"model.preset: {preset!r} is not an encoder-decoder (seq2seq-* or rnn-seq2seq-*)")
        architecture = None  # the default architecture of the config's kind
    return _only_mlm(build_model(config, architecture), objective)


def _only_mlm(model, objective: str):
    if objective == "mlm":  # no next-sentence task: the pooler and NSP head get no gradient (DDP would refuse them)
        for module in (model.encoder.pooler, model.nsp):
            module.requires_grad_(False)
    return model


# -- continued pretraining: model.init_from ------------------------------------------------------------------
INIT_OBJECTIVES = {"clm": "a decoder (GPT)", "mlm": "a BERT-style encoder", "mlm+nsp": "a BERT-style encoder"}
INIT_KINDS = {"clm": ("decoder", "gpt2", "llama"), "mlm": ("encoder", "bert"), "mlm+nsp": ("encoder", "bert")}


def checkpoint_dir(section: dict[str, Any], objective: str) -> Path:
    """``model.init_from`` checked: a directory, with a tokenizer, for an objective that can continue."""
    from lmforge.interop.directories import has_tokenizer

    if not section.get("init_from"):
        raise LmforgeError("model.init_from: give the checkpoint directory (model.init_from=DIR)")
    folder = Path(str(section["init_from"]))
    if objective not in INIT_OBJECTIVES:
        raise LmforgeError(f"model.init_from: continued pretraining supports data.objective "
                           f"{' | '.join(INIT_OBJECTIVES)}, not {objective!r}")
    if not folder.is_dir():
        raise LmforgeError(f"model.init_from: {folder}: no such directory")
    if not has_tokenizer(folder):
        raise LmforgeError(f"model.init_from: {folder} has no tokenizer (tokenizer.json or vocab.txt); "
                           "continued pretraining keeps the checkpoint's vocabulary, so it needs one")
    if (folder / "config.json").is_file():  # the wrong kind is named before any text is tokenized
        from lmforge.models.config import read_json

        config = read_json(folder / "config.json")
        kind = config.get("kind") or config.get("model_type")
        if kind is not None and kind not in INIT_KINDS[objective]:
            raise _wrong_kind(folder, f"{kind} model", objective)
    return folder


def _wrong_kind(folder: Path, what: str, objective: str) -> LmforgeError:
    return LmforgeError(f"model.init_from: {folder} holds a {what}, not {INIT_OBJECTIVES[objective]}; "
                        f"data.objective {objective} needs one")


def checkpoint_tokenizer(recipe: dict[str, Any], objective: str, out: Path):
    """The tokenizer of ``model.init_from``, used as it is (no training), saved into out/tokenizer."""
    from lmforge.tokenizers import load_tokenizer

    if plain(recipe["tokenizer"]) != plain(TokenizerSection()):
        raise LmforgeError("tokenizer: not used with model.init_from (the checkpoint's tokenizer is kept as it is)")
    tokenizer = load_tokenizer(checkpoint_dir(recipe["model"], objective))
    tokenizer.save(out / "tokenizer")
    return tokenizer


def model_from_checkpoint(section: dict[str, Any], objective: str):
    """The model of ``model.init_from`` ready for ``objective``; a missing MLM head is created fresh.

    clm: the checkpoint must be a decoder (GPT-2's LM head is its tied embedding matrix).
    mlm, mlm+nsp: an encoder; a bare one (MiniLM, a fine-tuned classifier's backbone) gets a fresh MLM head
    whose decoder is tied to the word embeddings, its bias zero (``EncoderForPreTraining.from_encoder``).
    """
    from lmforge.interop.directories import load
    from lmforge.models.decoder import Decoder
    from lmforge.models.encoder import Encoder, EncoderForPreTraining
    from lmforge.train.logs import info

    folder = checkpoint_dir(section, objective)
    base, _ = load(folder, tokenizer=False)
    kind = type(base).__name__
    check_sizes(section, base.config, folder)
    if objective == "clm":
        if not isinstance(base, Decoder):
            raise _wrong_kind(folder, kind, objective)
        return base.train()
    if isinstance(base, EncoderForPreTraining):
        return base.train()
    encoder = base if isinstance(base, Encoder) else getattr(base, "encoder", None)
    if not isinstance(encoder, Encoder):
        raise _wrong_kind(folder, kind, objective)
    info(f"{folder}: the checkpoint has no MLM head; starting a fresh one (transform + LayerNorm, decoder "
         "tied to the word embeddings, bias 0)")
    return EncoderForPreTraining.from_encoder(encoder).train()


def check_sizes(section: dict[str, Any], config, folder: Path) -> None:
    """Other ``model.*`` keys beside init_from may only repeat the checkpoint's values: it sets the sizes."""
    fields = config.to_dict()
    for key, value in section.items():
        if key == "init_from" or (value is None and key == "preset"):
            continue
        if key == "preset":
            raise LmforgeError("model.preset: not used with model.init_from (the checkpoint is the model)")
        if key not in fields:
            raise LmforgeError(f"model.{key}: unknown key for the {config.kind} in {folder}")
        if fields[key] != value:
            raise LmforgeError(f"model.{key}: {value!r} conflicts with the checkpoint {folder} "
                               f"({key} {fields[key]!r}); drop the key")


def _known(preset: str, values: dict[str, Any]) -> dict[str, Any]:
    from lmforge.models import get_preset

    fields = set(type(get_preset(preset)).__dataclass_fields__)
    return {k: v for k, v in values.items() if k in fields}


def build_source(data: DataSection, tokenizer, out: Path, files: list[Path], batch_size: int, seed: int):
    evals = {"n_eval_batches": data.eval_batches, "eval_batch_size": data.eval_batch_size, "seed": seed}
    if data.objective == "seq2seq":
        src, tgt = get_pair_corpora(data, files, tokenizer, out)
        bos = getattr(tokenizer, "bos_id", None)
        eos = getattr(tokenizer, "eos_id", None)
        return Seq2SeqSource(TokenShard.open(src), TokenShard.open(tgt), batch_size, data.seq_len,
                             bos_id=bos if bos is not None else tokenizer.cls_id,
                             eos_id=eos if eos is not None else tokenizer.sep_id, pad_id=tokenizer.pad_id,
                             eval_shard=TokenShard.open(src, "valid"),
                             eval_target_shard=TokenShard.open(tgt, "valid"), **evals)
    corpus = get_corpus(data, files, tokenizer, out)
    train, valid = TokenShard.open(corpus, "train", tokenizer), TokenShard.open(corpus, "valid", tokenizer)
    check_validation(valid, data, corpus)
    if data.objective in ("clm", "bilm"):  # the biLM reads the same windows in both directions
        return CausalLMSource(train, batch_size, data.seq_len, eval_shard=valid, **evals)
    special = SpecialIds.from_tokenizer(tokenizer, whole_word=data.whole_word)
    return MaskedLMSource(train, special, batch_size, data.seq_len, nsp=data.objective == "mlm+nsp",
                          probability=data.mlm_probability, eval_shard=valid, **evals)


def check_validation(valid: TokenShard, data: DataSection, corpus: Path) -> None:
    """An empty validation split is an error, or (``data.val_fraction=0``) a logged choice: evaluation is off.

    Never a silent evaluation on training data, whose loss would be reported as ``eval_loss``.
    """
    if valid.n_tokens:
        return
    if data.val_fraction > 0:
        raise LmforgeError(f"{corpus}: the validation split is empty (the corpus is one document of one line, too "
                           "little to hold out); give more text, or set data.val_fraction=0 to train without "
                           "evaluation")
    print("data.val_fraction=0: no validation split; evaluation is off", file=sys.stderr)


# -- the whole run ------------------------------------------------------------------------------------------
def check_model_fits(recipe: dict[str, Any], data: DataSection, tokenizer, model) -> None:
    """The tokenizer's ids fit the checkpoint's embeddings; the training windows fit the model's positions."""
    vocab = getattr(model.config, "vocab_size", None)
    if recipe["model"].get("init_from") and tokenizer.vocab_size > vocab:  # not the model's tokenizer
        raise LmforgeError(f"model.init_from: the tokenizer has {tokenizer.vocab_size} tokens but the model "
                           f"only {vocab} embeddings: tokenizer and model do not match")
    window = getattr(model.config, "max_positions", None)
    if window is not None and data.seq_len > window:
        raise LmforgeError(f"data.seq_len: {data.seq_len} is longer than model.max_positions {window}: lower "
                           f"data.seq_len or raise model.max_positions")


def pretrain(recipe: dict[str, Any], out: str | Path):
    """Run (or resume) a pretraining recipe into ``out``; returns (TrainResult, model directory).

    ``recipe``: sections as plain dicts (a YAML file's) or as the sections' dataclasses; every key is checked
    and completed by ``pretrain_args.PRETRAIN``, and the result recorded as ``out/config.yaml``.
    """
    from lmforge.models import save_pretrained
    from lmforge.train.distributed import detect
    from lmforge.train.trainer import Trainer, seed_everything

    out = Path(out)
    recipe = PRETRAIN.resolve(plain(recipe))
    tokenizer_section, model_section, data, config = (recipe[k] for k in ("tokenizer", "model", "data", "train"))
    claim = claim_output(out, "run", flag=None, inputs=[tokenizer_section.path, model_section.get("init_from"),
                                                        data.prepared])  # a refusal: before any work
    is_main = detect().is_main  # under torchrun only rank 0 writes (and records what it wrote)
    with claim if is_main else nullcontext():
        PRETRAIN.resume_changes(out / "config.yaml", recipe)  # before preparing anything
        files = expand_files(data.files)
        if model_section.get("init_from"):
            tokenizer = checkpoint_tokenizer(recipe, data.objective, out)
        else:
            tokenizer = get_tokenizer(tokenizer_section, files, out, data.objective, data.errors)
        source = build_source(data, tokenizer, out, files, config.batch_size, config.seed)
        seed_everything(config.seed)
        model = build_pretraining_model(model_section, tokenizer, data.objective)
        check_model_fits(recipe, data, tokenizer, model)
        resolved = {**recipe, "model": {**model_section, "resolved": model.config.to_dict()}}
        result = Trainer(model, source, config, out, recipe=resolved, tokenizer_dir=out / "tokenizer",
                         schema=PRETRAIN).fit()
        model_dir = out / "model"
        if is_main:
            save_pretrained(model, model_dir, tokenizer)
    return result, model_dir
