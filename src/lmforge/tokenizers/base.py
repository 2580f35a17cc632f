"""The interface every lmforge tokenizer shares: ``Encoding`` and the ``Tokenizer`` base class.

A tokenizer turns text into ids in four stages; only the third differs between BPE, byte-level
BPE and WordPiece, so the subclasses implement just that (``_word_pieces``) and a decoder:

1. split off special tokens such as ``[SEP]`` written in the text, where allowed (they are never split),
2. normalize (WordPiece: clean, lowercase, strip accents) and cut the text into words,
3. split each word into subword pieces (cached per word),
4. add the template's special tokens (``[CLS] A [SEP] B [SEP]``), truncate, pad.

    >>> tok = load_tokenizer(minilm_path())                   # doctest: +SKIP
    >>> tok.encode("Hello world").ids                         # doctest: +SKIP
    [101, 7592, 2088, 102]

**Special tokens written in text** ("[CLS] literal") follow the tokenizer's origin: loaded from a Hugging
Face ``tokenizer.json`` or a BERT ``vocab.txt``, they are split out as ``tokenizers`` / ``BertTokenizerFast``
do (``specials_in_text``); trained by lmforge, they are plain text, as in tiktoken. ``allow_special=False``
(``--no-allow-special``, for untrusted input) makes them plain text, ``allow_special=True`` splits them out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any, ClassVar

import regex

from lmforge.errors import LmforgeError
from lmforge.tokenizers.encoding import Encoding
from lmforge.tokenizers.parallel import map_in_processes
from lmforge.tokenizers.template import NO_TEMPLATE, apply_template, parse_template, truncate_pair_lengths

FORMAT = "lmforge-tokenizer"
ROLES = ("pad", "unk", "cls", "sep", "mask", "bos", "eos")
CACHED_WORD = 64  # characters: longer words are encoded each time they occur, not cached

WordPieces = tuple[tuple[int, ...], tuple[str, ...], tuple[tuple[int, int], ...]]

TOKENIZER_OUTPUTS = ("tokenizer.json", "tokenizer.vocab", "vocab.txt")  # what save() may write into a folder


class Tokenizer:
    """Base class: vocabulary, special tokens, templates, encode/decode, save/load.

    Subclasses set ``kind`` and ``pattern`` and implement ``_word_pieces(word)`` (ids, tokens and
    character spans of one word), ``_decode_plain(tokens)`` and ``_model_dict()``.
    """

    kind: ClassVar[str] = "base"
    special_joiner: ClassVar[str] = ""
    registry: ClassVar[dict[str, type[Tokenizer]]] = {}
    pattern: regex.Pattern
    contiguous: bool = False  # True when the pattern's words tile every text (GPT-2, GPT-4 patterns)
    specials_in_text: bool = False  # split special tokens out of text by default (Hugging Face origin)
    chat_template: str | None = None  # the Jinja template of the chat model it belongs to (tokenizers/chat.py)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Tokenizer.registry[cls.kind] = cls

    def __init__(self, tokens: Sequence[str], special_tokens: Iterable[str] = (),
                 roles: dict[str, str] | None = None, template: dict[str, list[str]] | None = None) -> None:
        self.id_to_token: list[str] = list(tokens)
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self.id_to_token)}
        if len(self.vocab) != len(self.id_to_token):
            raise LmforgeError("vocabulary: duplicate tokens")
        self.special_tokens: dict[str, int] = {}
        self.roles: dict[str, str] = {}
        self.template = {k: tuple(v) for k, v in (template or NO_TEMPLATE).items()}
        self._cache: dict[str, WordPieces] = {}
        self.add_special_tokens(special_tokens)
        for role, token in (roles or {}).items():
            self.set_role(role, token)
        missing = {name for key in ("single", "pair") for name, _ in parse_template(self.template[key])
                   if not name.startswith("$") and name not in self.special_tokens}
        if missing:
            raise LmforgeError(f"template uses {sorted(missing)}, which are not special tokens of this tokenizer")

    # ---- vocabulary and special tokens -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.id_to_token)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def add_special_tokens(self, tokens: Iterable[str]) -> None:
        """Register special tokens, appending those not yet in the vocabulary."""
        for token in tokens:
            if token not in self.vocab:
                self.vocab[token] = len(self.id_to_token)
                self.id_to_token.append(token)
            self.special_tokens[token] = self.vocab[token]
        ordered = sorted(self.special_tokens, key=len, reverse=True)
        self._special_re = regex.compile("|".join(map(regex.escape, ordered))) if ordered else None
        self._special_ids = frozenset(self.special_tokens.values())
        self._cache.clear()  # the vocabulary changed: cached word pieces may too

    def set_role(self, role: str, token: str) -> None:
        """Say which special token plays ``role`` (pad, unk, cls, sep, mask, bos, eos)."""
        if role not in ROLES:
            raise LmforgeError(f"unknown special-token role {role!r} (expected one of {', '.join(ROLES)})")
        self.add_special_tokens([token])
        self.roles[role] = token

    def _role_id(self, role: str) -> int | None:
        token = self.roles.get(role)
        return None if token is None else self.vocab[token]

    pad_id = property(lambda self: self._role_id("pad"))
    unk_id = property(lambda self: self._role_id("unk"))
    cls_id = property(lambda self: self._role_id("cls"))
    sep_id = property(lambda self: self._role_id("sep"))
    mask_id = property(lambda self: self._role_id("mask"))
    bos_id = property(lambda self: self._role_id("bos"))
    eos_id = property(lambda self: self._role_id("eos"))

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids

    # ---- the per-kind parts ------------------------------------------------------------------
    def _normalize(self, text: str) -> tuple[str, list[int] | None]:
        return text, None

    def _word_pieces(self, word: str) -> WordPieces:
        raise NotImplementedError

    def _decode_plain(self, tokens: list[str]) -> str:
        raise NotImplementedError

    def _model_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def _from_model_dict(cls, model: dict[str, Any], **base: Any) -> Tokenizer:
        raise NotImplementedError

    def _pieces(self, word: str) -> WordPieces:
        """The pieces of ``word``, cached unless the word is longer than ``CACHED_WORD`` characters (a long
        word is rarely seen twice, and a client sending distinct megabyte words must not fill memory)."""
        entry = self._cache.get(word)
        if entry is None:
            entry = self._word_pieces(word)
            if len(word) <= CACHED_WORD:
                if len(self._cache) > 500_000:
                    self._cache.clear()
                self._cache[word] = entry
        return entry

    # ---- encoding ----------------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of plain text: no special tokens recognised or added (the fast path)."""
        norm, _ = self._normalize(text)
        out: list[int] = []
        cache, pieces = self._cache, self._pieces
        for word in self.pattern.findall(norm):
            entry = cache.get(word) or pieces(word)
            out.extend(entry[0])
        return out

    def _encode_plain(self, text: str, base: int, enc: Encoding, word: int) -> int:
        """Append the tokens of ``text`` (which starts at ``base`` in the input); return the next word id.

        The hot loop of encoding: one cached lookup per word, the common one-token word special-cased.
        """
        norm, index = self._normalize(text)
        cache, pieces = self._cache, self._pieces
        ids_out, toks_out, offs_out, words_out = enc.ids, enc.tokens, enc.offsets, enc.word_ids
        if index is None and self.contiguous:  # words tile the text: positions are running sums
            words = self.pattern.findall(norm)
            entries = [cache.get(w) or pieces(w) for w in words]
            if all(len(e[0]) == 1 for e in entries):  # every word one token: whole-list operations
                ends = list(accumulate(map(len, words), initial=base))
                ids_out += [e[0][0] for e in entries]
                toks_out += [e[1][0] for e in entries]
                offs_out += pairwise(ends)
                words_out += range(word, word + len(words))
                return word + len(words)
            for w, (ids, toks, spans) in zip(words, entries, strict=True):
                if len(ids) == 1:
                    ids_out.append(ids[0])
                    toks_out.append(toks[0])
                    words_out.append(word)
                    offs_out.append((base, base + len(w)))
                else:
                    offs_out.extend([(base + s, base + e) for s, e in spans])
                    ids_out.extend(ids)
                    toks_out.extend(toks)
                    words_out.extend([word] * len(ids))
                base += len(w)
                word += 1
            return word
        for m in self.pattern.finditer(norm):
            entry = cache.get(m.group()) or pieces(m.group())
            ids, toks, spans = entry
            start = m.start()
            if index is None:
                start += base
                if len(ids) == 1:
                    ids_out.append(ids[0])
                    toks_out.append(toks[0])
                    words_out.append(word)
                    s, e = spans[0]
                    offs_out.append((start + s, start + e))
                    word += 1
                    continue
                offs_out.extend([(start + s, start + e) for s, e in spans])
            else:
                offs_out.extend([(base + index[start + s], base + index[start + e - 1] + 1) if e > s
                                 else (base + index[start + s - 1] + 1,) * 2 for s, e in spans])
            ids_out.extend(ids)
            toks_out.extend(toks)
            words_out.extend([word] * len(ids))
            word += 1
        return word

    def encode_ordinary_batch(self, texts: Sequence[str], workers: int = 1) -> list[list[int]]:
        """``encode_ordinary`` for many texts, in ``workers`` processes (ids only: cheap to ship back)."""
        return map_in_processes(self, "encode_ordinary", [(t,) for t in texts], {}, workers)

    def _split_special(self, text: str, allowed: str | Iterable[str]) -> list[tuple[int, int, bool]]:
        """Cut ``text`` into (start, end, is_special) segments; special tokens only where allowed."""
        if allowed == "none" or self._special_re is None:
            return [(0, len(text), False)]
        allowed_set = None if allowed == "all" else set(allowed)
        segments, pos = [], 0
        for m in self._special_re.finditer(text):
            if allowed_set is not None and m.group() not in allowed_set:
                continue
            if m.start() > pos:
                segments.append((pos, m.start(), False))
            segments.append((m.start(), m.end(), True))
            pos = m.end()
        if pos < len(text) or not segments:
            segments.append((pos, len(text), False))
        return segments

    def _allowed(self, allowed_special: str | Iterable[str] | None, allow_special: bool | None) -> str | Iterable[str]:
        """Which special tokens written in text are split out: the arguments, else the origin's default."""
        if allow_special is False:
            return "none"
        if allowed_special is not None:
            return allowed_special
        return "all" if allow_special or self.specials_in_text else "none"

    def encode_sequence(self, text: str, allowed_special: str | Iterable[str] | None = None,
                        allow_special: bool | None = None) -> Encoding:
        """One sequence, without template tokens. ``allowed_special``: "none", "all" or a set of tokens
        (default: ``allow_special``, else the tokenizer's origin decides; see the module docstring)."""
        allowed_special = self._allowed(allowed_special, allow_special)
        if not isinstance(text, str):
            raise LmforgeError(f"encode expects a string, got {type(text).__name__}")
        enc = Encoding([], [], [], [], [], [], [])
        specials = []
        if allowed_special == "none" or self._special_re is None:  # the common case
            self._encode_plain(text, 0, enc, 0)
        else:
            word = 0
            for start, end, special in self._split_special(text, allowed_special):
                if special:
                    piece = text[start:end]
                    specials.append(len(enc.ids))
                    enc.ids.append(self.special_tokens[piece])
                    enc.tokens.append(piece)
                    enc.offsets.append((start, end))
                    enc.word_ids.append(None)
                elif end > start:
                    word = self._encode_plain(text[start:end], start, enc, word)
        n = len(enc.ids)
        enc.type_ids, enc.attention_mask, enc.special_tokens_mask = [0] * n, [1] * n, [0] * n
        for i in specials:
            enc.special_tokens_mask[i] = 1
        return enc

    def _template_items(self, pair: bool, add_special_tokens: bool) -> tuple[tuple[str, int], ...]:
        key = "pair" if pair else "single"
        return parse_template(self.template[key] if add_special_tokens else NO_TEMPLATE[key])

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return sum(not name.startswith("$") for name, _ in self._template_items(pair, True))

    def encode(self, text: str, pair: str | None = None, *, add_special_tokens: bool = True,
               allowed_special: str | Iterable[str] | None = None, allow_special: bool | None = None,
               max_length: int | None = None, padding: bool | str | int = False,
               pad_to_multiple_of: int | None = None) -> Encoding:
        """Encode a text (or a pair, ``[CLS] A [SEP] B [SEP]`` for BERT) into an ``Encoding``.

        ``max_length`` truncates (longest first for pairs) so that the result, special tokens
        included, fits; ``padding``: ``"max_length"`` or an int pads up to that length.
        ``allow_special=False`` reads special tokens written in the text as plain text.
        """
        allowed_special = self._allowed(allowed_special, allow_special)
        first = self.encode_sequence(text, allowed_special)
        if pair is None and max_length is None and padding in (False, None) and not pad_to_multiple_of:
            return apply_template(self._template_items(False, add_special_tokens), first, None, self.vocab)
        second = None if pair is None else self.encode_sequence(pair, allowed_special)
        items = self._template_items(second is not None, add_special_tokens)
        if max_length is not None:
            room = max_length - sum(not name.startswith("$") for name, _ in items)
            if room < 0:
                raise LmforgeError(f"max_length {max_length} is smaller than the {-room + max_length} "
                                   "special tokens the template adds")
            if second is None:
                first.truncate(room)
            else:
                n1, n2 = truncate_pair_lengths(len(first), len(second), room)
                first.truncate(n1)
                second.truncate(n2)
        enc = apply_template(items, first, second, self.vocab)
        if padding not in (False, True, "longest", None):
            self.pad([enc], length=max_length if padding == "max_length" else int(padding),
                     pad_to_multiple_of=pad_to_multiple_of)
        elif pad_to_multiple_of:
            self.pad([enc], pad_to_multiple_of=pad_to_multiple_of)
        return enc

    def encode_pair(self, first: str, second: str, **kwargs: Any) -> Encoding:
        """``encode(first, second)``: ``[CLS] A [SEP] B [SEP]`` with type ids 0 then 1 (for BERT)."""
        return self.encode(first, second, **kwargs)

    def pad(self, encodings: list[Encoding], length: int | None = None, pad_to_multiple_of: int | None = None,
            left: bool = False) -> list[Encoding]:
        """Pad in place to ``length`` (default: the longest), rounded up to ``pad_to_multiple_of``."""
        if self.pad_id is None:
            raise LmforgeError("padding needs a pad token: this tokenizer has none (set_role('pad', ...))")
        target = max((len(e) for e in encodings), default=0) if length is None else length
        if pad_to_multiple_of:
            target = -(-target // pad_to_multiple_of) * pad_to_multiple_of
        for enc in encodings:
            enc.pad(target, self.pad_id, self.roles["pad"], left=left)
        return encodings

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, workers: int = 1,
                     padding: bool | str | int = False, max_length: int | None = None,
                     pad_to_multiple_of: int | None = None, **kwargs: Any) -> list[Encoding]:
        """Encode many texts, in ``workers`` processes when > 1; ``padding=True`` pads to the longest."""
        if pairs is not None and len(pairs) != len(texts):
            raise LmforgeError(f"encode_batch: {len(texts)} texts but {len(pairs)} pairs")
        jobs = list(zip(texts, pairs if pairs is not None else [None] * len(texts), strict=True))
        kwargs["max_length"] = max_length
        out = map_in_processes(self, "encode", jobs, kwargs, workers)
        if padding in (True, "longest"):
            self.pad(out, pad_to_multiple_of=pad_to_multiple_of)
        elif padding is not False:
            self.pad(out, length=max_length if padding == "max_length" else int(padding),
                     pad_to_multiple_of=pad_to_multiple_of)
        return out

    # ---- decoding ----------------------------------------------------------------------------
    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids``; an unknown id is an error."""
        tokens = self.id_to_token
        ids = list(ids)
        try:
            return [tokens[i] if i >= 0 else tokens[len(tokens)] for i in ids]
        except (IndexError, TypeError):
            bad = next(i for i in ids if not isinstance(i, int) or not 0 <= i < len(tokens))
            raise LmforgeError(f"unknown token id {bad!r} (vocabulary ids are 0..{len(tokens) - 1})") from None

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``; special tokens are kept as written unless ``skip_special_tokens``."""
        ids = list(ids)
        tokens = self.convert_ids_to_tokens(ids)
        parts: list[str] = []
        run: list[str] = []
        for i, token in zip(ids, tokens, strict=True):
            if i in self._special_ids:
                if run:
                    parts.append(self._decode_plain(run))
                    run = []
                if not skip_special_tokens:
                    parts.append(token)
            else:
                run.append(token)
        if run:
            parts.append(self._decode_plain(run))
        return self.special_joiner.join(p for p in parts if p)

    # ---- saving and loading ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": 1, "kind": self.kind, "tokens": self.id_to_token,
                "special_tokens": list(self.special_tokens), "roles": self.roles,
                "template": {k: list(v) for k, v in self.template.items()}, "model": self._model_dict(),
                "specials_in_text": self.specials_in_text,
                **({"chat_template": self.chat_template} if self.chat_template else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "tokenizer") -> Tokenizer:
        """Rebuild a tokenizer saved by ``to_dict`` (``source`` names the file in errors)."""
        try:
            kind = data["kind"]
            sub = Tokenizer.registry[kind]
        except KeyError:
            raise LmforgeError(f"{source}: missing or unknown field 'kind' "
                               f"(expected one of {', '.join(sorted(Tokenizer.registry))})") from None
        try:
            tok = sub._from_model_dict(data["model"], tokens=data["tokens"],
                                       special_tokens=data.get("special_tokens", []),
                                       roles=data.get("roles", {}), template=data.get("template"))
            tok.specials_in_text = bool(data.get("specials_in_text", False))
            tok.chat_template = data.get("chat_template")
            return tok
        except KeyError as err:
            raise LmforgeError(f"{source}: missing field {err.args[0]!r}") from None
        except LmforgeError as err:
            raise LmforgeError(f"{source}: {err}") from None
        except (TypeError, ValueError, AttributeError) as err:
            raise LmforgeError(f"{source}: malformed tokenizer ({err})") from None

    def readable_vocab(self) -> list[str]:
        """One line per token for the human-readable ``tokenizer.vocab`` file."""
        special = self._special_ids
        return [f"{i}\t{json.dumps(t, ensure_ascii=False)}{'  (special)' if i in special else ''}"
                for i, t in enumerate(self.id_to_token)]

    def save(self, directory: str | Path) -> Path:
        """Write ``tokenizer.json`` (loadable) and ``tokenizer.vocab`` (readable) into ``directory``, each
        atomically, and record them in its ``checksums.json`` (a reader verifies them)."""
        return self.save_files(directory, {
            "tokenizer.json": json.dumps(self.to_dict(), ensure_ascii=False, indent=1) + "\n",
            "tokenizer.vocab": "\n".join(self.readable_vocab()) + "\n"})

    @staticmethod
    def save_files(directory: str | Path, files: dict[str, str]) -> Path:
        """Write ``files`` (name -> text) atomically into ``directory``, then list them in its manifest (a
        new one, or the folder's existing one: a model directory's). Returns the path of the first file."""
        from lmforge.files import write_text_atomic
        from lmforge.manifest import write_manifest

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            write_text_atomic(directory / name, text)
        write_manifest(directory, list(files))
        return directory / next(iter(files))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, special={list(self.special_tokens)})"
