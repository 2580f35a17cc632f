"""Import and export of Hugging Face ``tokenizer.json`` files, for all three kinds.

Only the parts that define the tokenization are read: the model (vocabulary, merges), the
normalizer and pre-tokenizer options, the added special tokens and the post-processor template.
Truncation and padding baked into a file (all-MiniLM-L6-v2 pads everything to 128) are ignored:
they are options of ``encode``, not of the tokenizer.

    >>> tok = from_huggingface(json.loads(Path("tokenizer.json").read_text()))   # doctest: +SKIP
    >>> to_huggingface(tok)["model"]["type"]                                      # doctest: +SKIP
    'WordPiece'
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.tokenizers.base import Tokenizer
from lmforge.tokenizers.bpe import BPETokenizer, merge_once
from lmforge.tokenizers.byte_bpe import ByteLevelBPETokenizer
from lmforge.tokenizers.normalize import BertNormalizer
from lmforge.tokenizers.pretokenize import BERT_SPLIT, GPT4_SPLIT
from lmforge.tokenizers.template import parse_template
from lmforge.tokenizers.wordpiece import WordPieceTokenizer

# Common names of special tokens, to guess their roles in a foreign file.
ROLE_NAMES = {
    "pad": ("[PAD]", "<pad>", "<|pad|>"), "unk": ("[UNK]", "<unk>"), "cls": ("[CLS]", "<cls>"),
    "sep": ("[SEP]", "<sep>"), "mask": ("[MASK]", "<mask>"),
    "bos": ("<s>", "<|endoftext|>", "[BOS]"), "eos": ("</s>", "<|endoftext|>", "[EOS]"),
}


def _tokens_by_id(vocab: dict[str, int], added: list[dict[str, Any]], source: str) -> list[str]:
    by_id = {i: t for t, i in vocab.items()}
    for entry in added:
        by_id[entry["id"]] = entry["content"]
    size = max(by_id, default=-1) + 1
    if len(by_id) != size:
        gap = next(i for i in range(size) if i not in by_id)
        raise LmforgeError(f"{source}: vocabulary ids are not contiguous (no token has id {gap})")
    return [by_id[i] for i in range(size)]


def _template(processor: dict[str, Any] | None) -> dict[str, list[str]] | None:
    """Hugging Face ``TemplateProcessing`` -> our ``{"single": [...], "pair": [...]}``."""
    if not processor or processor.get("type") != "TemplateProcessing":
        return None
    out = {}
    for key in ("single", "pair"):
        items = []
        for item in processor[key]:
            kind, body = next(iter(item.items()))
            name = f"${body['id']}" if kind == "Sequence" else body["id"]
            items.append(name if body.get("type_id", 0) == 0 else f"{name}:{body['type_id']}")
        out[key] = items
    return out


def _find(component: dict[str, Any] | None, type_name: str) -> dict[str, Any] | None:
    """The first component of ``type_name`` in a (possibly nested) ``Sequence``."""
    if not component:
        return None
    if component.get("type") == type_name:
        return component
    for part in component.get("pretokenizers", component.get("normalizers", [])) or []:
        found = _find(part, type_name)
        if found:
            return found
    return None


def from_huggingface(data: dict[str, Any], source: str = "tokenizer.json") -> Tokenizer:
    """Build the lmforge tokenizer equivalent to a Hugging Face ``tokenizer.json`` (parsed).

    Special tokens written in text are split out by default, as ``tokenizers`` does with the same file.
    """
    tok = _from_huggingface(data, source)
    tok.specials_in_text = True
    return tok


def _from_huggingface(data: dict[str, Any], source: str) -> Tokenizer:
    try:
        model = data["model"]
        added = data.get("added_tokens") or []
        tokens = _tokens_by_id(model["vocab"], added, source)
        specials = [e["content"] for e in sorted(added, key=lambda e: e["id"]) if e.get("special", True)]
        roles = {role: next(n for n in names if n in specials)
                 for role, names in ROLE_NAMES.items() if any(n in specials for n in names)}
        base = {"special_tokens": specials, "roles": roles, "template": _template(data.get("post_processor"))}
        if model["type"] == "WordPiece":
            norm = _find(data.get("normalizer"), "BertNormalizer") or {}
            normalizer = BertNormalizer(norm.get("clean_text", True), norm.get("handle_chinese_chars", True),
                                        norm.get("strip_accents"), norm.get("lowercase", True))
            return WordPieceTokenizer(tokens, prefix=model.get("continuing_subword_prefix") or "##",
                                      max_input_chars_per_word=model.get("max_input_chars_per_word", 100),
                                      normalizer=normalizer, **base)
        if model["type"] != "BPE":
            raise LmforgeError(f"{source}: model type {model['type']!r} is not supported "
                               "(BPE and WordPiece are)")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        pre = data.get("pre_tokenizer")
        if _find(pre, "ByteLevel"):
            split = _find(pre, "Split")
            pattern = "gpt4" if split and split.get("pattern", {}).get("Regex") == GPT4_SPLIT else "gpt2"
            return ByteLevelBPETokenizer(tokens, merges, pattern=pattern, **base)
        eow = model.get("end_of_word_suffix") or None
        pattern = "whitespace"
        if _find(pre, "WhitespaceSplit"):
            pattern = r"\S+"
        elif _find(pre, "BertPreTokenizer"):
            pattern = BERT_SPLIT.pattern
        return BPETokenizer(tokens, merges, end_of_word=eow, glued=eow is not None, pattern=pattern, **base)
    except KeyError as err:
        raise LmforgeError(f"{source}: missing field {err.args[0]!r}") from None
    except LmforgeError as err:
        if str(err).startswith(source):
            raise
        raise LmforgeError(f"{source}: {err}") from None
    except (TypeError, ValueError, AttributeError, StopIteration) as err:
        raise LmforgeError(f"{source}: malformed Hugging Face tokenizer ({err})") from None


def _added_tokens(tok: Tokenizer) -> list[dict[str, Any]]:
    return [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True} for t, i in sorted(tok.special_tokens.items(), key=lambda x: x[1])]


def _post_processor(tok: Tokenizer) -> dict[str, Any] | None:
    if tok.num_special_tokens_to_add(pair=True) == 0:
        return None

    def items(names: list[str]) -> list[dict[str, Any]]:
        return [{"Sequence": {"id": name[1:], "type_id": t}} if name.startswith("$")
                else {"SpecialToken": {"id": name, "type_id": t}} for name, t in parse_template(tuple(names))]

    used = {n for key in ("single", "pair") for n, _ in parse_template(tuple(tok.template[key]))}
    specials = {n: {"id": n, "ids": [tok.vocab[n]], "tokens": [n]} for n in used if not n.startswith("$")}
    return {"type": "TemplateProcessing", "single": items(tok.template["single"]),
            "pair": items(tok.template["pair"]), "special_tokens": specials}


def to_huggingface(tok: Tokenizer) -> dict[str, Any]:
    """The Hugging Face ``tokenizer.json`` content for ``tok`` (WordPiece, byte-level BPE, BPE)."""
    out: dict[str, Any] = {"version": "1.0", "truncation": None, "padding": None,
                           "added_tokens": _added_tokens(tok), "normalizer": None}
    plain_vocab = {t: i for i, t in enumerate(tok.id_to_token)}
    if isinstance(tok, WordPieceTokenizer):
        norm = tok.normalizer
        out["normalizer"] = {"type": "BertNormalizer", **norm.to_dict()}
        out["pre_tokenizer"] = {"type": "BertPreTokenizer"}
        out["decoder"] = {"type": "WordPiece", "prefix": tok.prefix, "cleanup": tok.cleanup}
        out["model"] = {"type": "WordPiece", "unk_token": tok.roles.get("unk", "[UNK]"),
                        "continuing_subword_prefix": tok.prefix,
                        "max_input_chars_per_word": tok.max_input_chars_per_word, "vocab": plain_vocab}
    elif isinstance(tok, BPETokenizer):
        bpe = {"type": "BPE", "dropout": None, "unk_token": tok.roles.get("unk"), "continuing_subword_prefix": None,
               "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
               "vocab": plain_vocab, "merges": [list(m) for m in tok.merges]}
        if isinstance(tok, ByteLevelBPETokenizer):
            byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
            if tok.pattern_name == "gpt4":
                split = {"type": "Split", "pattern": {"Regex": GPT4_SPLIT}, "behavior": "Isolated",
                         "invert": False}
                out["pre_tokenizer"] = {"type": "Sequence",
                                        "pretokenizers": [split, {**byte_level, "use_regex": False}]}
            else:
                out["pre_tokenizer"] = byte_level
            out["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                              "use_regex": True}
        else:
            out["pre_tokenizer"] = {"type": {"whitespace": "Whitespace", r"\S+": "WhitespaceSplit"}.get(
                tok.pattern_name, "BertPreTokenizer" if tok.pattern_name == BERT_SPLIT.pattern else "Whitespace")}
            out["decoder"] = {"type": "BPEDecoder", "suffix": tok.end_of_word or ""}
            bpe["end_of_word_suffix"] = tok.end_of_word
            if not tok.glued:
                bpe.update(_suffix_form(tok))
        out["model"] = bpe
    else:
        raise LmforgeError(f"cannot export a {type(tok).__name__} to Hugging Face")
    out["post_processor"] = _post_processor(tok)
    return out


def _ends_open(tok: BPETokenizer, token: str) -> bool:
    """Whether ``token``, ending a word, is ever formed apart from ``</w>`` (before being glued to it).

    Replays the encoding of the word ``token`` merge by merge and looks for ``[token, </w>]``.
    """
    ids, spans = tok._symbols(token)
    target = [tok.vocab[token], tok.vocab[tok.end_of_word]]  # type: ignore[index]
    while ids != target and len(ids) > 1 and merge_once(ids, spans, tok.ranks):
        pass
    return ids == target


def _suffix_form(tok: BPETokenizer) -> dict[str, Any]:
    """Sennrich BPE in Hugging Face's form, where the marker is glued to each word's last character.

    Our words end with a separate ``</w>`` symbol; Hugging Face starts from ``c</w>``. The same
    segmentations follow if every ``c</w>`` exists, a merge ``(x, </w>)`` is dropped (already
    glued), and a merge ``(a, b)`` that at the end of a word happens while ``b`` still stands apart
    from ``</w>`` (``b`` forms apart, and is glued later or never) also applies there, as
    ``(a, b</w>)``, at the same rank.
    """
    eow = tok.end_of_word
    if not eow:
        return {}
    glued_at = {a: r for r, (a, b) in enumerate(tok.merges) if b == eow}
    vocab = dict(tok.vocab)
    merges: list[list[str]] = []
    seen: set[tuple[str, str]] = set()
    open_cache: dict[str, bool] = {}

    def add(a: str, b: str) -> None:
        for t in (a, b, a + b):
            vocab.setdefault(t, len(vocab))
        if (a, b) not in seen:
            seen.add((a, b))
            merges.append([a, b])

    for r, (a, b) in enumerate(tok.merges):
        if b == eow:
            continue
        add(a, b)
        if b.endswith(eow) or glued_at.get(b, len(tok.merges)) < r:
            continue
        if b not in open_cache:
            open_cache[b] = _ends_open(tok, b)
        if open_cache[b]:
            add(a, b + eow)
    for t in list(tok.vocab):
        if len(t) == 1 and t not in tok.special_tokens:
            vocab.setdefault(t + eow, len(vocab))
    return {"end_of_word_suffix": eow, "vocab": vocab, "merges": merges}


def save_huggingface(tok: Tokenizer, directory: str | Path) -> Path:
    """Write ``tok`` as a Hugging Face ``tokenizer.json`` in ``directory``."""
    return Tokenizer.save_files(directory, {"tokenizer.json": json.dumps(to_huggingface(tok), ensure_ascii=False,
                                                                         indent=1) + "\n"})
