"""The house rules (docs/architecture.md), checked on the source: where code lives and who may import whom.

Every import counts, also those inside functions (they hide edges from a reader, not from Python).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "lmforge"
ENGINE = ("reference", "tokenizers", "nn", "models", "data", "train", "generation", "interop", "viz")
# small modules every package may use
BASE = ("cores", "devices", "errors", "files", "manifest", "lock", "outputs", "schema", "workers")
# The settings a command's flags are derived from: dataclasses in torch-free modules (the --help test below checks
# that importing them loads no torch, numpy or matplotlib).
SETTINGS_MODULES = ("lmforge.schema", "lmforge.train.config", "lmforge.generation.options",
                    "lmforge.workflows.options", "lmforge.workflows.pretrain_args", "lmforge.workflows.finetune_args")
ROOT_FILES = {"__init__.py", "py.typed", *(f"{name}.py" for name in BASE)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The lmforge modules a file imports anywhere in it (top level, functions, TYPE_CHECKING blocks)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            # `from lmforge.x import y` imports the module lmforge.x.y when there is one, else names from lmforge.x
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import lmforge.x.y` names a module; keep the longest known
                name = name.rpartition(".")[0]
            if name.startswith("lmforge") and name != here:
                found.add(name)
    return found


GRAPH = {name: imported_modules(path) for name, path in MODULES.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "root"


def test_the_package_root_holds_only_the_facade_and_the_base_modules():
    loose = sorted(p.name for p in PACKAGE.iterdir() if p.is_file() and p.name not in ROOT_FILES)
    assert loose == [], f"files at the package root: {loose} (engine package, workflows/ or cli/)"
    packages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert packages == sorted([*ENGINE, "workflows", "serve", "cli", "recipes"])  # recipes/: data, no code
    assert not list((PACKAGE / "recipes").glob("*.py"))


def test_no_import_cycles():
    """No two modules import each other, directly or through others (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    before = sys.getrecursionlimit()
    sys.setrecursionlimit(10_000)  # the search recurses once per module on a path; restored for later tests
    try:
        for v in GRAPH:
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(before)
    assert cycles == [], f"import cycles: {cycles}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer(m) in ENGINE + BASE))
def test_the_engine_never_imports_workflows_or_the_cli(module):
    bad = sorted(m for m in GRAPH[module] if layer(m) in ("workflows", "serve", "cli", "root"))
    assert bad == [], f"{module} imports {bad}: the engine must not depend on workflows, the CLI or the facade"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer(m) == "workflows"))
def test_workflows_never_import_the_cli_or_the_facade(module):
    bad = sorted(m for m in GRAPH[module] if layer(m) in ("serve", "cli", "root"))
    assert bad == [], f"{module} imports {bad}"


def test_only_the_cli_imports_the_http_shell():
    """serve/ (FastAPI, an optional extra) sits beside cli/: only the CLI imports it, and it holds no model logic
    (it imports workflows, not the engine's models or generation)."""
    users = sorted(m for m, deps in GRAPH.items() if layer(m) not in ("cli", "serve")
                   and any(layer(d) == "serve" for d in deps))
    assert users == []
    shell = sorted(d for m, deps in GRAPH.items() if layer(m) == "serve" for d in deps
                   if layer(d) in ("models", "nn", "train", "data"))
    assert shell == [], f"serve/ reaches into the engine: {shell}"


def test_only_the_cli_imports_the_cli():
    users = sorted(m for m, deps in GRAPH.items() if layer(m) != "cli" and any(layer(d) == "cli" for d in deps))
    assert users == []


def test_the_cli_modules_import_nothing_heavy_at_module_level():
    """A command module's top level may import only the standard library, lmforge.cli / errors and the settings."""
    for name, path in MODULES.items():
        if layer(name) != "cli":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                mod = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                allowed = mod is None or mod == "__future__" or mod.split(".")[0] in sys.stdlib_module_names \
                    or mod in ("lmforge", "lmforge.errors", *SETTINGS_MODULES) or mod.startswith("lmforge.cli")
                assert allowed, f"{name} imports {mod} at module level: import it inside the handler"


HEAVY = ("torch", "numpy", "matplotlib")


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=SRC.parent)


def test_version_and_every_help_import_no_torch_numpy_or_matplotlib():
    code = f"""
import contextlib, io, sys
from lmforge.cli import build_parser, main
from lmforge.cli.main import COMMAND_GROUPS
commands = [["--version"], ["--help"], *[[c, "--help"] for c in ("demo", "tokenizer", "data", "pretrain", "convert",
            "generate", "translate", "finetune", "evaluate", "predict", "attention", "embed")],
            ["tokenizer", "train", "--help"], ["tokenizer", "encode", "--help"], ["data", "prepare", "--help"]]
for argv in commands:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as e:
            assert e.code == 0, (argv, e.code)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
print(len(commands), heavy)
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 1)[1].strip() == "[]", result.stdout


def test_tokenizer_commands_never_import_torch(tmp_path):
    """train, encode and decode run with torch made unimportable."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\nthe dog sat on the log\n" * 20, encoding="utf-8")
    code = f"""
import sys
sys.modules["torch"] = None  # any `import torch` now raises ImportError
from lmforge.cli import main
assert main(["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "60", "--min-frequency", "1",
             "--out", {str(tmp_path / "tok")!r}, {str(corpus)!r}, "--quiet", "--workers", "1"]) == 0
assert main(["tokenizer", "encode", "--tokenizer", {str(tmp_path / "tok")!r}, "the cat"]) == 0
assert main(["tokenizer", "decode", "--tokenizer", {str(tmp_path / "tok")!r}, "[5, 6]"]) == 0
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3 and '"ids"' in lines[1] and '"text"' in lines[2]


def test_every_write_goes_through_the_atomic_helper():
    """lmforge.files writes (temporary file, fsync, rename); a direct write elsewhere must say why it is safe:
    ``atomic:`` (inside a folder renamed as a whole, a .part renamed once checked) or ``append-only:`` (logs).
    The writers of other libraries (a figure, an array, tensors) must write to the helper's temporary path."""
    import re

    direct = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"'](w|a)")
    library = re.compile(r"(savefig|np\.save|torch\.save|save_file|\.tofile)\(")  # their path: the helper's tmp
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "files.py" and path.parent == PACKAGE:
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines):
            if (direct.search(line) or (library.search(line) and not re.search(r"\btmp\b|\(f,", line))) \
                    and not line.lstrip().startswith(">>>"):
                said = line + (lines[number - 1] if number else "")
                if "atomic:" not in said and "append-only:" not in said:
                    offenders.append(f"{path.relative_to(PACKAGE)}:{number + 1}")
    assert offenders == [], f"direct writes: {offenders} (use lmforge.files.write_text_atomic / atomic_path)"


def test_every_data_file_of_the_package_ships_in_the_wheel():
    """A page, script or recipe the code reads beside itself must be named in pyproject's package-data, or an
    installed (non-editable) lmforge fails where the checkout works."""
    import fnmatch
    import tomllib

    globs = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["lmforge"]
    data = [p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert data, "no data files found: the walk is wrong"
    assert [f for f in data if not any(fnmatch.fnmatch(f, g) for g in globs)] == []


# -- the maps a newcomer reads first ---------------------------------------------------------------------------
# cli/: one module per command group, each named after its command.
MAPPED = ("reference", "tokenizers", "nn", "models", "data", "train", "generation", "generation/runners", "interop",
          "viz", "workflows", "serve")


def docstring_map(path: Path) -> set[str]:
    """The file names a docstring lists, one a line: ``    name.py   what it holds`` (or ``name/``)."""
    import re

    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
    return set(re.findall(r"^ {4}([a-z_0-9]+(?:\.py|\.html|/))\s", doc, re.MULTILINE))


@pytest.mark.parametrize("package", MAPPED)
def test_a_package_docstring_lists_every_module_it_holds_and_no_other(package):
    folder = PACKAGE / package
    held = {p.name for p in folder.iterdir() if p.suffix in (".py", ".html") and p.name != "__init__.py"}
    held |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
    listed = docstring_map(folder / "__init__.py")
    assert (sorted(held - listed), sorted(listed - held)) == ([], []), \
        f"{package}/__init__.py: (modules it does not list, names it lists that are not there)"


def test_the_root_docstring_lists_every_package_and_base_module():
    held = {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    held |= {f"{name}.py" for name in BASE}
    assert docstring_map(PACKAGE / "__init__.py") == held


def test_the_readme_and_the_architecture_page_map_the_same_packages():
    """docs/architecture.md's package table and the README's name every package of src/lmforge, the same ones."""
    import re

    def table(path: Path, prefix: str) -> set[str]:
        """The packages the rows of the table headed ``| package |`` name."""
        text = path.read_text(encoding="utf-8")
        rows = text[text.index("\n| package |"):].split("\n\n")[0]
        return set(re.findall(rf"^\| `{re.escape(prefix)}([a-z_]+)`", rows, re.MULTILINE))

    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert table(SRC.parent / "docs" / "architecture.md", "") - set(BASE) == packages  # a row of base modules
    assert table(SRC.parent / "README.md", "lmforge.") - set(BASE) == packages  # may follow the packages


def test_the_layers_a_student_reads_hold_no_device_branch_and_no_backend_trick():
    """nn/ and models/ are the equations: no branch on the device, no thread policy, no oneDNN or CUDA call, no
    operator registered at import. Those belong to the decoding engine's runners (generation/runners/)."""
    import re

    tricks = re.compile(r"device\.type|torch\.cuda|mkldnn|set_num_threads|torch\.backends|torch\.library|"
                        r"custom_op|is_compiling")
    files = [p for folder in ("nn", "models") for p in sorted((PACKAGE / folder).rglob("*.py"))]
    found = [f"{p.relative_to(PACKAGE)}:{n}" for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if tricks.search(line)]
    assert found == []
