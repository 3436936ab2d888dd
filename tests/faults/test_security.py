"""Static guarantees over the package source: nothing untrusted is executed or unpickled.

Checked on the syntax tree of every module in ``captioning/`` (so a comment or a string
mentioning these names does not count):
- no ``shell=`` other than ``False`` in any call or ``{...}``/``dict(...)`` mapping, no
  ``os.system``/``os.popen``, no ``eval``/``exec``;
- no ``pickle.load``/``pickle.loads``/``pickle.Unpickler``; every ``torch.load`` passes
  ``weights_only=True``; every ``numpy.load`` leaves ``allow_pickle`` off.

Names are resolved the way Python binds them in the module: ``import pickle as p`` makes
``p.load`` ``pickle.load``, ``from pickle import loads as l`` makes ``l`` ``pickle.loads``, and a
plain assignment ``l = pickle.loads`` is followed too.  Keywords passed as a literal mapping,
``f(**{"shell": True})`` or ``f(**dict(shell=True))``, count as keywords.  A keyword that must be
present (``weights_only=True``) is not proven by an opaque ``**kwargs``.  (Limits: one binding per
name per module, not per scope; ``getattr(pickle, "loads")`` and ``__import__`` are not followed.)
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
FORBIDDEN = {
    "os.system", "os.popen", "eval", "exec", "pickle.load", "pickle.loads", "pickle.Unpickler",
    "_pickle.load", "_pickle.loads", "_pickle.Unpickler",
}


def _dotted(node: ast.expr) -> str:
    """'os.system' for os.system, 'eval' for eval, '.eval' for x().eval; '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else f".{node.attr}"
    return ""


def _bindings(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted name it stands for, from imports and ``name = dotted.name``."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:  # import a.b binds a; import a.b as c binds c = a.b
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):  # after the imports: assignments may alias an imported name
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, _dotted(node.value)
            if value and not value.startswith(".") and value.split(".")[0] in out:
                out[target] = _resolve(value, out)
    return out


def _resolve(name: str, bindings: dict[str, str]) -> str:
    """``name`` with its first part replaced by what it is bound to (builtins. dropped)."""
    head, _, rest = name.partition(".")
    full = bindings.get(head, head) + (f".{rest}" if rest else "")
    return full.removeprefix("builtins.")


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    """Keyword -> value expression, literal ``**{...}`` / ``**dict(...)`` included (an opaque
    ``**mapping`` adds nothing: what it holds is unknown, so it proves no required keyword)."""
    out: dict[str, ast.expr] = {}
    for k in call.keywords:
        if k.arg is not None:
            out[k.arg] = k.value
        elif isinstance(k.value, ast.Dict) and all(isinstance(key, ast.Constant) and isinstance(key.value, str)
                                                   for key in k.value.keys):
            out.update({key.value: v for key, v in zip(k.value.keys, k.value.values, strict=True)})
        elif (isinstance(k.value, ast.Call) and _dotted(k.value.func) == "dict" and not k.value.args
              and all(kw.arg is not None for kw in k.value.keywords)):
            out.update({kw.arg: kw.value for kw in k.value.keywords})
    return out


def _is(node: ast.expr | None, value: bool) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _mapping_keys(node: ast.AST) -> dict[str, ast.expr] | None:
    """The string keys of a ``{...}`` literal or a ``dict(k=v)`` call, else None."""
    if isinstance(node, ast.Dict):
        return {k.value: v for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Call) and _dotted(node.func) == "dict":
        return {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
    return None


def problems_in(source: str, where: str = "<code>") -> list[str]:
    """Every breach of the rules in the module docstring, as 'where:line: what'."""
    tree = ast.parse(source, filename=where)
    bindings = _bindings(tree)
    expanded = {id(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
                for k in node.keywords if k.arg is None}  # **{...} / **dict(...): judged at the call
    out = []
    for node in ast.walk(tree):
        at = f"{where}:{getattr(node, 'lineno', 0)}"
        mapping = _mapping_keys(node)
        if mapping and id(node) not in expanded and "shell" in mapping and not _is(mapping["shell"], False):
            out.append(f"{at}: shell= in a mapping (passed on as keywords)")
        if not isinstance(node, ast.Call):
            continue
        raw = _dotted(node.func)
        name = _resolve(raw, bindings) if raw and not raw.startswith(".") else raw
        kw = _keywords(node)
        if name != "dict" and "shell" in kw and not _is(kw["shell"], False):  # dict(...): a mapping, above
            out.append(f"{at}: shell= in {name or 'a call'}")
        if name in FORBIDDEN:
            out.append(f"{at}: {name}")
        if name == "torch.load" and not _is(kw.get("weights_only"), True):
            out.append(f"{at}: torch.load without weights_only=True")
        if name == "numpy.load" and "allow_pickle" in kw and not _is(kw["allow_pickle"], False):
            out.append(f"{at}: numpy.load with allow_pickle")
    return out


def problems(path: Path) -> list[str]:
    return problems_in(path.read_text(), str(path.relative_to(REPO)))


def test_sources_found():
    assert len(SOURCES) > 30


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO / "captioning")))
def test_no_shell_eval_or_unsafe_unpickling(path):
    assert problems(path) == []


BREACHES = [  # (code, what the one problem found must say)
    ("import subprocess\nsubprocess.run(cmd, shell=True)", "shell= in subprocess.run"),
    ("import subprocess as sp\nsp.Popen(cmd, shell=1)", "shell= in subprocess.Popen"),
    ("from subprocess import run\nrun(cmd, **{'shell': True})", "shell= in subprocess.run"),
    ("import subprocess\nsubprocess.call(cmd, **dict(shell=True))", "shell= in subprocess.call"),
    ("import subprocess\nsubprocess.run(cmd, shell=flag)", "shell= in subprocess.run"),
    ("import subprocess\noptions = {'shell': True}", "shell= in a mapping (passed on as keywords)"),
    ("import subprocess\noptions = dict(check=True, shell=True)", "shell= in a mapping (passed on as keywords)"),
    ("import os\nos.system(cmd)", "os.system"),
    ("from os import system as run_it\nrun_it(cmd)", "os.system"),
    ("import os as o\no.popen(cmd)", "os.popen"),
    ("eval(text)", "eval"),
    ("exec(text)", "exec"),
    ("import builtins\nbuiltins.eval(text)", "eval"),
    ("import pickle\npickle.loads(blob)", "pickle.loads"),
    ("from pickle import loads\nloads(blob)", "pickle.loads"),
    ("import pickle as p\np.load(f)", "pickle.load"),
    ("from pickle import load as read\nread(f)", "pickle.load"),
    ("import pickle\nread = pickle.loads\nread(blob)", "pickle.loads"),
    ("import pickle\npickle.Unpickler(f).load()", "pickle.Unpickler"),
    ("import torch\ntorch.load(path)", "torch.load without weights_only=True"),
    ("import torch\ntorch.load(path, weights_only=False)", "torch.load without weights_only=True"),
    ("import torch as T\nT.load(path)", "torch.load without weights_only=True"),
    ("from torch import load\nload(path)", "torch.load without weights_only=True"),
    ("import torch\ntorch.load(path, **{'weights_only': False})", "torch.load without weights_only=True"),
    ("import torch\ntorch.load(path, **options)", "torch.load without weights_only=True"),
    ("import numpy as np\nnp.load(path, allow_pickle=True)", "numpy.load with allow_pickle"),
    ("from numpy import load\nload(path, allow_pickle=True)", "numpy.load with allow_pickle"),
    ("import numpy\nnumpy.load(path, **dict(allow_pickle=True))", "numpy.load with allow_pickle"),
]

ALLOWED = [
    "model.eval()\nbuild().eval()",
    "import subprocess\nsubprocess.run(['ls'], shell=False, check=True)",
    "import subprocess\nsubprocess.run(cmd, **{'shell': False})",
    "import subprocess\noptions = dict(shell=False, check=True)\nsubprocess.run(cmd, **options)",
    "import torch\ntorch.load(path, weights_only=True)",
    "import torch\ntorch.load(path, map_location='cpu', **{'weights_only': True})",
    "import torch as T\nT.load(path, **dict(weights_only=True))",
    "import numpy as np\nnp.load(path)\nnp.load(path, allow_pickle=False, mmap_mode='r')",
    "import json\njson.loads(text)\njson.load(f)",
    "import pickle\npickle.dumps(obj)",
    "def load(path):\n    return path\nload('x')",
    "# pickle.loads(blob), os.system(cmd)\nnote = 'eval(text) and torch.load(path)'",
]


@pytest.mark.parametrize(("code", "what"), BREACHES, ids=[c.splitlines()[-1] for c, _ in BREACHES])
def test_each_rule_fires(code: str, what: str):
    found = problems_in(code, "snippet.py")
    assert len(found) == 1, found
    assert found[0] == f"snippet.py:{len(code.splitlines())}: {what}"


@pytest.mark.parametrize("code", ALLOWED, ids=[c.splitlines()[-1][:40] for c in ALLOWED])
def test_safe_code_passes(code: str):
    assert problems_in(code, "snippet.py") == []
