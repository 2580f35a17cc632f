"""Chat templates are bounded (tokenizers/sandbox.py): each way a template can work forever or build gigabytes is
stopped, and whatever a template raises is one LmforgeError line naming the template."""

from __future__ import annotations

import sys

import pytest

from lmforge.errors import LmforgeError
from lmforge.tokenizers.chat import ChatTemplate
from lmforge.tokenizers.sandbox import RenderLimits

HI = [{"role": "user", "content": "x"}]
NESTED = "".join("{% for m" + str(i) + " in messages %}" for i in range(8)) + "{% endfor %}" * 8


def render(source: str, messages=HI, limits: RenderLimits | None = None) -> str:
    return ChatTemplate(source, name="runs/x", limits=limits).render(messages)


@pytest.mark.parametrize(("source", "message"), [
    # work without end (the old sandbox: hours; 8 loops over 10 messages: 10^8 iterations, 3 s)
    ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "more than 1,000,000 steps"),
    (NESTED, "more than 1,000,000 steps"),
    ("{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep|more than 1,000,000 steps"),
    ("{{ (7 ** 300000000) > 1 }}", "an integer of about 842,206,476 bits"),
    # memory: one operation (the old sandbox built each: 200 MB to 1 GB)
    ("{{ lipsum(n=100000000) }}", "'lipsum' is undefined"),
    ("{{ messages[0]['content'] * 100000000 }}", r"the \* operator would build 100,000,000 characters"),
    ("{{ 'x' | center(300000000) }}", "the center filter would build 300,000,000"),
    ("{{ 'x'.ljust(300000000) }}", r"ljust\(\) would build 300,000,000"),
    ("{{ '%0300000000d' % 1 }}", r"the % operator would build 300,000,0\d\d characters"),
    ("{{ '{:>300000000}'.format(1) }}", r"format\(\) would build 300,000,0\d\d characters"),
    ("{{ range(100000) | map('string') | join(messages[0]['content'] * 100) }}", "the join filter would build"),
    ("{{ ('{0}' * 300).format(messages[0]['content'] * 900000) }}", r"format\(\) would build 270,000,900"),
    # memory: many operations (a string doubled 30 times; 40 strings of 900,000 kept; 40 written into a block)
    ("{% set ns = namespace(s='ab') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
     "the ~ operator would build 1,048,576"),
    ("{% set ns = namespace(l=[]) %}{% for i in range(40) %}{% set ns.l = ns.l + [messages[0]['content'] * 900000] %}"
     "{% endfor %}", "built more than 16,000,000 characters or items in all"),
    ("{% set big = messages[0]['content'] * 900000 %}{% set out %}{% for i in range(40) %}{{ big }}{% endfor %}"
     "{% endset %}", "built more than 16,000,000 characters"),
    ("{% for i in range(2) %}{{ messages[0]['content'] * 600000 }}{% endfor %}", "the rendered text passed 1,000,000"),
    # Python errors that used to escape as a traceback (a 500 from the server)
    ("{{ 1 // 0 }}", "ZeroDivisionError: integer division or modulo by zero"),
    ("{{ 10.0 ** 400 }}", "OverflowError"),
    ("{{ 'abc'.index('z') }}", "ValueError: substring not found"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep"),
    ("{{ 1 + 'a' }}", "TypeError"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
])
def test_each_attack_is_stopped_as_one_line_naming_the_template(source, message):
    messages = HI * 10 if source == NESTED else HI
    with pytest.raises(LmforgeError, match=f"^chat template of runs/x: .*({message})") as err:
        render(source, messages)
    assert "\n" not in str(err.value)


def test_the_time_budget_stops_a_long_render():
    """Under the step budget (300,000 steps) but not under a millisecond: the clock stops it."""
    source = "{% for i in range(100000) %}{{ 'x'.center(100) }}{% endfor %}"
    with pytest.raises(LmforgeError, match=r"still rendering after 0\.001 s"):
        render(source, limits=RenderLimits(seconds=0.001, chars=10**9))


def test_recursion_stops_at_its_depth_whatever_pythons_limit():
    """A host program may raise Python's recursion limit (test_architecture's cycle search sets 10,000): a macro
    calling itself still stops at the sandbox's depth, in milliseconds, not after seconds of Python frames (a slow
    host then met the time budget first). A macro nested 60 deep (a recursive JSON schema) still renders."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)
    try:
        with pytest.raises(LmforgeError, match=r"recursion too deep: calls nested more than 100 deep"):
            render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}")
        deep = "{% macro f(n) %}{% if n %}({{ f(n - 1) }}){% endif %}{% endmacro %}{{ f(60) }}"
        assert render(deep) == "(" * 60 + ")" * 60
    finally:
        sys.setrecursionlimit(before)


def test_an_error_names_the_template_line():
    with pytest.raises(LmforgeError, match=r"ZeroDivisionError.*\(template line 3\)"):
        render("{{ 'a' }}\n{{ 'b' }}\n{{ 1 // 0 }}")


def test_memory_error_is_one_line(monkeypatch):
    def exhausted(fmt: str) -> str:
        raise MemoryError

    monkeypatch.setattr("lmforge.tokenizers.chat.strftime_now", exhausted)
    with pytest.raises(LmforgeError, match="chat template of runs/x: out of memory"):
        render("{{ strftime_now('%Y') }}")


def test_a_syntax_error_names_the_template():
    with pytest.raises(LmforgeError, match=r"^chat template of runs/x: syntax error at line 1"):
        render("{% for m in messages %}")


def test_ordinary_templates_render_within_budget():
    """What chat templates do (loops with loop.*, namespace, macros, filters, ~, %, format, tojson, recursion)."""
    source = ("{% set ns = namespace(n=0) %}{% macro tag(r) %}<{{ r | upper }}>{% endmacro %}"
              "{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ tag(m.role) }}{{ m.content | trim }}"
              "{{ '%02d' % loop.index }}{{ '{}/{}'.format(loop.index, loop.length) }}{% if not loop.last %}|"
              "{% endif %}{% endfor %}{{ ns.n ~ ':' ~ (messages | map(attribute='role') | join(',')) }}"
              "{{ {'a': [1, 2]} | tojson }}{% for x in [[1, [2]], [3]] recursive %}{% if x is iterable %}"
              "{{ loop(x) }}{% else %}{{ x }}{% endif %}{% endfor %}")
    messages = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    assert render(source, messages) == '<USER>hi011/2|<ASSISTANT>yo022/22:user,assistant{"a": [1, 2]}123'
