"""Package structure: no import cycle, and thin CLIs that import no other CLI.

The import graph is read from the syntax trees of ``captioning/**/*.py``: every ``import`` and
``from ... import`` of a ``captioning`` module counts, at module level or inside a function
(a function-level import is still a dependency, only a deferred one).  ``from package import
name`` is an edge to the submodule ``package.name`` when there is one, else to the package.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "captioning"
CLI_MAX_LINES = 120


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """``module -> the captioning modules it imports`` for every module of the package."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                deps.update(known(a.name) for a in node.names if a.name.split(".")[0] == "captioning")
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] != "captioning":
                    continue
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    deps.add(sub if sub in files else known(base))
        graph[name] = {d for d in deps if d and d != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each strongly connected component with several modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for comp in components:  # the shortest way from the component's first module back to it (BFS)
        start = min(comp)
        parent: dict[str, str] = {}
        queue = deque([start])
        while start not in parent:
            v = queue.popleft()
            for w in sorted(graph[v] & comp):
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
        path, v = [start], parent[start]
        while v != start:
            path.append(v)
            v = parent[v]
        cycles.append([start, *reversed(path[1:]), start])
    return cycles


def test_the_graph_sees_both_kinds_of_import():
    graph = import_graph()
    assert "captioning.utils.io" in graph["captioning.store.writer"]  # module level
    assert "captioning.config" in graph["captioning.models.decoders"]  # inside a function
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": {"d"}, "d": {"a"}}) == [["a", "c", "d", "a"]]


def test_no_import_cycle_in_the_package():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_cli_module_imports_another_cli_module():
    graph = import_graph()
    bad = {m: sorted(d for d in deps if d.startswith("captioning.cli."))
           for m, deps in graph.items() if m.startswith("captioning.cli.")}
    assert not {m: d for m, d in bad.items() if d}, bad
    library = [m for m, deps in graph.items() if not m.startswith("captioning.cli")
               and any(d.startswith("captioning.cli") for d in deps)]
    assert not library, f"library modules importing a CLI: {library}"


def test_every_cli_module_is_thin():
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in (PACKAGE / "cli").glob("*.py")}
    assert {"caption.py", "evaluate.py", "train.py", "extract.py"} <= set(sizes)
    assert all(n < CLI_MAX_LINES for n in sizes.values()), sizes


#: The pipeline's rooms, lowest first: a package imports only from its own room and the rooms
#: before it (metrics sit below train, which scores validation with them; the evaluate job, which
#: loads trained models, sits above train in evaluation/).
LAYERS = ["errors", "registry", "utils", "config", "jobs", "provenance", "predictions", "store", "data", "metrics", "features",
          "models", "viz", "train", "evaluation", "caption", "demo", "cli"]
#: Sibling packages of the repository that use the library and that the library never imports: the
#: benchmarks (captioning-bench) and the reproduction runner (make reproduce)
SIBLINGS = ("captioning_bench", "captioning_reproduce")


def upward_imports(graph: dict[str, set[str]], layers: list[str]) -> list[tuple[str, str]]:
    rank = {name: i for i, name in enumerate(layers)}

    def room(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None  # the package root (lazy Captioner) is no room

    return sorted((m, d) for m, deps in graph.items() for d in deps
                  if room(m) and room(d) and room(m) != room(d) and rank[room(d)] > rank[room(m)])


def test_every_room_of_the_package_has_a_layer():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p.is_dir() and (p / "__init__.py").exists())}
    assert rooms == set(LAYERS), rooms ^ set(LAYERS)


def test_no_package_imports_one_above_it():
    assert upward_imports({"captioning.models.a": {"captioning.evaluation.b"}}, LAYERS) == [
        ("captioning.models.a", "captioning.evaluation.b")]  # the check sees the arrow it forbids
    assert upward_imports(import_graph(), LAYERS) == []


def test_cli_modules_hold_no_job():
    """A console script is argument-to-job glue: one ``main`` and module-level registration, no
    other function or class (configs and jobs live in the library)."""
    for path in (PACKAGE / "cli").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        assert defined in ([], ["main"]), (path.name, defined)


def test_the_library_imports_no_sibling_package():
    """``captioning`` is the product: the benchmarks and the reproduction runner use it from beside
    it (``captioning_bench``, ``captioning_reproduce``) and it never imports them, at any depth."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in SIBLINGS]
    assert not found, found
    assert all((REPO / s / "__init__.py").is_file() for s in SIBLINGS)


def test_the_runtime_dependencies_leave_out_what_only_the_siblings_need():
    """scipy (the reproduction's t quantiles) and psutil (the scale benchmark's memory and disk
    stages) are extras (bench, reproduce) that ``make install`` takes through ``dev``, not
    dependencies of the library."""
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {re.split(r"[<>=!;\[ ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not runtime & {"scipy", "psutil"}, runtime
    extras = project["optional-dependencies"]
    assert any(d.startswith("scipy") for d in extras["reproduce"]) and any(d.startswith("psutil") for d in extras["bench"])
    assert "captioning[bench,reproduce]" in extras["dev"]
    assert project["scripts"]["captioning-bench"] == "captioning_bench.cli:main"
