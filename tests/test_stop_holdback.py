"""The text held back at the end of a reply while it could still begin a stop string (outputs.TextOutput.held):
the longest stop[:n] the text ends with, found among the prefixes ending in its last character."""

from __future__ import annotations

import random

from lmforge.generation.outputs import TextOutput


class Chars:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def brute_force(text: str, stops: list[str]) -> int:
    return max((n for s in stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def test_held_equals_the_longest_stop_prefix_the_text_ends_with():
    rng = random.Random(0)
    for _ in range(2000):
        stops = ["".join(rng.choice("ab.") for _ in range(rng.randint(1, 9))) for _ in range(rng.randint(1, 5))]
        out = TextOutput(Chars(), stops=stops)
        out.decoded = "".join(rng.choice("ab.") for _ in range(rng.randint(0, 12)))
        assert out.held() == brute_force(out.decoded, stops), (out.decoded, stops)


def test_a_reply_streams_up_to_what_could_begin_a_stop_and_ends_before_it():
    out = TextOutput(Chars(), stops=["END", "ab"])
    shown = "".join(out.add(ord(c)) for c in "xaxEN")
    assert shown == "xax" and out.held() == 2 and not out.stopped  # "EN" may begin "END"
    assert out.add(ord("D")) == "" and out.stopped and out.text == "xax"
