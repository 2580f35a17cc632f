"""Grammar engines for ``response_format`` compared on SmolLM2's tokenizer (49,152 tokens): llguidance, xgrammar,
outlines-core. What decided ``lmforge.generation.constraints`` (docs/serving.md "Structured output").

    pip install --target /tmp/gram llguidance xgrammar outlines-core --no-deps      # a scratch folder
    PYTHONPATH=src:/tmp/gram .venv/bin/python bench/grammar_engines.py [--engines llguidance,xgrammar,outlines]

Per engine: the tokenizer's setup (once per server), each schema's compile (a new grammar: once per request, less
what a cache keeps), and the mean time per token of computing the next-token bitmask (V / 32 int32 words) and
advancing by the token, over the tokens of a valid answer (the answer's JSON encoded by SmolLM2's tokenizer).
One thread, the median of three runs of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMAS = {
    "flat": ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False},
             {"name": "Ada Lovelace", "age": 36}),
    "nested": ({"type": "object", "required": ["id", "tags", "address", "status"], "additionalProperties": False,
                "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}},
                               "status": {"enum": ["active", "retired", "unknown"]},
                               "address": {"type": "object", "required": ["city", "zip"],
                                           "additionalProperties": False,
                                           "properties": {"city": {"type": "string"},
                                                          "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}},
               {"id": 42, "tags": ["maths", "engines", "poetry"], "status": "retired",
                "address": {"city": "London", "zip": "12345"}}),  # in the schema's order, as the engines write
    "any object": ({"type": "object"}, {"answer": "yes", "count": 3, "items": [1, 2.5, None, True]}),
}


def smollm2_tokens() -> tuple[list[bytes], list[int], int, object]:
    """(each token's bytes, the special ids, EOS, the tokenizer)."""
    from lmforge.data.sources import smollm2_path
    from lmforge.generation.constraints import vocabulary_bytes
    from lmforge.interop.gguf import gguf_tokenizer, read_gguf

    tok = gguf_tokenizer(read_gguf(smollm2_path()))
    return vocabulary_bytes(tok), sorted(tok.special_ids), tok.eos_id, tok


class Llguidance:
    def __init__(self, vocab, specials, eos, tok):
        import llguidance
        import llguidance.torch

        from lmforge.generation.constraints import JSON_LAYOUT, grammar_tokenizer

        self.ll, self.llt, self.layout = llguidance, llguidance.torch, JSON_LAYOUT
        self.tok = grammar_tokenizer(tok, len(vocab))  # what lmforge serves with
        self.mask = llguidance.torch.allocate_token_bitmask(1, len(vocab))

    def compile(self, schema):
        g = self.ll.LLMatcher.grammar_from_json_schema(schema, overrides=self.layout)
        m = self.ll.LLMatcher(self.tok, g)
        assert not m.is_error(), m.get_error()
        return m

    def step(self, m, token):
        self.llt.fill_next_token_bitmask(m, self.mask, 0)
        assert m.consume_token(token), m.get_error()


class Xgrammar:
    def __init__(self, vocab, specials, eos, tok):
        import xgrammar

        self.x = xgrammar
        info = xgrammar.TokenizerInfo([b"" if i in specials else t for i, t in enumerate(vocab)],
                                      xgrammar.VocabType.RAW, stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.mask = xgrammar.allocate_token_bitmask(1, len(vocab))

    def compile(self, schema):
        return self.x.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=True))

    def step(self, m, token):
        m.fill_next_token_bitmask(self.mask, 0)
        assert m.accept_token(token)


class Outlines:
    def __init__(self, vocab, specials, eos, tok):
        import outlines_core

        self.o = outlines_core
        tokens: dict[bytes, list[int]] = {}
        for i, t in enumerate(vocab):
            if i not in specials:
                tokens.setdefault(t, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, tokens)
        self.mask = torch.full((1, (len(vocab) + 31) // 32), -1, dtype=torch.int32)

    def compile(self, schema):
        regex = self.o.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.o.Guide(self.o.Index(regex, self.vocab))

    def step(self, m, token):
        m.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())
        m.advance(token)


ENGINES = {"llguidance": Llguidance, "xgrammar": Xgrammar, "outlines": Outlines}


def timed(fn, runs: int = 3):
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    vocab, specials, eos, tok = smollm2_tokens()
    print(f"SmolLM2 vocabulary: {len(vocab)} tokens, {len(specials)} special")
    for name in args.engines.split(","):
        setup, engine = timed(lambda name=name: ENGINES[name](vocab, specials, eos, tok), runs=1)
        print(f"\n{name}: tokenizer setup {setup * 1e3:.0f} ms")
        for label, (schema, answer) in SCHEMAS.items():
            ids = tok.encode(json.dumps(answer), add_special_tokens=False).ids
            compile_s, _ = timed(lambda schema=schema, engine=engine: engine.compile(schema))

            def walk(schema=schema, engine=engine, ids=ids):
                m = engine.compile(schema)
                t = time.perf_counter()
                for token in ids:
                    engine.step(m, token)
                return time.perf_counter() - t

            walk_s, _ = timed(walk)
            print(f"  {label:10s} compile {compile_s * 1e3:8.2f} ms   mask+advance {walk_s / len(ids) * 1e6:7.1f} "
                  f"us/token over {len(ids)} tokens")


if __name__ == "__main__":
    main()
