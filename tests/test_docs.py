"""The documentation cannot rot: README.md and docs/**/*.md are checked against the repository.

- every relative link (``[text](path#anchor)``, images, reference definitions, ``src=``/``href=``)
  names a file that exists and is not git-ignored, and an ``#anchor`` into a markdown file names one
  of its headings (GitHub's slugs);
- every ``captioning-<job> ...`` command in a shell code block composes with Hydra as a user would
  run it (``--cfg job``: the config groups, keys and types are checked against the schema; a ``-m``
  sweep composes once per swept value); ``captioning-bench`` commands parse with the benchmark's
  own argument parser; ``python -m captioning.<module>``, ``make <target>`` and ``pytest <file>``
  name things that exist;
- every ``test_*.py::test_name`` the docs cite (the reliability table) exists;
- every checkpoint file the docs and the configs' comments name (``checkpoints/best.ckpt``, ...) is
  one a real training writes (a tiny run through ``captioning-train``), and evaluates;
- every code name and file path the docs (and data/README.md) and the package's docstrings cite in
  backticks exists: ``captioning.x.y`` names, CamelCase and upper-case names, ``function(...)``
  calls, ``models/x.py`` and ``conf/...yaml`` paths (the rules: "code names" below), and no
  absolute path of one machine (``/work/...``, ``/home/...``, a virtual environment) appears;
- no stale names anywhere in the docs, the package, the configs or the tests;
- no image of the docs prints a path of one machine: a screenshot of a page carries the page's text
  (``tests/screenshots.py``), which names no absolute path, and the viewer's screenshots carry it.

All commands run in one subprocess (``python tests/test_docs.py`` reads them as JSON on stdin), so
the CLIs are imported once.  Placeholders (``<ckpt>``) become their inner word and shell variables
take the value the block gives them (``R=...``, the first value of ``for S in 0 1 2``), else ``0``.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import importlib.util
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from screenshots import ABSOLUTE_PATH, TEXT_KEY, image_text, save_screenshot

REPO = Path(__file__).resolve().parents[1]
STALE = {  # name -> what replaced it
    "compute_loss" + "_static": "compute_loss(static=True)",
    "captioning.training": "captioning.train",
    "captioning.api": "captioning.caption.api (from captioning import Captioner stays)",
    "this " + "session": "say what holds and how it was measured",
}
SHELL_FENCES = {"", "bash", "sh", "shell", "console", "zsh"}
SEPARATORS = {";", "&&", "||", "|", "&"}
KEYWORDS = {"do", "then", "else", "time", "!", "{", "(", "done", "fi", "}", ")"}
CANARIES = [  # commands that must fail: the checker can fail
    ("captioning-train", ["modle=soft_attention"]),
    ("captioning-train", ["model=no_such_decoder"]),
    ("captioning-evaluate", ["decode.beam_size=five"]),
    ("captioning-bench", ["beam", "--no-such-flag"]),
    ("captioning-bench", ["no-such-benchmark"]),
]


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ----- markdown


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    lang: str
    text: str


def split_markdown(text: str) -> tuple[str, list[tuple[int, str, str]]]:
    """(the prose with fenced blocks blanked line for line, [(first line, language, block text)])."""
    prose, blocks, fence, lang, start, body = [], [], None, "", 0, []
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence is None and m:
            fence, lang, start, body = m.group(1), m.group(2).lower(), i + 1, []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            blocks.append((start, lang, "\n".join(body)))
            fence = None
            prose.append("")
        elif fence is not None:
            body.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: rendered text, lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images -> their text
    text = re.sub(r"<[^>]+>", "", text)  # html tags
    text = text.replace("`", "").replace("*", "")
    return "".join(c for c in text.strip().lower() if c.isalnum() or c in "-_ ").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose, flags=re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link of a markdown file outside code."""
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    out = []
    for i, line in enumerate(prose.splitlines(), 1):
        line = re.sub(r"`[^`]*`", "", line)
        targets = [m.group(1) for m in re.finditer(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line)]
        targets += [m.group(1) for m in re.finditer(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", line)]
        targets += [m.group(1) for m in re.finditer(r"\b(?:src|href)=\"([^\"]+)\"", line)]
        out += [(i, t) for t in targets]
    return out


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][\w+.-]*:", target)) or target.startswith("//")


def broken_links(files: list[Path], repo: Path = REPO) -> list[str]:
    """One line per link that does not resolve (file, line, target, why)."""
    problems, local = [], []
    for path in files:
        for line, target in links(path):
            if is_external(target):
                continue
            where = f"{path.relative_to(repo)}:{line}: ({target})"
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if repo.resolve() not in (dest, *dest.parents):
                problems.append(f"{where} leaves the repository")
            elif not dest.exists():
                problems.append(f"{where} no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} no heading with anchor #{anchor} in {dest.relative_to(repo.resolve())}")
            else:
                local.append((where, dest))
    if local and (repo / ".git").exists():  # a link into an ignored folder is dead in every clone
        listed = "\n".join(str(dest.relative_to(repo.resolve())) for _, dest in local)
        proc = subprocess.run(["git", "check-ignore", "--stdin"], cwd=repo, input=listed, capture_output=True,
                              text=True)
        ignored = set(proc.stdout.split())
        problems += [f"{where} is git-ignored" for where, dest in local
                     if str(dest.relative_to(repo.resolve())) in ignored]
    return problems


# ----- shell blocks


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    kind: str  # cli | module | make | pytest
    name: str  # captioning-train | captioning_reproduce | target | ''
    args: tuple[str, ...]


def logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines of a shell block with backslash continuations joined: (offset of the first line, line)."""
    out, start, parts = [], 0, []
    for i, line in enumerate(text.splitlines()):
        if not parts:
            start = i
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        out.append((start, " ".join([*parts, line])))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def expand(token: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), "0"), token)


def segments(line: str) -> list[list[str]]:
    """A shell line's simple commands as token lists (comments and redirections dropped)."""
    line = re.sub(r"<([A-Za-z][\w .-]*)>", lambda m: m.group(1).replace(" ", "_"), line)  # placeholders
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, ""
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not a command line
        return []
    out, current, skip = [], [], False
    for tok in tokens:
        if tok.startswith("#"):
            break
        if tok in SEPARATORS:
            out.append(current)
            current, skip = [], False
        elif set(tok) <= set("<>"):
            if current and current[-1].isdigit():
                current.pop()
            skip = True  # a redirection: the rest until the next separator is its file
        elif not skip:
            current.append(tok)
    return [s for s in [*out, current] if s]


def block_commands(block: Block, scripts: dict[str, str]) -> list[Command]:
    """The commands of one shell block, shell variables set as the block sets them."""
    by_module = {target.split(":")[0]: name for name, target in scripts.items()}
    env: dict[str, str] = {}
    out = []
    for offset, line in logical_lines(block.text):
        if block.lang == "" and not re.match(r"\s*(captioning-|python|make|pytest|export|for\b|[A-Za-z_]\w*=)", line):
            continue  # an untagged block (a diagram, a listing): only lines that start like a command
        for tokens in segments(line):
            while tokens and tokens[0] in KEYWORDS:
                tokens = tokens[1:]
            if tokens[:1] == ["for"] and len(tokens) >= 4 and tokens[2] == "in":
                env[tokens[1]] = expand(tokens[3], env)
                continue
            if tokens[:1] == ["export"]:
                tokens = tokens[1:]
            while tokens and re.match(r"^[A-Za-z_]\w*=", tokens[0]):
                name, _, value = tokens.pop(0).partition("=")
                env[name] = expand(value, env)
            if not tokens:
                continue
            args = [expand(t, env) for t in tokens]
            where = f"{rel(block.path)}:{block.line + offset}"
            program = os.path.basename(args[0])
            if program in scripts:
                out.append(Command(where, "cli", program, tuple(args[1:])))
            elif re.fullmatch(r"python3?", program) and args[1:2] == ["-m"] and len(args) > 2:
                module = args[2]
                if module in by_module:
                    out.append(Command(where, "cli", by_module[module], tuple(args[3:])))
                elif module == "pytest":
                    out.append(Command(where, "pytest", "", tuple(args[3:])))
                elif module.startswith("captioning"):
                    out.append(Command(where, "module", module, tuple(args[3:])))
            elif program == "make":
                out += [Command(where, "make", t, ()) for t in args[1:] if not t.startswith("-") and "=" not in t]
            elif program == "pytest":
                out.append(Command(where, "pytest", "", tuple(args[1:])))
            elif program.startswith("captioning-"):
                out.append(Command(where, "cli", program, tuple(args[1:])))  # an unknown script: fails below
    return out


def scripts() -> dict[str, str]:
    """``captioning-<job>`` -> ``module:function`` from pyproject.toml's [project.scripts]."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    return dict(re.findall(r'^(captioning-[\w-]+)\s*=\s*"([\w.]+:\w+)"', text, flags=re.M))


def doc_commands() -> list[Command]:
    known = scripts()
    out = []
    for path in doc_files():
        _, blocks = split_markdown(path.read_text(encoding="utf-8"))
        for start, lang, text in blocks:
            if lang in SHELL_FENCES:
                out += block_commands(Block(path, start, lang, text), known)
    return out


def hydra_argvs(args: tuple[str, ...]) -> list[list[str]]:
    """``--cfg job`` argument lists for one command: ``-m`` dropped, each swept value composed once."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    flags = {"-m", "--multirun"}
    rest = [a for a in args if a not in flags]
    if any(a in ("--cfg", "-c", "--help", "-h", "--info", "--hydra-help") for a in rest):
        return [rest]
    overrides = [a for a in rest if not a.startswith("-")]
    options = [a for a in rest if a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(overrides)  # a parse error fails like the real CLI
    choices = []
    for text, o in zip(overrides, parsed, strict=True):
        if o.is_sweep_override():
            key = text.split("=", 1)[0]
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([text])
    firsts = [c[0] for c in choices]
    variants = [firsts] + [firsts[:i] + [v] + firsts[i + 1:] for i, c in enumerate(choices) for v in c[1:]]
    return [[*options, *v, "--cfg", "job"] for v in variants]


# ----- the composing subprocess


def _call(target: str, argv: list[str], bench: bool) -> tuple[int, str]:
    module, func = target.split(":")
    main = getattr(importlib.import_module(module), func)
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if bench:
                code = main(argv)
            else:
                from hydra.core.global_hydra import GlobalHydra

                GlobalHydra.instance().clear()
                sys.argv = [module, *argv]
                main()
        except SystemExit as e:
            code = e.code
        except Exception as e:  # noqa: BLE001 - reported with the command
            code, _ = 1, err.write(f"{type(e).__name__}: {e}")
    return (code if isinstance(code, int) else 1), err.getvalue().strip()


def _compose_main() -> None:
    """stdin: [[target, argv, bench], ...] -> stdout: [[exit code, stderr], ...]."""
    import torch

    torch.cuda.is_available = lambda: True  # `--device cuda` parses as on a GPU machine; nothing runs
    from captioning_bench import cli as bench_cli

    for name in bench_cli.BENCHMARKS:  # argument parsing only: run() does nothing
        importlib.import_module(f"captioning_bench.{name.replace('-', '_')}").run = lambda args: []
    jobs = json.load(sys.stdin)
    results = [_call(target, argv, is_bench) for target, argv, is_bench in jobs]
    sys.stdout.write(json.dumps(results))


def compose(commands: list[tuple[str, list[str]]]) -> list[tuple[int, str]]:
    """Run each (script, argv) in one subprocess: exit code and stderr per command."""
    known = scripts()
    jobs = [[known[name], argv, name == "captioning-bench"] for name, argv in commands]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, __file__], input=json.dumps(jobs), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [tuple(r) for r in json.loads(proc.stdout)]


@pytest.fixture(scope="module")
def composed() -> dict:
    """Every doc command's compositions and the canaries, composed in one subprocess."""
    known = scripts()
    planned, unknown = [], []
    for cmd in (c for c in doc_commands() if c.kind == "cli"):
        if cmd.name not in known:
            unknown.append(f"{cmd.where}: {cmd.name}: no such script in pyproject.toml")
        elif cmd.name == "captioning-bench":
            planned.append((cmd, list(cmd.args)))
        else:
            try:
                planned += [(cmd, argv) for argv in hydra_argvs(cmd.args)]
            except Exception as e:  # noqa: BLE001 - an override Hydra cannot parse
                unknown.append(f"{cmd.where}: {cmd.name} {' '.join(cmd.args)}\n    {type(e).__name__}: {e}")
    canaries = [(name, [*argv] if name == "captioning-bench" else [*argv, "--cfg", "job"]) for name, argv in CANARIES]
    results = compose([(c.name, argv) for c, argv in planned] + canaries)
    return {"planned": planned, "unknown": unknown, "results": results[:len(planned)],
            "canaries": results[len(planned):]}


# ----- tests


def test_slugs_are_githubs():
    assert slug("Multi-GPU and multi-node") == "multi-gpu-and-multi-node"
    assert slug("Ensembles, diverse beam search, evaluation-server files") == \
        "ensembles-diverse-beam-search-evaluation-server-files"
    assert slug("`captioning-train`: runs and sweeps") == "captioning-train-runs-and-sweeps"
    assert slug("Results ([generated](docs/results/README.md))") == "results-generated"
    assert slug("Why lambda = 0") == "why-lambda--0"


def test_the_link_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Two words\n\n## Two words\n", encoding="utf-8")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#two-words) [ok](docs/a.md#two-words-1) [ok](#top) [web](https://x.org/y)\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#three-words)\n```\n[in code](nowhere.md)\n```\n# Top\n",
        encoding="utf-8")
    problems = broken_links([tmp_path / "README.md", tmp_path / "docs" / "a.md"], repo=tmp_path)
    assert problems == ["README.md:2: (docs/b.md) no such file",
                        "README.md:2: (docs/a.md#three-words) no heading with anchor #three-words in docs/a.md"]


def test_every_relative_link_resolves():
    problems = broken_links(doc_files())
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_shell_blocks_are_read_as_a_shell_reads_them():
    block = Block(REPO / "README.md", 10, "bash", "\n".join([
        "export OMP_NUM_THREADS=1",
        "R=outputs/ens   # a comment",
        "for S in 3 4; do",
        "  WANDB_MODE=offline captioning-train seed=$S \\",
        "    'callbacks=[default,swa]' hydra.run.dir=$R/s${S} > log.txt 2>&1",
        "done",
        "captioning-evaluate ckpt_path=<xe run>/checkpoints/best.ckpt && make demo test",
        "python -m captioning.cli.score results=r.json; python -m captioning_reproduce --report",
    ]))
    known = {f"captioning-{job}": f"captioning.cli.{job}:main" for job in ("train", "evaluate", "score")}
    got = block_commands(block, known)
    assert got == [
        Command("README.md:13", "cli", "captioning-train", ("seed=3", "callbacks=[default,swa]", "hydra.run.dir=outputs/ens/s3")),
        Command("README.md:16", "cli", "captioning-evaluate", ("ckpt_path=xe_run/checkpoints/best.ckpt",)),
        Command("README.md:16", "make", "demo", ()), Command("README.md:16", "make", "test", ()),
        Command("README.md:17", "cli", "captioning-score", ("results=r.json",)),
        Command("README.md:17", "module", "captioning_reproduce", ("--report",)),
    ]
    assert hydra_argvs(("-m", "model=a,b", "seed=0,1,2")) == [
        ["model=a", "seed=0", "--cfg", "job"], ["model=b", "seed=0", "--cfg", "job"],
        ["model=a", "seed=1", "--cfg", "job"], ["model=a", "seed=2", "--cfg", "job"]]


def test_the_command_checker_refuses_bad_commands(composed):
    for (name, argv), (code, err) in zip(CANARIES, composed["canaries"], strict=True):
        assert code != 0 and err, f"{name} {' '.join(argv)} was accepted"


def test_every_documented_command_composes(composed):
    problems = list(composed["unknown"])
    for (cmd, argv), (code, err) in zip(composed["planned"], composed["results"], strict=True):
        if code != 0:
            last = "\n    ".join(err.splitlines()[:4]) or f"exit {code}"
            problems.append(f"{cmd.where}: {cmd.name} {' '.join(argv)}\n    {last}")
    assert composed["planned"], "no captioning-* command found in the docs"
    assert not problems, "commands that do not compose:\n" + "\n".join(problems)


def test_documented_make_targets_modules_and_test_files_exist():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", makefile, flags=re.M))
    problems = []
    for cmd in doc_commands():
        if cmd.kind == "make" and cmd.name not in targets:
            problems.append(f"{cmd.where}: make {cmd.name}: no such target")
        elif cmd.kind == "module" and importlib.util.find_spec(cmd.name) is None:
            problems.append(f"{cmd.where}: python -m {cmd.name}: no such module")
        elif cmd.kind == "pytest":
            for arg in (a for a in cmd.args if ".py" in a):
                problems += [f"{cmd.where}: pytest {arg}: {p}" for p in cited_test_problems(arg)]
    assert not problems, "\n".join(problems)


def cited_test_problems(ref: str) -> list[str]:
    """What is wrong with ``[tests/]path/test_x.py[::test_name...]``: a missing file or name."""
    path, *names = ref.split("::")
    candidates = [REPO / path] if path.startswith("tests/") else sorted((REPO / "tests").rglob(path))
    candidates = [c for c in candidates if c.is_file() and str(c).endswith("/" + path)]
    if len(candidates) != 1:
        return [f"{len(candidates)} files match {path}"]
    source = candidates[0].read_text(encoding="utf-8")
    names = [re.sub(r"\[.*\]$", "", n) for n in names]
    return [f"no test {n} in {rel(candidates[0])}" for n in names
            if not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(n)}\b", source, flags=re.M)]


def test_every_cited_test_exists():
    ref = re.compile(r"(?<![\w/.])((?:tests/)?(?:[\w-]+/)*test_\w+\.py)((?:::[\w\[\]-]+)*)|(?<![\w.])::(test_\w+)")
    problems = []
    for path in doc_files():
        prose, _ = split_markdown(path.read_text(encoding="utf-8"))
        last = None  # a bare ::test_name belongs to the last file named in its paragraph
        for i, line in enumerate(prose.splitlines(), 1):
            if not line.strip():
                last = None
            for m in ref.finditer(line):
                if m.group(1):
                    last, cited = m.group(1), m.group(0)
                elif last is None:
                    problems.append(f"{rel(path)}:{i}: ::{m.group(3)} names no file before it in its paragraph")
                    continue
                else:
                    cited = f"{last}::{m.group(3)}"
                problems += [f"{rel(path)}:{i}: {cited}: {p}" for p in cited_test_problems(cited)]
    assert not problems, "\n".join(problems)


def test_no_stale_names():
    roots = [REPO / "README.md", REPO / "docs", REPO / "captioning", REPO / "conf", REPO / "tests"]
    files = itertools.chain.from_iterable([r] if r.is_file() else r.rglob("*") for r in roots)
    pattern = re.compile("|".join(rf"\b{re.escape(n)}\b" for n in STALE), flags=re.I)
    hits = []
    for path in files:
        if path.suffix not in (".py", ".md", ".yaml", ".yml", ".json", ".txt", ".ipynb") or path == Path(__file__):
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in pattern.finditer(line):
                hits.append(f"{rel(path)}:{i}: {m.group(0)} (now: {STALE[m.group(0).lower()]})")
    assert not hits, "\n".join(hits)


# ----- images


def doc_images(files: list[Path]) -> list[Path]:
    """The local images the docs show (links ending in .png, .jpg, .jpeg)."""
    return sorted({(path.parent / t.partition("#")[0]).resolve() for path in files for _, t in links(path)
                   if not is_external(t) and t.lower().endswith((".png", ".jpg", ".jpeg"))})


def image_problems(images: list[Path], repo: Path = REPO) -> list[str]:
    """A viewer screenshot without its page's text, and an image whose page text names an absolute path."""
    problems = []
    for img in images:
        text, where = image_text(img), img.relative_to(repo.resolve())
        if text is None and img.stem.startswith("viewer"):
            problems.append(f"{where}: a viewer screenshot without its page's text: take it with "
                            "python tests/test_viewer_browser.py <viewer/index.html> <out.jpg>")
        elif text and ABSOLUTE_PATH.search(text):
            problems.append(f"{where}: the page it shows prints {ABSOLUTE_PATH.search(text).group(0)}: a path of one machine")
    return problems


def test_the_image_checker_finds_a_machine_path_and_a_viewer_screenshot_without_text(tmp_path):
    from PIL import Image

    pixels = Image.new("RGB", (8, 8)).tobytes()
    png = tmp_path / "p.png"
    Image.frombytes("RGB", (8, 8), pixels).save(png)
    Image.open(png).save(tmp_path / "viewer.jpg", comment=f"{TEXT_KEY}:\ntrain /tmp/i44_demo/out/predictions.json".encode())
    Image.open(png).save(tmp_path / "viewer_old.jpg")
    save_screenshot(png.read_bytes(), tmp_path / "viewer_ok.jpg", "train ../predictions.json  1/2  row 3")
    with pytest.raises(ValueError, match="prints a path of this machine"):
        save_screenshot(png.read_bytes(), tmp_path / "never.jpg", r"run C:\Users\me\predictions.json")
    assert image_text(tmp_path / "viewer_ok.jpg") == "train ../predictions.json  1/2  row 3"
    got = image_problems([(tmp_path / n).resolve() for n in ("viewer.jpg", "viewer_old.jpg", "viewer_ok.jpg", "p.png")],
                         repo=tmp_path)
    assert got == ["viewer.jpg: the page it shows prints /tmp/i44_demo/out/predictions.json: a path of one machine",
                   "viewer_old.jpg: a viewer screenshot without its page's text: take it with "
                   "python tests/test_viewer_browser.py <viewer/index.html> <out.jpg>"]


def test_no_image_of_the_docs_prints_a_path_of_one_machine():
    images = doc_images(doc_files())
    assert any(p.stem == "viewer" for p in images), "the viewer's screenshot is among the docs' images"
    problems = image_problems(images)
    assert not problems, "\n".join(problems)


# ----- checkpoint files

def documented_checkpoints() -> dict[str, list[str]]:
    """Checkpoint file names (``best.ckpt``) the docs and the configs' comments tell users to pass
    -> where they do; a placeholder (``<name>.ckpt``) names none."""
    found: dict[str, list[str]] = {}
    for path in [*doc_files(), *sorted((REPO / "conf").rglob("*.yaml"))]:
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in re.finditer(r"(?<![\w<{$-])([A-Za-z][\w-]*)\.ckpt\b", line):
                found.setdefault(m.group(1) + ".ckpt", []).append(f"{rel(path)}:{i}")
    return found


def test_the_checkpoint_finder_reads_names_not_placeholders(tmp_path, monkeypatch):
    doc = tmp_path / "docs" / "a.md"
    doc.parent.mkdir()
    doc.write_text("ckpt_path=<run>/checkpoints/best.ckpt or last.ckpt, never <name>.ckpt nor ${X}.ckpt\n")
    (tmp_path / "README.md").write_text("# r\n")
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.yaml").write_text("# init_from=<stage-1 best.ckpt>\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert documented_checkpoints() == {"best.ckpt": ["docs/a.md:1", "conf/a.yaml:1"], "last.ckpt": ["docs/a.md:1"]}


@pytest.mark.slow
def test_every_checkpoint_the_docs_name_is_written_by_a_training_and_evaluates(tmp_path):
    """A tiny run with the default callbacks writes every checkpoint file the docs name, and
    ``captioning-evaluate ckpt_path=<run>/checkpoints/best.ckpt`` decodes with it."""
    from conftest import data_overrides, make_tiny_image_dataset, run_cli

    data = make_tiny_image_dataset(tmp_path / "tiny")
    run = tmp_path / "run"
    run_cli("train", *data_overrides(data["root"], data["features_dir"]), "model.embed_dim=16", "model.hidden_dim=32",
            "model.attention_dim=16", "debug=tiny", "logger=csv", "trainer.enable_progress_bar=false",
            f"hydra.run.dir={run}", env={"OMP_NUM_THREADS": "1"})
    written = {p.name for p in (run / "checkpoints").iterdir()}
    named = documented_checkpoints()
    assert {"best.ckpt", "last.ckpt"} <= set(named)
    assert not {n: w for n, w in named.items() if n not in written}, f"named but not written (written: {written})"
    out = tmp_path / "eval"
    run_cli("evaluate", f"ckpt_path={run / 'checkpoints' / 'best.ckpt'}", "split=val", "metrics=[bleu,cider]",
            "num_workers=0", "trainer.enable_progress_bar=false", f"output_dir={out}", f"hydra.run.dir={out}",
            env={"OMP_NUM_THREADS": "1"})
    summary = json.loads((run / "train_summary.json").read_text())
    assert json.loads((out / "metrics.json").read_text())["CIDEr"] == pytest.approx(summary["best_val_CIDEr"], abs=1e-6)


# ----- code names
#
# What counts as a code name, in the docs (README.md, data/README.md, docs/**/*.md: single-backtick
# spans outside fenced blocks) and in the package's docstrings (double-backtick spans):
# - a dotted name that starts with ``captioning.`` (or with a module path inside the package, as
#   ``evaluation.structure.evaluate_structure``): the longest prefix must be a module of the package,
#   the next name defined at its top level, and a name after a class one of the class's members;
# - a CamelCase name (two capitals or more: ``FeatureStore``, ``DecoderConfig``), with an optional
#   ``.member``, or a capitalised word with a member (``Vocabulary.build``): a class, function or
#   constant the package defines or imports (or ``EXTERNAL``; a name its JavaScript declares), and
#   a member of that class;
# - an upper-case name (``READERS``, ``FORMAT_KIND``; an underscore or four letters or more): a name
#   the package defines or imports, or a string it reads (an environment variable, a metric key);
# - ``snake_name(...)`` (a call of a lower-case name with an underscore, without dots): a function
#   or method of the package, or a builtin;
# - a file path ending in .py (prose too), or under one of the fully tracked folders (``conf/``,
#   ``tests/``, ``docs/``, ...) ending in a file suffix: a tracked file, found from the repository
#   root, from ``captioning/`` or, for a name shortened to its last parts, by its end.
# Spans holding a placeholder (``<name>``), a URL (``://``), a command (``python -m ...``) or a lower-case dotted name
# that is no module path of the package (``store.read``, ``torch.load``) are not code-name claims.
# Anywhere in the docs and docstrings, an absolute path of one machine is refused (``MACHINE_PATH``).

#: the library and its sibling packages (benchmarks, reproduction runner): what code names may start with
PACKAGES = ("captioning", "captioning_bench", "captioning_reproduce")
CODE_SUFFIXES = ("py", "yaml", "yml", "sh", "ipynb", "toml", "md")
TRACKED_DIRS = ("captioning/", "captioning_bench/", "captioning_reproduce/", "conf/", "tests/", "docs/", "scripts/", "notebooks/", ".ci/")
#: an absolute path of one machine: a home or work folder, a virtual environment, installed packages
MACHINE_PATH = re.compile(r"(?<![\w.~:])/(?:(?:work|home|Users|root|scratch|mnt)/|(?:[^\s`'\"()]+/)?"
                          r"(?:\.?venv|virtualenvs?|site-packages)(?=/|\b))[^\s`'\"()]*")
PATH_TOKEN = re.compile(r"(?<![\w./<>{}*$-])(?:[\w.-]+/)*[\w.-]*\w\.(?:" + "|".join(CODE_SUFFIXES) + r")\b(?![\w/])")
DATA_SUFFIXES = {"txt", "json", "jsonl", "csv", "tsv", "npy", "npz", "h5", "hdf5", "mp4", "webm", "mkv", "avi", "mov",
                 "jpg", "jpeg", "png", "pdf", "svg", "html", "ckpt", "pt", "pth", "log", "zip", "gz", "tar"}
CLASS = re.compile(r"[A-Z][a-z0-9]+")  # a capitalised word: a class name when a .member follows
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
CAPS = re.compile(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z]{4,}")
#: library names the docs cite that the package neither defines nor imports: name -> module holding it
EXTERNAL = {"ImageFile": "PIL.ImageFile", "PatchEmbed": "timm.layers", "VideoResNet": "torchvision.models.video"}


@dataclass
class CodeIndex:
    """What the package defines, read from the syntax trees of ``captioning/**/*.py``."""

    modules: dict[str, set[str]]  # dotted module -> the names at its top level (defined, imported, __all__)
    members: dict[str, set[str]]  # class name -> its methods, class attributes, fields and self.<name>s
    functions: set[str]  # every function and method name
    strings: set[str]  # string constants and ${oc.env:NAME}s of conf/ (environment variables, metric keys)
    imported: set[str]  # every name the package imports (at module level or in a function)
    scripts: set[str]  # the names the package's JavaScript declares (const, let, var, function, class)
    files: set[str]  # tracked files, relative to the repository


def _top_level(body: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, getattr(node, "finalbody", []),
                          *[h.body for h in getattr(node, "handlers", [])]):
                names |= _top_level(block)
    return names


def _members(cls: ast.ClassDef) -> set[str]:
    out = _top_level(cls.body)
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def tracked_files(repo: Path = REPO) -> set[str]:
    proc = subprocess.run(["git", "ls-files"], cwd=repo, capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return set(proc.stdout.split("\n")) - {""}
    return {str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts}


def code_index(repo: Path = REPO) -> CodeIndex:
    modules: dict[str, set[str]] = {}
    members: dict[str, set[str]] = {}
    functions: set[str] = set()
    strings: set[str] = set()
    imported: set[str] = set()
    for path in sorted(p for root in PACKAGES for p in (repo / root).rglob("*.py")):
        parts = list(path.relative_to(repo).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules[name] = _top_level(tree.body)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                members.setdefault(node.name, set()).update(_members(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(node.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
    scripts = {m.group(1) for path in (repo / "captioning").rglob("*.js") for m in
               re.finditer(r"\b(?:const|let|var|function|class)\s+([A-Za-z_$][\w$]*)", path.read_text(encoding="utf-8"))}
    for path in (repo / "conf").rglob("*.yaml"):
        strings |= set(re.findall(r"\$\{oc\.env:(\w+)", path.read_text(encoding="utf-8")))
    return CodeIndex(modules, members, functions, strings, imported, scripts, tracked_files(repo))


def _dotted_problem(name: str, index: CodeIndex) -> str | None:
    """Why ``captioning.a.b...`` names nothing, or None."""
    parts = name.split(".")
    cut = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in index.modules or i == 1)
    module, rest = ".".join(parts[:cut]), parts[cut:]
    if module not in index.modules:
        return "no such module"
    if not rest:
        return None
    if rest[0] not in index.modules[module]:
        return f"{module} defines no {rest[0]}"
    if len(rest) > 1 and rest[0] in index.members and rest[1] not in index.members[rest[0]]:
        return f"{rest[0]} has no member {rest[1]}"
    return None


def _known_name(name: str, index: CodeIndex) -> bool:
    return (any(name in names for names in index.modules.values()) or name in index.functions
            or name in index.imported or name in index.scripts or name in EXTERNAL)


def path_problem(token: str, index: CodeIndex) -> str | None:
    """Why a cited file path names no tracked file, or None (see the rules above)."""
    path = token.split("::")[0].rstrip(":")
    if path.endswith("/"):
        return None if any(f.startswith(path) or f.startswith("captioning/" + path) for f in index.files) \
            else "no such folder"
    if not (path.endswith(".py") or path.startswith(TRACKED_DIRS)):
        return None
    if path in index.files or f"captioning/{path}" in index.files:
        return None
    if not path.startswith(TRACKED_DIRS) and any(f.endswith("/" + path) for f in index.files):
        return None
    return "no such file"


def span_problems(span: str, index: CodeIndex, calls: bool = True) -> list[str]:
    """What a code span (the text between backticks) claims that does not exist, one line each
    (``calls``: also check ``name(...)``; docstrings write formulas that way)."""
    text = span.strip().lstrip("@")
    out = [f"`{token}`: {why}" for token in PATH_TOKEN.findall(text) for why in [path_problem(token, index)] if why]
    if "<" in text or "://" in text or re.match(r"(python3?|pytest|make|captioning-[\w-]+)\s", text) or text.startswith("-"):
        return out
    m = re.match(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", text)
    if not m or text[m.end():].startswith("=") or m.group(0).rsplit(".", 1)[-1] in DATA_SUFFIXES:
        return out  # a setting (NAME=value, key=value) or a data file name, not a code name
    head = m.group(0)
    parts = head.split(".")
    if PATH_TOKEN.fullmatch(head):
        return out
    if parts[0] in PACKAGES or (len(parts) > 2 and f"captioning.{parts[0]}.{parts[1]}" in index.modules):
        full = head if parts[0] in PACKAGES else f"captioning.{head}"
        why = _dotted_problem(full, index)
    elif CAMEL.fullmatch(parts[0]) or CAPS.fullmatch(parts[0]) or (len(parts) > 1 and CLASS.fullmatch(parts[0])):
        if not _known_name(parts[0], index) and not (CAPS.fullmatch(parts[0]) and parts[0] in index.strings):
            why = f"the package defines no {parts[0]}"
        elif len(parts) > 1 and parts[0] in index.members and parts[1] not in index.members[parts[0]]:
            why = f"{parts[0]} has no member {parts[1]}"
        else:
            why = None
    elif calls and len(parts) == 1 and text[m.end():].startswith("(") and head[:1].islower() and "_" in head:
        why = None if head in index.functions or hasattr(builtins, head) else f"the package has no function {head}"
    else:
        why = None
    return out + ([f"`{span}`: {why}"] if why else [])


def doc_code_spans(path: Path) -> list[tuple[int, str]]:
    """(line, span) of every single-backtick span of a markdown file outside fenced blocks."""
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    return [(i, m.group(1)) for i, line in enumerate(prose.splitlines(), 1) for m in re.finditer(r"`([^`]+)`", line)]


def docstring_spans(path: Path) -> list[tuple[int, str]]:
    """(line, span) of every double-backtick span of a module's docstrings."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                line = node.body[0].lineno
                out += [(line + doc[: m.start()].count("\n"), " ".join(m.group(1).split()))
                        for m in re.finditer(r"``(.+?)``", doc, flags=re.S)]
    return out


def code_name_problems(md_files: list[Path], py_files: list[Path], index: CodeIndex, repo: Path = REPO) -> list[str]:
    """One line per code name or path the docs and docstrings cite that does not exist, and per
    machine-specific path in them."""
    problems = []
    for path in md_files:
        where = path.relative_to(repo)
        text = path.read_text(encoding="utf-8")
        for i, line in enumerate(text.splitlines(), 1):
            problems += [f"{where}:{i}: {m.group(0)}: a path of one machine" for m in MACHINE_PATH.finditer(line)]
        problems += [f"{where}:{i}: {p}" for i, span in doc_code_spans(path) for p in span_problems(span, index)]
        prose, _ = split_markdown(text)
        for i, line in enumerate(prose.splitlines(), 1):  # file names in the prose, outside spans and links
            line = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))
            problems += [f"{where}:{i}: {token}: {why}" for token in PATH_TOKEN.findall(line)
                         for why in [path_problem(token, index)] if why]
    for path in py_files:
        where = path.relative_to(repo)
        for i, span in docstring_spans(path):
            problems += [f"{where}:{i}: {m.group(0)}: a path of one machine" for m in MACHINE_PATH.finditer(span)]
            problems += [f"{where}:{i}: {p}" for p in span_problems(span, index, calls=False)]
    return problems


def test_the_code_name_checker_finds_what_does_not_exist(tmp_path):
    (tmp_path / "captioning" / "models").mkdir(parents=True)
    (tmp_path / "captioning" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "captioning" / "models" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "captioning" / "models" / "search.py").write_text(
        '"""Beam search (``captioning.models.search.beam``, ``Hypothesis.score``, ``NoSuchThing``)."""\n'
        "import os\nclass DecodeConfig:\n    beam_size: int = 5\n"
        "class Hypothesis:\n    score: float = 0.0\n    def __init__(self):\n        self.tokens = []\n"
        "def beam_search(decoder, cfg):\n    return os.environ['WORLD_SIZE']\n", encoding="utf-8")
    (tmp_path / "captioning" / "viewer.js").write_text("const Viewer = (() => ({}))();\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text(
        "`captioning.models.search.DecodeConfig.beam_size`, `captioning.models.search.beam_search`,\n"
        "`DecodeConfig`, `Hypothesis.tokens`, `WORLD_SIZE`, `beam_search(decoder, cfg)`, `len(x)`, `store.read`,\n"
        "`conf/model/<name>.yaml`, `python -m captioning.nothing`, `models/search.py`, search.py, `fetch()`,\n"
        "`captioning.models.decoder`, `captioning.models.search.greedy`, `DecoderConfig`, `Hypothesis.attention`,\n"
        "`READERS`, `greedy_decode(decoder)`, `models/decoder.py`, decoder.py, `conf/model/lstm.yaml`\n"
        "The venv is `/work/main/.venv`; see /home/me/x and [a link](/srv/venv/bin); `Viewer.index({...})`, `http(s)://`.\n"
        "```\nFORMAT_KIND in a code block is not a claim\n```\n", encoding="utf-8")
    index = CodeIndex(**{**code_index(tmp_path).__dict__,
                         "files": {"captioning/models/search.py", "captioning/models/__init__.py"}})
    got = code_name_problems([doc], [tmp_path / "captioning" / "models" / "search.py"], index, repo=tmp_path)
    assert got == [
        "a.md:6: /work/main/.venv: a path of one machine",
        "a.md:6: /home/me/x: a path of one machine",
        "a.md:6: /srv/venv/bin: a path of one machine",
        "a.md:4: `captioning.models.decoder`: captioning.models defines no decoder",
        "a.md:4: `captioning.models.search.greedy`: captioning.models.search defines no greedy",
        "a.md:4: `DecoderConfig`: the package defines no DecoderConfig",
        "a.md:4: `Hypothesis.attention`: Hypothesis has no member attention",
        "a.md:5: `READERS`: the package defines no READERS",
        "a.md:5: `greedy_decode(decoder)`: the package has no function greedy_decode",
        "a.md:5: `models/decoder.py`: no such file",
        "a.md:5: `conf/model/lstm.yaml`: no such file",
        "a.md:5: decoder.py: no such file",
        "captioning/models/search.py:1: `captioning.models.search.beam`: captioning.models.search defines no beam",
        "captioning/models/search.py:1: `NoSuchThing`: the package defines no NoSuchThing",
    ]


def test_every_code_name_in_the_docs_and_docstrings_exists():
    index = code_index()
    md = [*doc_files(), REPO / "data" / "README.md"]
    problems = code_name_problems(md, sorted(p for root in PACKAGES for p in (REPO / root).rglob("*.py")), index)
    assert not problems, "names and paths that do not exist:\n" + "\n".join(problems)


def test_the_libraries_cited_by_name_hold_those_names():
    for name, module in EXTERNAL.items():
        assert hasattr(importlib.import_module(module), name), f"{module} has no {name}"


if __name__ == "__main__":
    _compose_main()
