"""Helpers of the fault suite: fault/probe environments, what a process did, CSV logs as rows.

The faults and probes themselves live in ``inject/sitecustomize.py`` (its docstring lists every
point); ``forkserver.py`` runs the many short faulted jobs cheaply.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
from pathlib import Path

import numpy as np

INJECT = Path(__file__).resolve().parent / "inject"
RESUMING = re.compile(r"resuming from (\S+) \(step (\d+)\)")


def fault_env(action: str, point: str, substring: str = "", n: int = 0) -> dict[str, str]:
    """``CAPTIONING_FAULT`` for one fault: the ``n+1``-th ``point`` event on a path containing ``substring``."""
    return {"CAPTIONING_FAULT": f"{action}:{point}:{substring}:{n}"}


def inject_env(**variables: str | os.PathLike) -> dict[str, str]:
    """Environment for a plain CLI subprocess (``conftest.run_cli``) with the injection folder on its path."""
    path = os.pathsep.join(filter(None, [str(INJECT), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, **{k: str(v) for k, v in variables.items()}}


def write_offset(key: str, size: int) -> int:
    """A byte count strictly inside a file of ``size`` bytes, drawn from a generator seeded by ``key``."""
    assert size > 2, size
    seed = int.from_bytes(key.encode(), "little") % (2**32)
    return int(np.random.default_rng(seed).integers(1, size - 1))


# ------------------------------------------------------------------------- processes


def killed(proc) -> bool:
    return proc.returncode == -signal.SIGKILL


def error_lines(proc) -> list[str]:
    return re.findall(r"(?:^|\r|\n|\])(error: [^\r\n]*)", proc.stderr)


def check_full_disk(proc, *expected: str) -> str:
    """A full disk: exit status 2, exactly one ``error:`` line holding ``expected``, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, output[output.index("Traceback") - 300:][:3000]
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def resumed_from(proc) -> list[tuple[str, int]]:
    """The ``resuming from <path> (step k)`` lines a training process logged (Hydra's console
    handler writes them to stdout, ``<run>/train.log`` holds them too)."""
    return [(m.group(1), int(m.group(2))) for m in RESUMING.finditer(proc.stdout + proc.stderr)]


def probe_events(folder: Path) -> dict[int, list[dict]]:
    """pid -> the events a probed process (and each of its DDP ranks) recorded."""
    out: dict[int, list[dict]] = {}
    for path in sorted(Path(folder).glob("*.jsonl")):
        out[int(path.stem)] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def optimizer_steps(folder: Path) -> int:
    """Optimizer steps taken by the one process probed into ``folder``."""
    events = probe_events(folder)
    assert len(events) == 1, f"expected one probed process, found {sorted(events)}"
    return sum(e["event"] == "optimizer_step" for e in next(iter(events.values())))


# ------------------------------------------------------------------------------- files


def temp_files(folder: Path) -> list[Path]:
    """Temp files of atomic writes (``.<name>.<...>.tmp``) anywhere under ``folder``."""
    return sorted(p for p in Path(folder).rglob(".*.tmp"))


def csv_rows(run_dir: Path) -> list[dict[str, str]]:
    """The CSV metrics log as a list of rows (strings, as written)."""
    with open(Path(run_dir) / "csv" / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def check_csv_rows(rows: list[dict[str, str]]) -> None:
    """Every metric is logged at strictly increasing steps: no step twice (a re-logged killed tail)."""
    columns = [c for c in rows[0] if c not in ("step", "epoch")]
    for column in columns:
        steps = [int(r["step"]) for r in rows if r[column] != ""]
        assert all(a < b for a, b in zip(steps, steps[1:], strict=False)), (column, steps)


def same_files(a: Path, b: Path, pattern: str = "*") -> list[str]:
    """Names of the files matching ``pattern`` in ``a`` and ``b``, asserting equal sets and equal bytes."""
    names_a = sorted(p.name for p in Path(a).glob(pattern) if p.is_file())
    names_b = sorted(p.name for p in Path(b).glob(pattern) if p.is_file())
    assert names_a == names_b, (names_a, names_b)
    for name in names_a:
        assert (Path(a) / name).read_bytes() == (Path(b) / name).read_bytes(), name
    return names_a


def state_dicts_equal(a: dict, b: dict) -> None:
    """Two checkpoints' weights are bit-identical."""
    import torch

    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
