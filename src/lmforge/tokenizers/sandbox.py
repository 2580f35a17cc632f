"""Chat templates rendered with bounded work: Jinja2's immutable sandbox, counting what a template does.

A chat template is code that comes with the model files. Jinja2's ``ImmutableSandboxedEnvironment`` stops it
from reaching Python's internals, but not from working forever or building gigabytes: nested
``range(100000)`` loops, ``'x' * 10**9``, ``7 ** 10**8``, ``lipsum(n=10**8)``, a string doubled in a loop. Here
each render has a budget (``RenderLimits``)::

    time        the render stops after ``seconds`` (default 2 s)
    size        its output, and any one string or list it builds, at most ``chars`` (default 1,000,000)
    work        everything it builds or writes, summed, at most 16 x ``chars``
    steps       loop iterations, calls, filters, operators and lookups: at most 1,000,000
    depth       calls nested at most 100 deep (a macro calling itself without end stops there, in
                milliseconds, whatever Python's recursion limit a host program has set)

The budget is kept cooperatively, inside the sandbox: every loop iteration (``for`` over messages, ranges,
anything; recursive loops too), call, filter, operator, attribute or item lookup is one step, and the clock is
read every 64 steps; the operations that can build much from little are sized *before* they run (``*``, ``**``,
``+``, ``%``, ``~``, ``str.format``, ``center``/``ljust``/``rjust``/``zfill``, ``expandtabs``, ``join``,
``replace``, ``translate``, ``to_bytes``; the ``center``, ``indent``, ``wordwrap``, ``replace``, ``join``,
``format``, ``batch``, ``slice`` and ``sum`` filters) and the size of what every call, filter and output
returns is charged. ``lipsum`` is not offered. The render is streamed (``Template.generate``) and its output
counted between chunks. A single built-in operation on bounded data is not interrupted (sorting a list of a
million items takes about a second), so the time budget can be overrun by that much.

    >>> env = BoundedEnvironment()
    >>> render_bounded(env.compile_bounded("{{ 'ab' * 3 }}"), {}, RenderLimits())
    'ababab'
    >>> try:
    ...     render_bounded(env.compile_bounded("{{ 'ab' * 10**9 }}"), {}, RenderLimits())
    ... except TemplateLimit as err:
    ...     print(err)
    the * operator would build 2,000,000,000 characters or items (the limit: 1,000,000)
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.runtime import LoopContext, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

STEPS = 1_000_000  # loop iterations, calls, filters, operators, lookups per render
WORK_FACTOR = 16  # everything built or written in one render, summed: at most WORK_FACTOR x chars
INT_BITS = 65_536  # the largest integer a template may compute (about 20,000 digits)
CLOCK_EVERY = 64  # steps between two readings of the clock
DEPTH = 100  # calls nested inside one another (macros, recursive loops): chat templates nest a few
STEP_FILTER, CONCAT_FILTER, OUTPUT_FILTER = "lmforge_steps", "lmforge_concat", "lmforge_output"


@dataclass(frozen=True)
class RenderLimits:
    """The budget of one render (``lmforge.workflows.options.TemplateOptions`` holds the settings)."""

    seconds: float = 2.0
    chars: int = 1_000_000


class TemplateLimit(Exception):
    """A template went over its budget (raised inside the render, reported as one line by the caller)."""


class Budget:
    """What one render may still do: steps, characters built, time."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self.steps, self.work, self.depth = STEPS, WORK_FACTOR * limits.chars, 0
        self.deadline = time.monotonic() + limits.seconds

    def tick(self) -> None:
        self.steps -= 1
        if self.steps % CLOCK_EVERY == 0:
            if self.steps < 0:
                raise TemplateLimit(f"more than {STEPS:,} steps (loop iterations, calls, operators)")
            if time.monotonic() > self.deadline:
                raise TemplateLimit(f"still rendering after {self.limits.seconds:g} s (the time budget)")

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        """One call deeper for the block: past ``DEPTH`` the render stops (a template's recursion ends here,
        long before Python's own limit, which a host program may have raised)."""
        if self.depth >= DEPTH:
            raise TemplateLimit(f"recursion too deep: calls nested more than {DEPTH} deep (a macro or loop that "
                                "calls itself without end)")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def room(self, size: int, what: str) -> None:
        """Refuse to build ``size`` characters (or items) before building them."""
        if size > self.limits.chars:
            raise TemplateLimit(f"{what} would build {size:,} characters or items (the limit: "
                                f"{self.limits.chars:,})")
        if size > self.work:
            raise TemplateLimit(f"built more than {WORK_FACTOR * self.limits.chars:,} characters or items in all "
                                f"(the work budget, {WORK_FACTOR} x the size limit)")

    def charge(self, value: Any, what: str = "a value") -> Any:
        size = size_of(value)
        if size:
            self.room(size, what)
            self.work -= size
        return value


BUDGET: ContextVar[Budget | None] = ContextVar("lmforge_template_budget", default=None)


def step() -> Budget | None:
    """One step of the current render (None outside a render: Jinja folding constants at compile time)."""
    budget = BUDGET.get()
    if budget is not None:
        budget.tick()
    return budget


def size_of(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict | set | frozenset) else 0


def render_bounded(template: Any, context: dict[str, Any], limits: RenderLimits) -> str:
    """Render ``template`` (compiled by ``BoundedEnvironment``) within ``limits``: streamed, the output counted
    and the clock read between chunks. Raises ``TemplateLimit`` or whatever the template raised."""
    budget = Budget(limits)
    token = BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in template.generate(context):
            size += len(chunk)
            if size > limits.chars:
                raise TemplateLimit(f"the rendered text passed {limits.chars:,} characters (the size limit)")
            budget.tick()
            chunks.append(chunk)
        return "".join(chunks)
    finally:
        BUDGET.reset(token)


class Counted:
    """An iterable whose every item is a step: what a ``for`` loop of a bounded template iterates."""

    def __init__(self, items: Any) -> None:
        self.items = items

    def __iter__(self) -> Iterator[Any]:
        for item in self.items:
            step()
            yield item

    def __len__(self) -> int:  # loop.length, loop.last
        return len(self.items)


class Bounded(NodeTransformer):
    """Rewrite a parsed template so that its loops, concatenations and outputs pass through the budget:
    ``for x in xs`` iterates ``xs|lmforge_steps``, ``a ~ b`` is ``[a, b]|lmforge_concat``, and every piece
    written (text or ``{{ expression }}``) is ``piece|lmforge_output``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = wrap(node.iter, STEP_FILTER)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return wrap(nodes.List(node.nodes, lineno=node.lineno), CONCAT_FILTER)

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [wrap(nodes.Const(n.data, lineno=n.lineno) if isinstance(n, nodes.TemplateData) else n,
                           OUTPUT_FILTER) for n in node.nodes]
        return node


def wrap(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a budget: operators, calls, lookups and filters are steps and are sized."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, filters: dict[str, Callable] | None = None, globals: dict[str, Any] | None = None,
                 **options: Any) -> None:
        super().__init__(**options)
        del self.globals["lipsum"]  # lorem ipsum of any length: no template needs it
        self.globals.update(globals or {})
        self.filters.update(filters or {})
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[STEP_FILTER] = pass_context(lambda _context, items: Counted(items))
        self.filters[CONCAT_FILTER] = pass_context(concat)
        self.filters[OUTPUT_FILTER] = pass_context(lambda _context, value: charged(value, "the output"))

    def compile_bounded(self, source: str) -> Any:
        """The template of ``source`` with its loops, concatenations and outputs counted (``Bounded``)."""
        tree = Bounded().visit(self.parse(source))
        tree.set_environment(self)
        return self.from_string(tree)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = step()
        if budget is not None:
            budget.room(binop_size(operator, left, right), f"the {operator} operator")
        return charged(super().call_binop(context, operator, left, right), f"the {operator} operator")

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = step()
        if isinstance(obj, LoopContext) and args:  # loop(children) in a recursive loop: its items are steps
            args = (Counted(args[0]), *args[1:])
        target = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
        if budget is not None and isinstance(owner, str | bytes | int) and name in METHOD_SIZES:
            if name == "join" and args and not isinstance(args[0], list | tuple):
                args = (list(args[0]), *args[1:])  # sized first, then joined
            budget.room(METHOD_SIZES[name](owner, *args, **kwargs), f"{name}()")
        if budget is None:
            return super().call(context, obj, *args, **kwargs)
        with budget.nested():
            return charged(super().call(context, obj, *args, **kwargs), f"{name or 'a call'}()")

    def getattr(self, obj: Any, attribute: str) -> Any:
        step()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        step()
        return super().getitem(obj, argument)


def charged(value: Any, what: str) -> Any:
    budget = BUDGET.get()
    return budget.charge(value, what) if budget is not None else value


def concat(context: Any, values: list[Any]) -> str:
    """``a ~ b ~ c``, sized before it is joined (Jinja's own join otherwise)."""
    budget = step()
    if budget is not None:
        budget.room(sum(len(v) if isinstance(v, str) else len(str(v)) for v in values), "the ~ operator")
    join = markup_join if context.eval_ctx.autoescape else str_join
    return charged(join(values), "the ~ operator")


def bounded_filter(name: str, func: Callable) -> Callable:
    """``func`` as a filter that is a step, sized first when it can build much from little, its result charged.
    Marked ``pass_context`` (so Jinja never runs it at compile time); it passes on what ``func`` asks for."""
    pass_arg = _PassArg.from_obj(func)
    size = FILTER_SIZES.get(name)

    def bounded(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        budget = step()
        if name in ("join", "sum") and not isinstance(value, list | tuple | str):
            value = list(value)  # sized first, then joined (or summed)
        if budget is not None and size is not None:
            budget.room(size(value, *args, **kwargs), f"the {name} filter")
        lead = {_PassArg.context: (context,), _PassArg.eval_context: (context.eval_ctx,),
                _PassArg.environment: (context.environment,)}.get(pass_arg, ())
        return charged(func(*lead, value, *args, **kwargs), f"the {name} filter")

    bounded.__name__ = name
    return pass_context(bounded)


# -- sizes before building: what each operation would build, from its arguments ----------------------------------
def binop_size(operator: str, left: Any, right: Any) -> int:
    """Characters or items ``left operator right`` would build; integers are sized in bits against INT_BITS."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(n, int):
                return len(seq) * max(n, 0)
        if isinstance(left, int) and isinstance(right, int):
            check_bits(abs(left).bit_length() + abs(right).bit_length())
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        check_bits(right * math.log2(abs(left)))
    elif operator == "+" and isinstance(left, str | bytes | list | tuple) and isinstance(right, type(left)):
        return len(left) + len(right)
    elif operator == "%" and isinstance(left, str):
        return format_size(left, right if isinstance(right, tuple) else (right,), {})
    return 0


def check_bits(bits: float) -> None:
    if bits > INT_BITS:
        raise TemplateLimit(f"an integer of about {int(bits):,} bits (the limit: {INT_BITS:,})")


def format_size(fmt: str, args: tuple, kwargs: dict[str, Any]) -> int:
    """An upper estimate of ``fmt % args`` or ``fmt.format(*args, **kwargs)``: each field may be given the
    largest argument (a field can repeat one: ``{0}{0}``, ``%(a)s%(a)s``) padded to the widest width or precision
    of the format's specs (``%0300d``, ``{:>300}``, ``%.300f``) or, where an argument sets it (``%*d``,
    ``{:{}}``), the largest number given.

    >>> format_size("%05d|%s", ("abc", 7), {})
    81
    """
    specs = PERCENT_SPEC.findall(fmt)
    widths = [w for spec in specs for w in spec if w.isdigit()] + re.findall(r"\d+", "".join(BRACE_SPEC.findall(fmt)))
    widths = [int(w) if len(w) < 13 else 10**13 for w in widths]
    values = [*args, *kwargs.values()]
    if any("*" in spec for spec in specs) or NESTED_BRACE.search(fmt):
        widths += [abs(int(a)) for a in values if isinstance(a, int | float) and math.isfinite(a)]
    fields = len(specs) + fmt.count("{")
    return len(fmt) + fields * (max(widths, default=0) + max(map(text_size, values), default=0))


PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\d*|\*)(?:\.(\d*|\*))?")  # %(name)-08.3f: width, precision
BRACE_SPEC = re.compile(r"\{[^{}]*?:([^{}]*)\}")  # {0:>300}: the spec after the colon
NESTED_BRACE = re.compile(r"\{[^{}]*\{")  # {:{}}: a width given by an argument


def text_size(value: Any, depth: int = 0) -> int:
    """About how much text ``value`` writes into a format: strings by length, containers by their strings."""
    if isinstance(value, str | bytes):
        return len(value)
    if depth < 3 and isinstance(value, dict | list | tuple):
        items = value.values() if isinstance(value, dict) else value
        return 2 + sum(text_size(v, depth + 1) + 4 for v in items)
    return 32


def arg(args: tuple, kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def width_size(s: Any, *args: Any, **kwargs: Any) -> int:  # center, ljust, rjust, zfill
    width = arg(args, kwargs, 0, "width", 80)
    return max(len(s), width if isinstance(width, int) else 0)


def lines(s: Any) -> int:
    return s.count("\n") + 1 if isinstance(s, str) else 1


def replace_size(s: Any, old: Any = "", new: Any = "", count: Any = -1, *_: Any, **kwargs: Any) -> int:
    if not isinstance(s, str | bytes) or not isinstance(old, str | bytes) or not isinstance(new, str | bytes):
        return 0
    count = kwargs.get("count", count)
    hits = s.count(old) if old else len(s) + 1
    hits = min(hits, count) if isinstance(count, int) and count >= 0 else hits
    return len(s) + hits * max(len(new) - len(old), 0)


def join_size(sep: Any, items: Iterable[Any]) -> int:
    items = list(items)
    return sum(len(x) if isinstance(x, str | bytes) else 32 for x in items) + max(len(items) - 1, 0) * len(sep)


def indent_size(s: Any, width: Any = 4, *_: Any, **kwargs: Any) -> int:
    width = kwargs.get("width", width)
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    return len(str(s)) + lines(str(s)) * max(pad, 0)


def wordwrap_size(s: Any, width: Any = 79, *args: Any, **kwargs: Any) -> int:
    width = kwargs.get("width", width)
    wrap = arg(args, kwargs, 1, "wrapstring", None) or "\n"
    breaks = len(str(s)) // max(width, 1) + lines(str(s)) if isinstance(width, int) else 0
    return len(str(s)) + breaks * len(str(wrap))


def count_size(value: Any, n: Any = 0, *_: Any, **kwargs: Any) -> int:  # batch, slice: n lists, fills
    n = kwargs.get("linecount", kwargs.get("slices", n))
    return size_of(value) + (n if isinstance(n, int) else 0)


def sum_size(items: Any, *args: Any, **kwargs: Any) -> int:
    start = arg(args, kwargs, 1, "start", 0)
    return 0 if isinstance(start, int | float) else size_of(start) + sum(size_of(x) for x in items)


def translate_size(s: Any, table: Any = None, *_: Any, **__: Any) -> int:
    widest = max((len(v) for v in table.values() if isinstance(v, str)), default=1) if isinstance(table, dict) else 1
    return len(s) * max(widest, 1)


METHOD_SIZES: dict[str, Callable[..., int]] = {
    "center": width_size, "ljust": width_size, "rjust": width_size, "zfill": width_size,
    "expandtabs": lambda s, n=8, **kw: len(s) + s.count("\t" if isinstance(s, str) else b"\t") * max(
        kw.get("tabsize", n), 0),
    "join": join_size, "replace": replace_size, "translate": translate_size,
    "format": lambda s, *a, **kw: format_size(s, a, kw), "format_map": lambda s, m=None: format_size(s, (), m or {}),
    "to_bytes": lambda _n, length=1, *_a, **kw: kw.get("length", length),
}
FILTER_SIZES: dict[str, Callable[..., int]] = {
    "center": width_size, "indent": indent_size, "wordwrap": wordwrap_size, "replace": replace_size,
    "join": lambda items, d="", *_a, **kw: join_size(kw.get("d", d), items), "batch": count_size,
    "slice": count_size, "sum": sum_size,
    "format": lambda s, *a, **kw: format_size(str(s), a, kw),
}
