"""The figures and verdicts of ``scripts/gpu_check.sh``: one JSON object per line in ``figures.jsonl``.

    python scripts/gpu_check.py device FIGURES [--dry-run]      # exit 3: no CUDA device
    python scripts/gpu_check.py stage FIGURES NAME STATUS RC SECONDS BOX -- COMMAND...
    python scripts/gpu_check.py tests JUNIT_XML FIGURES
    python scripts/gpu_check.py train RUN_DIR FIGURES --label L --seconds S
    python scripts/gpu_check.py compare REFERENCE_DIR CANDIDATE_DIR FIGURES --label L [--identical]
    python scripts/gpu_check.py clock CLOCK_JSON FIGURES --label L [--warmup N]
    python scripts/gpu_check.py targets FIGURES --call train|extract   # that call's targets met or missed
    python scripts/gpu_check.py finish FIGURES SUMMARY_JSON

Every line has ``name``, ``unit`` and ``value`` (as ``captioning-bench`` writes them); ``finish``
adds the GPU's name and the torch version to each line and writes the summary (exit 1 when a stage
did not finish ok).  Only the standard library here, and torch for ``device``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

NO_CUDA = 3  # exit code of `device` (and of gpu_check.sh) when no CUDA device is visible


def append(figures: str | Path, *records: dict) -> None:
    with open(figures, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def read_lines(figures: str | Path) -> list[dict]:
    path = Path(figures)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=Path(__file__).resolve().parents[1])
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def device(args: argparse.Namespace) -> int:
    """The device line: the GPU's name, memory and capability, torch and CUDA versions, the date."""
    base = {"name": "gpu_check/device", "unit": "", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "host_cpus": os.cpu_count(), "commit": _commit()}
    if args.dry_run:
        append(args.figures, {**base, "value": None, "device": "skipped", "reason": "dry run: nothing measured"})
        print("gpu-check: dry run: the stages below are printed, not run")
        return 0
    import torch

    base.update(torch=torch.__version__, cuda=torch.version.cuda)
    if not torch.cuda.is_available():
        reason = (f"torch.cuda.is_available() is false (torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                  f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')!r})")
        append(args.figures, {**base, "value": None, "device": "absent", "reason": reason})
        print(f"gpu-check: skipped, no CUDA device: {reason}; nothing measured (exit {NO_CUDA})")
        return NO_CUDA
    props = torch.cuda.get_device_properties(0)
    gpu = torch.cuda.get_device_name(0)
    append(args.figures, {**base, "value": gpu, "device": "cuda", "gpu": gpu,
                          "memory_gib": round(props.total_memory / 2**30, 1),
                          "capability": f"{props.major}.{props.minor}",
                          "multiprocessors": props.multi_processor_count, "gpus": torch.cuda.device_count()})
    print(f"gpu-check: {gpu} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}), "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    return 0


def stage(args: argparse.Namespace) -> int:
    append(args.figures, {"name": f"gpu_check/stage/{args.stage}", "unit": "s", "value": args.seconds,
                          "status": args.status, "rc": args.rc, "box_s": args.box,
                          "command": " ".join(args.command)})
    return 0


def tests(args: argparse.Namespace) -> int:
    """One line per test case of a JUnit XML report (outcome, seconds)."""
    root = ET.parse(args.junit).getroot()
    records = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if case.find(child) is not None:
                outcome = name
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        records.append({"name": "gpu_check/test", "unit": "s", "value": round(float(case.get("time", 0)), 3),
                        "test": test, "outcome": outcome})
    counts = {o: sum(r["outcome"] == o for r in records) for o in ("passed", "failed", "error", "skipped")}
    append(args.figures, *records, {"name": "gpu_check/tests", "unit": "tests", "value": len(records), **counts})
    print(f"gpu-check: tests {counts}")
    return 0 if records and counts["failed"] == counts["error"] == 0 else 1


def _last_losses(csv_path: Path) -> list[float]:
    if not csv_path.is_file():
        return []
    with open(csv_path, newline="") as f:
        return [float(row["train/loss_step"]) for row in csv.DictReader(f) if row.get("train/loss_step")]


def train(args: argparse.Namespace) -> int:
    """A training run's figures: steps, steps/s over the whole command, val CIDEr, the loss curve's
    ends (finite, else the verdict fails)."""
    run = Path(args.run_dir)
    summary_path = run / "train_summary.json"
    if not summary_path.is_file():
        print(f"gpu-check: {summary_path} missing: the training did not finish", file=sys.stderr)
        return 1
    summary = json.loads(summary_path.read_text())
    losses = _last_losses(run / "csv" / "metrics.csv")
    steps = int(summary.get("global_step", 0))
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    ok = steps > 0 and finite and Path(summary.get("last_checkpoint") or "").is_file()
    append(args.figures, {
        "name": f"gpu_check/train/{args.label}", "unit": "steps/s",
        "value": round(steps / args.seconds, 2) if args.seconds > 0 else None,
        "seconds": args.seconds, "global_step": steps, "epochs": summary.get("epochs"),
        "train_samples": summary.get("train_samples"), "best_val_CIDEr": summary.get("best_val_CIDEr"),
        "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
        "losses_finite": finite, "verdict": "ok" if ok else "failed",
    })
    print(f"gpu-check: train {args.label}: {steps} steps in {args.seconds:.0f} s, loss "
          f"{losses[0] if losses else None} -> {losses[-1] if losses else None}, val CIDEr {summary.get('best_val_CIDEr')}")
    return 0 if ok else 1


def clock(args: argparse.Namespace) -> int:
    """A training run's steady-state steps/s from its ``StepClock`` file (the wall time at the end of
    every batch; ``captioning_bench.train_cli.steady_state``, which this repeats in the standard
    library): the steps after the first ``warmup`` and after each epoch's first, per second."""
    path = Path(args.clock)
    if not path.is_file():
        print(f"gpu-check: {path} missing: the training did not finish", file=sys.stderr)
        return 1
    batches = json.loads(path.read_text())["batches"]
    intervals = [t1 - t0 for k, ((e0, t0), (e1, t1)) in enumerate(zip(batches, batches[1:], strict=False), 1)
                 if e1 == e0 and k >= args.warmup]
    rate = len(intervals) / sum(intervals) if intervals else None
    append(args.figures, {"name": f"gpu_check/steps_per_s/{args.label}", "unit": "steps/s",
                          "value": None if rate is None else round(rate, 3), "steps": len(batches),
                          "steps_timed": len(intervals), "warmup": args.warmup})
    print(f"gpu-check: {args.label}: {rate} steps/s over {len(intervals)} of {len(batches)} steps")
    return 0 if intervals else 1


def _evaluation(folder: Path) -> tuple[dict[str, dict], dict[str, float]]:
    preds = json.loads((folder / "predictions.json").read_text())
    by_id = {str(p.get("image_id", p.get("video_id"))): p for p in preds}
    return by_id, json.loads((folder / "metrics.json").read_text())


def compare(args: argparse.Namespace) -> int:
    """Captions and metrics of two evaluations of one checkpoint.  ``--identical``: every caption
    the same and every metric equal to 1e-9 (the same captions score the same), else exit 1."""
    ref, ref_metrics = _evaluation(Path(args.reference))
    cand, cand_metrics = _evaluation(Path(args.candidate))
    if set(ref) != set(cand):
        print(f"gpu-check: {args.label}: the evaluations cover different items", file=sys.stderr)
        return 1
    same = [i for i in ref if ref[i]["caption"] == cand[i]["caption"]]
    score_diff = max((abs(float(ref[i]["score"]) - float(cand[i]["score"])) for i in same), default=0.0)
    metric_diff = {k: abs(float(v) - float(cand_metrics.get(k, math.nan))) for k, v in ref_metrics.items()}
    agreement = len(same) / max(1, len(ref))
    identical = len(same) == len(ref) and all(d <= 1e-9 for d in metric_diff.values())
    verdict = "identical" if identical else "differ"
    append(args.figures, {
        "name": f"gpu_check/eval_agreement/{args.label}", "unit": "fraction", "value": round(agreement, 4),
        "items": len(ref), "same_captions": len(same), "max_score_diff_same_captions": score_diff,
        "distinct_captions": len({p["caption"] for p in ref.values()}),  # 1: a trivial comparison
        "metric_abs_diff": metric_diff, "reference_metrics": ref_metrics, "candidate_metrics": cand_metrics,
        "required": "identical" if args.identical else "recorded", "verdict": verdict,
    })
    print(f"gpu-check: {args.label}: {len(same)}/{len(ref)} captions the same, max metric difference "
          f"{max(metric_diff.values(), default=0.0):.2e}: {verdict}")
    return 1 if args.identical and not identical else 0


# (call, target, figure name, the record's fields that select it, the record's field compared, <= or >=, limit)
TARGETS = (
    ("train", "train_cli_over_tutorial", "train/cli_vs_baseline", {"device": "cuda", "compile": "auto"}, "value",
     ">=", 10.0),
    ("train", "train_cli_over_its_step", "train/cli_vs_ours", {"device": "cuda", "compile": "auto"}, "value",
     ">=", 0.9),
    ("train", "gpu_fp32_captions_equal_cpu", "gpu_check/eval_agreement/cpu_vs_gpu_fp32", {}, "value", ">=", 1.0),
    ("train", "scst_steps_per_s_recorded", "gpu_check/steps_per_s/scst_compile_auto", {}, "value", ">", 0.0),
    ("extract", "extraction_over_slowest_part", "extract_images/ratio", {"device": "cuda", "jpeg_decoder": "nvjpeg*"},
     "value", ">=", 0.8),
    ("extract", "store_write_over_disk", "scale/store_write", {"device": "cuda", "tmpfs": "False"}, "ratio", ">=", 0.8),
    ("extract", "store_write_over_tmpfs", "scale/store_write", {"device": "cuda", "tmpfs": "True"}, "ratio", ">=", 0.8),
)


def _selects(record: dict, fields: dict) -> bool:
    for key, want in fields.items():
        got = str(record.get(key))
        if not (got.startswith(want[:-1]) if want.endswith("*") else got == want):
            return False
    return True


def targets(args: argparse.Namespace) -> int:
    """One line per target of the call's GPU acceptance (``TARGETS``): the measured value (the last
    record that matches), the limit and the verdict; exit 1 when one is missed or was not measured."""
    lines = read_lines(args.figures)
    records, missed = [], []
    for call, target, name, fields, key, op, limit in TARGETS:
        if call != args.call:
            continue
        found = [r for r in lines if r.get("name") == name and _selects(r, fields) and r.get(key) is not None]
        value = float(found[-1][key]) if found else None
        met = value is not None and {">=": value >= limit, ">": value > limit, "<=": value <= limit}[op]
        verdict = "met" if met else ("not measured" if value is None else "missed")
        records.append({"name": f"gpu_check/target/{target}", "unit": "", "value": value, "figure": name,
                        "field": key, "limit": f"{op} {limit}", "verdict": verdict})
        if not met:
            missed.append(target)
        print(f"gpu-check: target {target}: {value} ({op} {limit}): {verdict}")
    append(args.figures, *records)
    return 1 if missed else 0


def finish(args: argparse.Namespace) -> int:
    """Tag every line with the GPU and torch of the device line; the summary; exit 1 if a stage
    did not finish ok."""
    lines = read_lines(args.figures)
    dev = next((r for r in lines if r.get("name") == "gpu_check/device"), {})
    tag = {"gpu": dev.get("gpu") or dev.get("device"), "torch": dev.get("torch")}
    tagged = [{**r, **{k: v for k, v in tag.items() if k not in r}} for r in lines]
    tmp = Path(f"{args.figures}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in tagged), encoding="utf-8")
    os.replace(tmp, args.figures)
    stages = [{"stage": r["name"].split("/", 2)[2], **{k: r[k] for k in ("status", "rc", "value", "box_s")}}
              for r in lines if r.get("name", "").startswith("gpu_check/stage/")]
    bad = [s["stage"] for s in stages if s["status"] not in ("ok", "dry-run")]
    summary = {"device": {k: v for k, v in dev.items() if k not in ("name", "unit")}, "stages": stages,
               "not_ok": bad, "figures": len(lines)}
    Path(args.summary).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    for s in stages:
        print(f"  {s['stage']:<22} {s['status']:<8} rc={s['rc']:<4} {s['value']:>7.1f} s (box {s['box_s']} s)")
    print(f"gpu-check: {len(lines)} figure lines in {args.figures}; stages not ok: {bad or 'none'}")
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("device")
    p.add_argument("figures")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(fn=device)
    p = sub.add_parser("stage")
    for name, kind in (("figures", str), ("stage", str), ("status", str), ("rc", int), ("seconds", float),
                       ("box", int)):
        p.add_argument(name, type=kind)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(fn=stage)
    p = sub.add_parser("tests")
    p.add_argument("junit")
    p.add_argument("figures")
    p.set_defaults(fn=tests)
    p = sub.add_parser("train")
    p.add_argument("run_dir")
    p.add_argument("figures")
    p.add_argument("--label", required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.set_defaults(fn=train)
    p = sub.add_parser("compare")
    p.add_argument("reference")
    p.add_argument("candidate")
    p.add_argument("figures")
    p.add_argument("--label", required=True)
    p.add_argument("--identical", action="store_true")
    p.set_defaults(fn=compare)
    p = sub.add_parser("clock")
    p.add_argument("clock")
    p.add_argument("figures")
    p.add_argument("--label", required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.set_defaults(fn=clock)
    p = sub.add_parser("targets")
    p.add_argument("figures")
    p.add_argument("--call", required=True, choices=sorted({t[0] for t in TARGETS}))
    p.set_defaults(fn=targets)
    p = sub.add_parser("finish")
    p.add_argument("figures")
    p.add_argument("summary")
    p.set_defaults(fn=finish)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "command", None) and args.command[0] == "--":
        args.command = args.command[1:]
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
