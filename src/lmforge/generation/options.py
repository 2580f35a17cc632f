"""The settings of decoding, declared once (``lmforge.schema``): flags of ``lmforge generate`` / ``translate`` /
``chat`` / ``serve``, keys of their ``--config`` files, and the keyword arguments of ``generate``.

No torch here: the command line reads these fields at start-up.

    >>> options = GenerateOptions(temperature=0.8, top_k=40)
    >>> options.sampling()["temperature"], options.sampling()["top_k"]
    (0.8, 40)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.schema import setting


@dataclass
class DecodeOptions:
    """How hypotheses are searched and batched (``lmforge translate`` has only these)."""

    beams: int = setting(1, "beam search with B beams (1: off)", min=1, metavar="B")
    length_penalty: float = setting(1.0, "beam score = log p / length**L", metavar="L")
    batch_size: int = setting(8, "inputs decoded together, left-padded", min=1, metavar="N")


@dataclass
class GenerateOptions(DecodeOptions):
    """Greedy decoding, sampling (temperature, top-k, top-p) or beams; stops by token or string."""

    max_new_tokens: int = setting(50, "most tokens to add", min=0, metavar="N")
    temperature: float | None = setting(None, "0 = greedy; > 0 samples from softmax(logits / T) (default 0, or 1 "
                                        "when top_k or top_p is given)", min=0, metavar="T")
    top_k: int | None = setting(None, "sample among the K most likely tokens only", min=1, metavar="K")
    top_p: float | None = setting(None, "sample among the smallest set with probability >= P", above=0, max=1,
                                  metavar="P")
    repetition_penalty: float = setting(1.0, "> 1 makes tokens already in the text less likely (CTRL; 1: off)",
                                        above=0, metavar="R")
    seed: int | None = setting(None, "random seed: the same seed gives the same sample", metavar="S")
    stop: list[str] = setting(factory=list, help="end the text once it holds STRING (kept; not with beams)",
                              metavar="STRING")
    compile: bool | None = setting(None, "one compiled fixed-shape step per token (default: on for CUDA)")

    def validate(self, section: str = "generate") -> None:
        if self.beams > 1 and (self.stop or self.repetition_penalty != 1.0):
            raise LmforgeError(f"{section}.beams: beam search ends on stop tokens and takes no repetition penalty; "
                               "stop and repetition_penalty go with greedy decoding or sampling")

    def resolved_temperature(self) -> float:
        """0 unless given; top-k / top-p filter a distribution to sample from, so alone they imply T = 1."""
        if self.temperature is None:
            return 1.0 if (self.top_k or self.top_p) else 0.0
        return self.temperature

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of ``generate`` / ``stream`` these options stand for."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.resolved_temperature(),
                "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed, "compile": self.compile,
                "repetition_penalty": self.repetition_penalty, "stop_strings": list(self.stop)}
