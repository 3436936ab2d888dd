"""The sweep summary: one table of every job of a Hydra multirun (grid, submitit, Optuna).

``SweepSummary`` is a Hydra callback (``conf/train.yaml``: ``hydra.callbacks.sweep_summary``).
After each job it writes ``<sweep dir>/jobs/<job number>.json`` (in the job's own process, so
submitit and SLURM jobs record themselves) and rebuilds ``<sweep dir>/summary.csv`` and
``summary.md`` from every record; the sweep's end rebuilds them once more.  A row: the job number,
the overrides that differ between jobs, all its overrides, its status, its run folder, fingerprint, optimizer steps, best val CIDEr and best
checkpoint, or the one-line error of a failed job.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from captioning.config import to_config
from captioning.errors import CaptioningError
from captioning.train.identity import fingerprint, run_config
from captioning.train.job import TrainConfig
from captioning.train.module import config_dict
from captioning.utils.io import atomic_write_json, atomic_write_text

COLUMNS = ("job", "status", "differs", "overrides", "best_val_CIDEr", "global_step", "fingerprint", "run_dir",
           "best_checkpoint", "error")


def job_record(num: int, overrides: list[str], run_dir: Path, status: str, error: Any = None) -> dict[str, Any]:
    """One job's row: its ``train_summary.json`` figures when it finished, else its error."""
    row: dict[str, Any] = {"job": num, "status": status, "overrides": " ".join(overrides), "run_dir": str(run_dir)}
    summary_path = run_dir / "train_summary.json"
    if status == "COMPLETED" and summary_path.is_file():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        row.update({k: summary.get(k) for k in ("best_val_CIDEr", "global_step", "fingerprint", "best_checkpoint")})
    if error is not None:
        lines = str(error).strip().splitlines()
        row["error"] = f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]
    return row


def write_table(sweep_dir: Path) -> list[dict[str, Any]]:
    """``summary.csv`` and ``summary.md`` from the job records under ``sweep_dir/jobs``; returns the rows."""
    rows = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((sweep_dir / "jobs").glob("*.json"))]
    rows.sort(key=lambda r: r["job"])
    shared = set.intersection(*(set(r["overrides"].split()) for r in rows)) if rows else set()
    for r in rows:  # the overrides that are not the same for every job: what the sweep varies
        r["differs"] = " ".join(o for o in r["overrides"].split() if o not in shared)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(sweep_dir / "summary.csv", buf.getvalue())
    fmt = lambda v: "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v).replace("|", "\\|"))  # noqa: E731
    md = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    atomic_write_text(sweep_dir / "summary.md", "\n".join(md) + "\n")
    return rows


def sweep_job_folder(*, _root_: DictConfig) -> str:
    """``${sweep_job_folder:}`` (registered by ``captioning-train``): ``<run_name>-<fingerprint>`` of the
    sweep job whose config the interpolation sits in.  A config that does not resolve gets
    ``job<N>-invalid``: the job then fails inside with its one-line error, which the summary records."""
    container = OmegaConf.to_container(_root_, resolve=False)
    num = container.pop("hydra", {}).get("job", {}).get("num", "")
    container["output_dir"] = ""  # a continuation key, and it would resolve to the folder being named
    try:
        cfg = to_config(OmegaConf.create(container), TrainConfig)
    except (CaptioningError, OmegaConfBaseException):
        return f"job{num}-invalid"
    return f"{cfg.run_name}-{fingerprint(run_config(config_dict(cfg)))}"


class SweepSummary(Callback):
    """Hydra callback writing the sweep summary (multirun only; a single run has train_summary.json)."""

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        hydra = config.hydra
        if hydra.mode != RunMode.MULTIRUN:
            return
        sweep_dir = Path(hydra.sweep.dir)
        failed = job_return.status != JobStatus.COMPLETED
        row = job_record(int(hydra.job.num), list(job_return.overrides or []), Path(hydra.runtime.output_dir),
                         job_return.status.name, job_return._return_value if failed else None)
        atomic_write_json(sweep_dir / "jobs" / f"{row['job']:05d}.json", row)
        write_table(sweep_dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if (sweep_dir / "jobs").is_dir():
            write_table(sweep_dir)
