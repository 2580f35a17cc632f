"""Tokenizers: Sennrich BPE, GPT-2 byte-level BPE and BERT WordPiece under one interface.

    >>> from lmforge.tokenizers import BPETokenizer
    >>> tok = BPETokenizer.train(["abbc abb abc abb"], vocab_size=100, special_tokens=[])
    >>> tok.encode("abbc").tokens
    ['abb', 'c</w>']

``load_tokenizer(path)`` reads any of: a directory or file saved by ``Tokenizer.save`` (our
``tokenizer.json``), a Hugging Face ``tokenizer.json``, or a BERT ``vocab.txt``.

    base.py            the interface every tokenizer shares: the Tokenizer base class, special tokens, save
    encoding.py        Encoding: what a tokenizer returns for one text or pair (ids, tokens, offsets, masks)
    bpe.py             byte-pair encoding with an end-of-word marker (Sennrich et al. 2016)
    byte_bpe.py        byte-level BPE (GPT-2): BPE over UTF-8 bytes, nothing ever unknown
    wordpiece.py       WordPiece (BERT): greedy longest match with ``##``
    train.py           training shared by the three: count words, then learn merges
    normalize.py       the clean-up before pre-tokenization, keeping track of offsets
    pretokenize.py     cutting text into the words a subword model splits further
    template.py        post-processing: special tokens around sequences, pair truncation
    parallel.py        batch encoding spread over worker processes
    huggingface.py     Hugging Face tokenizer.json in and out, for all three kinds
    chat.py            chat templates: a conversation -> the text a chat model was trained on
    sandbox.py         chat templates rendered with bounded work (Jinja2's immutable sandbox, counted)
    plain_specials.py  special-token strings inside a message stay plain text (no forged turns)
"""

from __future__ import annotations

import json
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.manifest import verify_files
from lmforge.tokenizers.base import FORMAT, Encoding, Tokenizer
from lmforge.tokenizers.bpe import BPETokenizer
from lmforge.tokenizers.byte_bpe import ByteLevelBPETokenizer
from lmforge.tokenizers.huggingface import from_huggingface, save_huggingface, to_huggingface
from lmforge.tokenizers.wordpiece import WordPieceTokenizer

KINDS = {"bpe": BPETokenizer, "byte-bpe": ByteLevelBPETokenizer, "wordpiece": WordPieceTokenizer}

__all__ = ["KINDS", "BPETokenizer", "ByteLevelBPETokenizer", "Encoding", "Tokenizer", "WordPieceTokenizer",
           "from_huggingface", "load_tokenizer", "save_huggingface", "to_huggingface"]


def load_tokenizer(path: str | Path, verify: bool | None = None, manifest_required: bool = False) -> Tokenizer:
    """Load a tokenizer from a directory or file, in our JSON, Hugging Face's, or a BERT ``vocab.txt``.

    A directory is searched for ``tokenizer.json``, then ``vocab.txt``. Every problem (missing
    file, invalid JSON, unknown format) is a one-line ``LmforgeError`` naming the file. The file is checked
    against its folder's ``checksums.json`` when there is one (``verify=False`` skips it), and a folder without
    one is refused when ``manifest_required`` (a run's tokenizer, which lmforge always saves with one).
    """
    path = Path(path)
    if path.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (path / name).is_file():
                return load_tokenizer(path / name, verify, manifest_required)
        raise LmforgeError(f"{path}: no tokenizer.json or vocab.txt in this directory")
    if not path.is_file():
        raise LmforgeError(f"{path}: no such tokenizer file or directory")
    if path.suffix == ".txt":
        verify_files(path.parent, [path.name], verify, lmforge_written=manifest_required)
        return WordPieceTokenizer.from_vocab_file(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise LmforgeError(f"{path}: not UTF-8 text (byte offset {err.start})") from None
    except json.JSONDecodeError as err:
        raise LmforgeError(f"{path}: corrupt JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except OSError as err:
        raise LmforgeError(f"{path}: cannot read ({err.strerror or err})") from None
    if not isinstance(data, dict):
        raise LmforgeError(f"{path}: not a tokenizer (expected a JSON object)")
    from lmforge.tokenizers.chat import TEMPLATE_FILES, read_chat_template

    beside = [n for n in TEMPLATE_FILES if (path.parent / n).is_file()]  # read with it: roles, chat template
    verify_files(path.parent, [path.name, *beside], verify, lmforge_written=manifest_required)  # the one read path
    if data.get("format") == FORMAT:
        tok = Tokenizer.from_dict(data, str(path))
    elif "model" in data:
        tok = from_huggingface(data, str(path))
        named_roles(tok, path.parent / "tokenizer_config.json")
    else:
        raise LmforgeError(f"{path}: not a tokenizer file (neither lmforge's format nor Hugging Face's)")
    if tok.chat_template is None:  # a Hugging Face folder keeps it beside: chat_template.jinja, tokenizer_config.json
        tok.chat_template = read_chat_template(path.parent)
    return tok


def named_roles(tok: Tokenizer, config: Path) -> None:
    """The special tokens a Hugging Face ``tokenizer_config.json`` names (``eos_token: "<|im_end|>"``) take their
    roles: the file is what transformers reads, and it may differ from the usual names (<|endoftext|>)."""
    if not config.is_file():
        return
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise LmforgeError(f"{config}: not a valid tokenizer_config.json") from None
    for role in ("bos", "eos", "unk", "pad", "cls", "sep", "mask"):
        token = data.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in tok.vocab:
            tok.set_role(role, token)
