"""Size limits of the package: no module in ``captioning/`` over 400 lines, no function over 80.

A module is counted in lines of its file; a function (or method, nested ones too) from its ``def``
line to its last line, docstring included, decorators not.  A file over a limit today is listed in
``PENDING`` with the split it waits for; a listed file that is back under the limits fails the
test, so the list can only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "captioning"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

#: Files over a limit, each waiting for its split along its own seams (file: what is over).  Empty
#: since the second pass of the layout work (2026-11-27): every module is within the limits.
#: Nothing may be added.
PENDING: dict[str, str] = {}


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function of ``source`` longer than ``limit`` lines."""
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        out.append((name, lines))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


def over_limits(path: Path) -> list[str]:
    """What is over a limit in one module: ``"<n> lines"`` and ``"<function>: <n> lines"``."""
    out = []
    n = module_lines(path)
    if n > MAX_MODULE_LINES:
        out.append(f"{n} lines")
    out += [f"{name}(): {lines} lines" for name, lines in long_functions(path.read_text(encoding="utf-8"))]
    return out


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_checker_sees_a_long_function():
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    source = f"def short():\n    pass\n\n\nclass A:\n    def long(self):\n{body}\n        def inner():\n            pass\n"
    assert long_functions(source) == [("A.long", 83)]
    assert long_functions(source, limit=83) == []


def test_no_module_over_400_lines_and_no_function_over_80():
    problems = {}
    for path in modules():
        rel = str(path.relative_to(REPO))
        found = over_limits(path)
        if found and rel not in PENDING:
            problems[rel] = found
    assert not problems, "split these along their seams (docs/development.md):\n" + "\n".join(
        f"  {rel}: {', '.join(found)}" for rel, found in problems.items())


def test_every_pending_file_is_still_over_a_limit():
    """An entry of PENDING whose file is split (or gone) must leave the list."""
    done = [rel for rel in PENDING if not (REPO / rel).is_file() or not over_limits(REPO / rel)]
    assert not done, f"within the limits now: remove from PENDING: {done}"
