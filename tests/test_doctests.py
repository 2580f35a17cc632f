"""Every worked example in a docstring runs and gives what it shows (minbpe style: the docstring is a test)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import numpy as np
import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = sorted(
    ".".join(p.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
    for p in (SRC / "lmforge").rglob("*.py")
    if ">>>" in p.read_text(encoding="utf-8") and p.name != "__main__.py"
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    with np.printoptions(legacy="1.25"):  # docstrings print NumPy scalars as plain numbers
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
