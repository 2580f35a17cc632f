"""What ``/metrics`` shows, in Prometheus' text format, and the server's own state beside it.

Requests are counted by route template and status (``lmforge_requests_total{endpoint="/v1/chat/completions",
status="200"}``): a bounded set, whatever paths clients make up (those are "unmatched"), each label value escaped
as the exposition format asks (backslash, double quote, line break).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field


def label(value: str) -> str:
    r"""A label value as the text format writes it: \ " and line breaks escaped.

    >>> label('a"b\\c')
    'a\\"b\\\\c'
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@dataclass
class Metrics:
    """Counters for ``/metrics``; ``request`` and ``first_token`` may be called from any thread."""

    requests: Counter = field(default_factory=Counter)  # (route template, status) -> count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    ttft_buckets: Counter = field(default_factory=Counter)  # upper bound (s) -> count
    lock: threading.Lock = field(default_factory=threading.Lock)

    BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

    def request(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] += 1

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            for bound in self.BOUNDS:
                if seconds <= bound:
                    self.ttft_buckets[bound] += 1

    def text(self, queue: int, busy: int, slots: int, prefix: tuple[int, int] = (0, 0),
             steps: tuple[int, float] = (0, 0.0)) -> str:
        """The counters; ``prefix``: prompt tokens taken from the prefix cache and computed (its hits and misses);
        ``steps``: the engine's steps and the seconds they took (busy / wall time: how loaded it is)."""
        lines = ["# HELP lmforge_requests_total HTTP requests by route and status code",
                 "# TYPE lmforge_requests_total counter"]
        with self.lock:
            counts = sorted(self.requests.items())
        lines += [f'lmforge_requests_total{{endpoint="{label(e)}",status="{s}"}} {n}' for (e, s), n in counts]
        lines += ["# TYPE lmforge_prompt_tokens_total counter", f"lmforge_prompt_tokens_total {self.prompt_tokens}",
                  "# TYPE lmforge_completion_tokens_total counter",
                  f"lmforge_completion_tokens_total {self.completion_tokens}",
                  "# TYPE lmforge_queue_length gauge", f"lmforge_queue_length {queue}",
                  "# TYPE lmforge_slots_in_use gauge", f"lmforge_slots_in_use {busy}",
                  "# TYPE lmforge_slots gauge", f"lmforge_slots {slots}",
                  "# HELP lmforge_prefix_cached_tokens_total prompt tokens whose keys and values came from the cache",
                  "# TYPE lmforge_prefix_cached_tokens_total counter",
                  f"lmforge_prefix_cached_tokens_total {prefix[0]}",
                  "# TYPE lmforge_prefix_computed_tokens_total counter",
                  f"lmforge_prefix_computed_tokens_total {prefix[1]}",
                  "# HELP lmforge_engine_steps_total engine steps (admissions, prefills and one decoded token a slot)",
                  "# TYPE lmforge_engine_steps_total counter", f"lmforge_engine_steps_total {steps[0]}",
                  "# HELP lmforge_engine_busy_seconds_total seconds the engine spent stepping",
                  "# TYPE lmforge_engine_busy_seconds_total counter",
                  f"lmforge_engine_busy_seconds_total {steps[1]:.6f}",
                  "# HELP lmforge_time_to_first_token_seconds from a request's arrival to its first token",
                  "# TYPE lmforge_time_to_first_token_seconds histogram"]
        for bound in self.BOUNDS:
            lines.append(f'lmforge_time_to_first_token_seconds_bucket{{le="{bound}"}} {self.ttft_buckets[bound]}')
        lines += [f'lmforge_time_to_first_token_seconds_bucket{{le="+Inf"}} {self.ttft_count}',
                  f"lmforge_time_to_first_token_seconds_sum {self.ttft_sum:.6f}",
                  f"lmforge_time_to_first_token_seconds_count {self.ttft_count}"]
        return "\n".join(lines) + "\n"
