"""The parts of ``lmforge.generate``: choosing a token (sampling), feeding a model step by step with a
KV cache (steps), and beam search (beam). Use ``lmforge.generate.generate`` / ``stream``."""
