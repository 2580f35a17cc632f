"""The settings of the commands that run without a recipe, declared once (``lmforge.schema``; no torch here).

    Runtime          where a model runs: --device, --threads, checksum verification (every command that loads one)
    Weights          the weights' number format once loaded: --dtype fp32 ... int4 (commands that run a model)
    TextInput        how text read from files and standard input is decoded (--errors)
    EncodeOptions    lmforge tokenizer encode / decode
    EvaluateOptions  lmforge evaluate
    EmbedOptions     lmforge embed
    AttentionOptions lmforge attention
    TemplateOptions  the budget of a chat template's rendering (lmforge chat, lmforge serve)
    TranslateOptions lmforge translate (beside generation.options.DecodeOptions)
    DemoOptions      lmforge demo

Each field is a flag (``--batch-size``), a key of the command's ``--config`` file (``embed.batch_size: 64``) and
a line of ``--print-config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.schema import setting


@dataclass
class Runtime:
    """Where and how a model runs; applied before any work (``apply``)."""

    device: str = setting("cpu", "cpu | cuda | cuda:N | mps | auto", metavar="DEV")
    threads: int = setting(0, "torch CPU threads (0: torch's default)", min=0, metavar="N")
    verify: bool = setting(True, "check the sha256 of model and checkpoint files on load (--no-verify: skip, "
                           "for huge models)")

    def apply(self) -> None:
        """Set torch's threads, check the device against the machine (one line if it is not there), and turn
        checksum verification off when asked."""
        if not self.verify:
            from lmforge.manifest import set_verify

            set_verify(False)
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        if self.device != "auto":
            from lmforge.devices import resolve_device

            resolve_device(self.device, "--device")


@dataclass
class Weights:
    """The number format of a model's weights once loaded (``lmforge.load(..., dtype=)``): generate, chat,
    serve, evaluate, embed."""

    dtype: Literal["fp32", "bf16", "fp16", "int8", "int4"] = setting(
        "fp32", "weights' dtype; int8 / int4: weight-only quantized linear layers on the CPU (int8: activations "
                "float32; int4: 8-bit a block, as llama.cpp; a GGUF file's Q4_0 / Q4_1 matrices kept as stored)")
    group_size: int = setting(32, "int8 / int4: weights per group sharing a scale (int4: and a zero)",
                              choices=(32, 64, 128, 256),
                              metavar="N")


@dataclass
class TextInput:
    """Text arguments and standard input: one item a line."""

    errors: Literal["strict", "replace"] = setting("strict", "invalid UTF-8: stop with the line and byte offset, "
                                                   "or replace the bad bytes by U+FFFD")


@dataclass
class EncodeOptions:
    """What ``tokenizer encode`` adds and splits out; what ``decode`` leaves out."""

    special: bool = setting(True, "add the template's tokens ([CLS], [SEP], ...) (--no-special: none)")
    allow_special: bool | None = setting(None, "split special tokens written in the text out as tokens "
                                         "(--no-allow-special: read them as plain text, safe for untrusted input; "
                                         "default: as the tokenizer's origin does)")
    offsets: bool = setting(False, "also print each token's character offsets")
    skip_special: bool = setting(False, "decode: leave special tokens out")


@dataclass
class EvaluateOptions:
    """Scoring a model on a file."""

    stride: int | None = setting(None, "language model: tokens each window moves on (default half the context)",
                                 min=1, metavar="N")
    batch_size: int = setting(64, "rows per batch", min=1, metavar="N")
    shots: int = setting(0, "--tasks: k solved examples from --fewshot prepended to each item (few-shot)", min=0,
                         metavar="K")
    limit: int = setting(0, "--tasks: score the first N items of each file (0 = all)", min=0, metavar="N")
    normalization: str = setting("chars", "--tasks multiple choice: the headline accuracy compares log-likelihoods "
                                 "per character of the choice (chars), per token (tokens) or summed (none)",
                                 choices=("chars", "tokens", "none"))
    max_new_tokens: int = setting(96, "--tasks: longest greedy reply for exact-match and reference items", min=1,
                                  metavar="N")
    seed: int = setting(0, "--tasks: which few-shot examples, and the bootstrap's resamples", metavar="N")


@dataclass
class EmbedOptions:
    """Which hidden states, pooled how, and how many neighbours to list."""

    layer: int | None = setting(None, "hidden state L (0 = embeddings, -1 = last; default: last)", metavar="L")
    mix: bool = setting(False, "ELMo scalar mix of all layers (uniform unless mix_weights)")
    mix_weights: list[float] | None = setting(None, "with mix: one weight per hidden state, normalised",
                                              metavar="W")
    gamma: float = setting(1.0, "with mix: scale of the mix")
    pooling: Literal["mean", "cls", "last"] = setting("mean", "mean over real tokens, the first token, or the last "
                                                      "real token")
    exclude_special: bool = setting(False, "leave [CLS], [SEP], ... out of the mean")
    batch_size: int = setting(32, "texts per batch", min=1, metavar="N")
    k: int = setting(10, "how many neighbours or texts to list", min=1, short="-k", metavar="K")
    subwords: bool = setting(False, "also return ## continuation pieces as neighbours")

    def validate(self, section: str = "embed") -> None:
        if self.mix and self.layer is not None:
            raise LmforgeError(f"{section}.layer: not with mix (a mix reads every layer)")
        if self.mix_weights is not None and not self.mix:
            raise LmforgeError(f"{section}.mix_weights: needs mix")


@dataclass
class AttentionOptions:
    """Which attention to draw."""

    layer: int | None = setting(None, "PNG: only layer L (0 = first); HTML: the layer shown first", metavar="L")
    head: int | None = setting(None, "PNG: only head H (with layer: one large heatmap); HTML: the head shown first",
                               min=0, metavar="H")
    view: Literal["encoder", "decoder", "cross"] | None = setting(
        None, "encoder-decoder: the attention drawn in the PNG / shown first in the HTML (default encoder)")
    rollout: bool = setting(False, "PNG of the attention rollout across layers")
    name: str | None = setting(None, "model name shown in titles (default: the directory's name)", metavar="NAME")


@dataclass
class TranslateOptions:
    """Scoring a test set."""

    limit: int | None = setting(None, "with --eval: the first N pairs only", min=1, metavar="N")


@dataclass
class DemoOptions:
    """The demo's sizes (``--quick``: about a minute and a half on 2 cores)."""

    steps: int = setting(1500, "pretraining steps", min=1, metavar="N")
    max_new_tokens: int = setting(120, "tokens generated at the end", min=1, metavar="N")
    finetune_steps: int = setting(200, "LoRA steps on MiniLM (0 skips)", min=0, metavar="N")
    seed: int = setting(0, "random seed")
    examples: str | None = setting(None, "a folder holding the course's exercises (examples/ of a checkout: make demo "
                                   "passes it) to run first; default: none", metavar="DIR")
    quick: bool = setting(False, "a short run: 150 pretraining steps, 20 LoRA steps, no exercises")


@dataclass
class ChatOptions:
    """A conversation's framing (``lmforge chat``)."""

    system: str | None = setting(None, "a system message opening the conversation (default: the template's own)",
                                 metavar="TEXT")


@dataclass
class TemplateOptions:
    """The budget of one rendering of a model's chat template (code that comes with the model files):
    ``lmforge chat`` and ``lmforge serve``. Steps (1,000,000) and all that one render builds (16 x the size
    limit) are bounded too (tokenizers/sandbox.py)."""

    template_seconds: float = setting(2.0, "a chat template rendering longer than this is stopped (one line; "
                                           "a 400 from the server)", above=0, metavar="S")
    template_chars: int = setting(1_000_000, "largest text a chat template may render (or build at once)",
                                  min=1_000, metavar="N")

    def limits(self) -> Any:
        """As ``tokenizers.sandbox.RenderLimits`` (imported here, on use: the command line starts without it)."""
        from lmforge.tokenizers.sandbox import RenderLimits

        return RenderLimits(self.template_seconds, self.template_chars)


@dataclass
class ConvertOptions:
    """How ``lmforge convert`` writes what it writes."""

    gguf_type: Literal["f32", "f16", "q8_0", "q4_0", "q4_1"] = setting(
        "f16", "--to-gguf: the matrices' type (norms stay f32)")


@dataclass
class ServeOptions:
    """``lmforge serve``: where it listens, how many requests it decodes together, how many wait, what it refuses."""

    host: str = setting("127.0.0.1", "address to bind (127.0.0.1: this machine only; 0.0.0.0: every interface)")
    port: int = setting(8000, "TCP port", min=1, max=65535)
    slots: int = setting(8, "requests decoded together (continuous batching)", min=1, metavar="N")
    max_queue: int = setting(64, "requests waiting for a slot before new ones get 429", min=0, metavar="Q")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY' on /v1/* (default: open)",
                                  metavar="KEY")
    context: int | None = setting(None, "longest prompt + reply a slot holds (default: the model's, at most 2048)",
                                  min=1, metavar="N")
    compile: bool | None = setting(None, "compile the engine's step (on CUDA: the recorded CUDA graphs are the "
                                         "default, --compile compiles the step before recording it, fewer kernels, "
                                         "tens of seconds at the first start; on CPU one step graph for every "
                                         "batch, a few minutes at start)")
    prefix_cache: int = setting(128, "blocks of 8 prompt tokens kept to reuse shared prompt beginnings "
                                    "(eager prefills; 0: off)", min=0, metavar="BLOCKS")
    kv_cache: Literal["model", "fp16"] = setting("model", "the keys and values the engine keeps: fp16 halves their "
                                                 "memory and the bytes a step reads (each rounded once to a half "
                                                 "float; the CPU engine); model: the model's float type")
    max_tokens: int = setting(256, "new tokens when a request does not say", min=1, metavar="N")
    max_body: int = setting(1_000_000, "largest request body in bytes (413 beyond)", min=1, metavar="BYTES")
    attention_tokens: int = setting(128, "most tokens of a conversation the attention page shows (its last ones; "
                                    "fewer for models with many heads: a page holds 1.5M weights at most)", min=1,
                                    metavar="N")
    grace: float = setting(30.0, "seconds SIGTERM waits for the streams in flight before exiting", min=0)
    http_process: bool | None = setting(None, "the HTTP server in a process of its own, forked once the model is "
                                              "loaded: its work never takes the engine's interpreter lock (default: "
                                              "when the machine has a core beyond the engine's --threads)")
    adapter: list[str] | None = setting(None, "a LoRA adapter served beside --model (a `finetune --task chat "
                                        "--strategy lora` directory of this base), which requests name as their "
                                        "model; repeat for more", nonempty=True, metavar="NAME=DIR")

    def adapters(self) -> list[tuple[str, str]]:
        """The --adapter settings as (name, directory) pairs."""
        return [(name.strip(), folder) for name, _, folder in (a.partition("=") for a in self.adapter or [])]

    def validate(self, section: str = "serve") -> None:
        names = []
        for a in self.adapter or []:
            name, equals, folder = a.partition("=")
            if not equals or not name.strip() or not folder:
                raise LmforgeError(f"{section}.adapter: {a!r} is not NAME=DIR (e.g. --adapter poems=runs/poems)")
            names.append(name.strip())
        if len(set(names)) != len(names):
            raise LmforgeError(f"{section}.adapter: a name given twice ({', '.join(names)}); each needs its own")
