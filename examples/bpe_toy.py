"""Seed 000, question 6: byte-pair encoding of the toy corpus ``abbc abb abc abb``, step by step.

    .venv/bin/python examples/bpe_toy.py

1. split into words with their frequencies; 2. add the end-of-word symbol ``\\w`` to each word;
3. count each adjacent pair within each word, multiplied by the word's frequency; 4. replace the
most frequent pair by a new symbol (A, B, C, ... as in the seed); 5. repeat until no pair occurs
more than once. Ties go to the pair of older symbols (smaller ids: characters before merged
symbols), the rule lmforge's trainer uses. The last lines check the result against
``BPETokenizer.train``, which does the same with incremental counts.
"""

from __future__ import annotations

from collections import Counter

from lmforge.tokenizers import BPETokenizer
from lmforge.tokenizers.train import merge_word, pair_counts

CORPUS = "abbc abb abc abb"
EOW = "\\w"


def main() -> None:
    counts = Counter(CORPUS.split())
    print(f"corpus: {CORPUS!r}")
    print("1. words and frequencies:", dict(counts))
    names = [*sorted(set(CORPUS.replace(" ", ""))), EOW]  # symbol id -> printed name
    ids = {s: i for i, s in enumerate(names)}
    words = [[ids[c] for c in w] + [ids[EOW]] for w in counts]
    freqs = list(counts.values())

    def show(word: list[int]) -> str:
        return " ".join(names[s] for s in word)

    print("2. with the end-of-word symbol:", ", ".join(f"{show(w)} x{f}" for w, f in zip(words, freqs, strict=True)))
    step = 0
    while True:
        pairs = pair_counts(words, freqs)
        (a, b), best = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        table = "  ".join(f"({names[x]},{names[y]})={c}" for (x, y), c in sorted(pairs.items()))
        print(f"\nstep {step + 1}: pair counts  {table}")
        if best <= 1:
            print("   no pair occurs more than once: stop")
            break
        new = chr(ord("A") + step)
        names.append(new)
        print(f"   merge ({names[a]},{names[b]}) = {best} -> {new}")
        for w in words:
            merge_word(w, a, b, len(names) - 1, 1, {})
        print("   words:", ", ".join(f"{show(w)} x{f}" for w, f in zip(words, freqs, strict=True)))
        step += 1

    tok = BPETokenizer.train([CORPUS], vocab_size=100, special_tokens=[], end_of_word=EOW)
    print("\nBPETokenizer.train merges:", tok.merges)
    print("final segmentation:", {w: tok.encode(w).tokens for w in counts})


if __name__ == "__main__":
    main()
