"""Static guarantees over the package source: nothing untrusted is executed or unpickled.

Checked on the syntax tree of every module in ``captioning/`` (so a comment or a string
mentioning these names does not count):
- no ``shell=True`` in any call, no ``os.system``/``os.popen``, no ``eval``/``exec``;
- no ``pickle.load``/``pickle.loads``; every ``torch.load`` passes ``weights_only=True``;
  every ``np.load`` leaves ``allow_pickle`` off.
The behaviour behind these (a crafted pickle in a checkpoint is refused and never executed,
HTML escaping, paths that escape the data root) is tested in test_checkpoint.py,
test_gallery.py, test_caption_cli.py and test_bad_inputs.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

SOURCES = sorted((REPO / "captioning").rglob("*.py"))


def _name(func: ast.expr) -> str:
    """'os.system' for os.system(...), 'eval' for eval(...), '.eval' for model.eval() and x().eval()."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _name(func.value)
        return f"{base}.{func.attr}" if base else f".{func.attr}"
    return ""


def _kw(call: ast.Call, key: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == key), None)


def problems(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name, where = _name(node.func), f"{path.relative_to(REPO)}:{node.lineno}"
        shell = _kw(node, "shell")
        if shell is not None and not (isinstance(shell, ast.Constant) and shell.value is False):
            out.append(f"{where}: shell= in {name or 'a call'}")
        if name in ("os.system", "os.popen", "eval", "exec", "pickle.load", "pickle.loads"):
            out.append(f"{where}: {name}")
        if name == "torch.load":
            w = _kw(node, "weights_only")
            if not (isinstance(w, ast.Constant) and w.value is True):
                out.append(f"{where}: torch.load without weights_only=True")
        if name in ("np.load", "numpy.load"):
            a = _kw(node, "allow_pickle")
            if a is not None and not (isinstance(a, ast.Constant) and a.value is False):
                out.append(f"{where}: np.load with allow_pickle")
    return out


def test_sources_found():
    assert len(SOURCES) > 30


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO / "captioning")))
def test_no_shell_eval_or_unsafe_unpickling(path):
    assert problems(path) == []


def test_the_checker_catches_each_pattern(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, pickle, subprocess, torch, numpy as np\n"
        "subprocess.run(cmd, shell=True)\n"
        "os.system(cmd)\n"
        "eval(text)\n"
        "pickle.loads(blob)\n"
        "torch.load(path)\n"
        "torch.load(path, weights_only=False)\n"
        "np.load(path, allow_pickle=True)\n"
    )
    found = problems_at(bad)
    assert len(found) == 7, found


def problems_at(path: Path) -> list[str]:
    """``problems`` for a file outside the repository (paths shown as given)."""
    global REPO
    saved, REPO = REPO, path.parent  # noqa: PLW0603 - only for this self-test
    try:
        return problems(path)
    finally:
        REPO = saved
