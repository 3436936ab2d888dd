"""Jobs killed or starved of disk at every commit step, through the real CLIs.

Every output that matters is committed by ``captioning.utils.io.atomic_write``: the bytes go to a
temp file beside the target (1), which is fsynced (2) and renamed over the final name (3); a
FeatureStore shard commits its data file that way and then its index the same way, the index
being the commit point.  ``inject/sitecustomize.py`` puts a SIGKILL or a full disk (ENOSPC) at
each step: at a random byte inside the write, before and after the fsync, before and after the
rename (for a shard's data file, "after" is the window before its index), and a SIGKILL after a
chosen optimizer step.  Nothing polls or sleeps: each fault hits the event it names.

Each job is run as a chain: the same command again and again, each run meeting the next fault a
little further on, until a run without a fault completes the job.  After every faulted run the
tests check that the process died of SIGKILL, or exited 2 with one ``error:`` line and no
traceback; that what was committed before is intact and equal to an uninterrupted run's, and no
partial file sits under a final name; that the leftovers of the fault before are gone and the
only temp file is the one this fault interrupted; that the run resumed (a training run logs
``resuming from <last.ckpt> (step k)`` and takes exactly the optimizer steps left, a feature
shard committed before is not written again).  The completed job must equal the uninterrupted
run exactly: the same feature shard files byte for byte, bit-identical weights, the same CSV log
row by row, the same results files.

The faulted jobs run in processes forked from ``forkserver.py`` (no 10 s of imports per job); the
uninterrupted references of extraction and training are plain ``python -m`` processes, so the
chains' byte-exact equality also shows that a forked job computes what a fresh one does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import REPO, data_overrides, make_tiny_image_dataset, run_cli
from faultlib import (
    check_csv_rows,
    check_full_disk,
    csv_rows,
    fault_env,
    killed,
    optimizer_steps,
    probe_events,
    resumed_from,
    same_files,
    state_dicts_equal,
    temp_files,
    write_offset,
)
from forkserver import ForkServer
from test_extract import image_cli_args, make_images

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    server = ForkServer(REPO, tmp_path_factory.mktemp("jobs"))
    yield server
    server.close()


def with_probe(env: dict, folder: Path) -> dict:
    return {**env, "CAPTIONING_PROBE_DIR": str(folder)}


def point_at(point: str, key: str, size: int) -> str:
    """``write@K`` with K drawn inside a ``size``-byte write, else the point as it is."""
    return f"write@{write_offset(key, size)}" if point == "write" else point


BEFORE_COMMIT = {"write", "fsync", "fsynced", "replace"}  # a kill there leaves the temp file


# ------------------------------------------------------------------------------ extraction

SHARD = 2
FILES = ("npy", "index.json")  # a shard's data file, then its index: the commit point
KILLS = [("kill", p, f) for f in FILES for p in ("write", "fsync", "fsynced", "replace", "replaced")]
FULL_DISKS = [("enospc", p, f) for f in FILES for p in ("write", "fsync", "replace")]
N_IMAGES = SHARD * (len(KILLS) + 2)  # each faulted run commits one shard (two: killed after an index)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict:
    """``N_IMAGES`` images and their store from an uninterrupted extraction (a plain CLI process)."""
    from captioning.store.feature_store import FeatureStore

    root = tmp_path_factory.mktemp("images")
    make_images(root / "d", N_IMAGES)
    run_cli("extract", *extract_args(root / "d", root / "reference"))
    ids = FeatureStore.open(root / "reference").ids
    assert len(ids) == N_IMAGES and len(shard_files(root / "reference")[0]) == N_IMAGES // SHARD * 2
    return {"data": root / "d", "reference": root / "reference", "ids": ids}


def extract_args(data: Path, store: Path) -> list[str]:
    return image_cli_args(data, store, "batch_size=2", f"shard_size={SHARD}", "trainer.enable_progress_bar=false")


def shard_files(store: Path) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """(name -> (inode, mtime_ns) of every committed shard file, the other files) in ``shards/``.

    A shard is committed when its index exists; rank lock files are not listed."""
    shards = store / "shards"
    if not shards.is_dir():
        return {}, []
    names = [p.name for p in shards.iterdir() if not p.name.endswith(".lock")]
    indexes = {n for n in names if n.startswith("r") and n.endswith(".index.json")}
    committed = {n for n in names if n in indexes or n.replace(".npy", ".index.json") in indexes}
    stamps = {n: ((shards / n).stat().st_ino, (shards / n).stat().st_mtime_ns) for n in committed}
    return stamps, sorted(set(names) - committed)


def extraction_chain(jobs, images: dict, store: Path, faults: list[tuple[str, str, str]]) -> None:
    """Run the extraction into ``store`` once per fault, then to the end; check every step."""
    from captioning.store.feature_store import FeatureStore

    ref = images["reference"]
    args = extract_args(images["data"], store)
    for action, point, suffix in faults:
        case = f"{action} at {point} of a shard's {suffix}"
        before, _ = shard_files(store)
        seq = len(before) // 2 + 1  # this run commits shard seq-1, then meets the fault on shard seq
        name = f"r000-{seq:06d}.{suffix}"
        spec = point_at(point, case, (ref / "shards" / name).stat().st_size)
        proc = jobs.run("extract", *args, env=fault_env(action, spec, name), check=False)
        if action == "kill":
            assert killed(proc), (case, proc.returncode, proc.stderr[-3000:])
        else:
            check_full_disk(proc, "cannot write feature shard", f"r000-{seq:06d}.npy", "disk is full")

        after, leftovers = shard_files(store)
        assert len(after) // 2 == seq + (point == "replaced" and suffix == "index.json"), case
        for old, stamp in before.items():  # shards committed before were skipped, not written again
            assert after[old] == stamp, (case, old)
        for new in after:  # and every committed file equals the uninterrupted run's, byte for byte
            assert (store / "shards" / new).read_bytes() == (ref / "shards" / new).read_bytes(), (case, new)
        assert FeatureStore.open(store).ids == images["ids"][: SHARD * (len(after) // 2)], case
        # what this fault left, and nothing of what the fault before left: the interrupted temp
        # file, and a data file without its index (invisible; the next run removes both)
        expected = []
        if action == "kill" and point in BEFORE_COMMIT:
            expected.append(f".{name}.*.tmp")
        if action == "kill" and (suffix == "index.json") != (point == "replaced"):
            expected.append(f"r000-{seq:06d}.npy")
        assert len(leftovers) == len(expected), (case, leftovers)
        for pattern in expected:
            assert any(Path(left).match(pattern) for left in leftovers), (case, leftovers)

    done = SHARD * (len(shard_files(store)[0]) // 2)
    final = jobs.run("extract", *args)
    assert f"{N_IMAGES - done} processed, {done} skipped as done" in final.stdout + final.stderr
    assert temp_files(store) == []
    same_files(store / "shards", ref / "shards", "r*")  # byte for byte: features bit-equal, same shards
    assert (store / "meta.json").read_bytes() == (ref / "meta.json").read_bytes()


def test_extraction_killed_at_every_commit_step(jobs, images, tmp_path):
    extraction_chain(jobs, images, tmp_path / "store", KILLS)


def test_extraction_out_of_disk_at_every_commit_step(jobs, images, tmp_path):
    extraction_chain(jobs, images, tmp_path / "store", FULL_DISKS)


# -------------------------------------------------------------------------------- training

TRAIN = [
    "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16",
    "model.dropout=0.1", "optim.lr=0.01", "optim.warmup_steps=0", "optim.scheduler=none", "logger=csv",
    "callbacks.progress=null", "callbacks.early_stopping=null", "callbacks.attention_images=null",
    "callbacks.checkpoint.save_top_k=0",
    "trainer.log_every_n_steps=1", "trainer.enable_progress_bar=false", "data.num_workers=0",
]
STEPS_PER_EPOCH = 2
# each run resumes, commits one epoch's checkpoint and meets its fault on the next one
TRAIN_FAULTS = [
    *[("kill", p) for p in ("write", "fsync", "fsynced", "replace", "replaced")],
    *[("enospc", p) for p in ("write", "fsync", "replace")],
    ("kill", "step"),  # in the last step of the next epoch: the steps before it are logged
]
EPOCHS = len(TRAIN_FAULTS) + 3  # 'replaced' commits two epochs; the last run trains at least one


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A 48-item dataset and an uninterrupted training run on it (a plain CLI process)."""
    data = make_tiny_image_dataset(tmp_path_factory.mktemp("tiny") / "d", n=48)
    ref = tmp_path_factory.mktemp("reference")
    run_cli("train", *train_args(data, ref))
    return {**data, "reference": ref}


def train_args(data: dict, run_dir: Path, *extra: str, model: str = "soft_attention", epochs: int = EPOCHS,
               limit: int | None = STEPS_PER_EPOCH) -> list[str]:
    return [*data_overrides(data["root"], data["features_dir"]), f"model={model}", *TRAIN,
            f"trainer.max_epochs={epochs}", f"trainer.limit_train_batches={'null' if limit is None else limit}",
            f"hydra.run.dir={run_dir}", *extra]


def load_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def test_training_faults_at_every_checkpoint_step_then_resume(jobs, tiny, tmp_path):
    from captioning.train.checkpoint import load_checkpoint

    run, ref = tmp_path / "run", tiny["reference"]
    last = run / "checkpoints" / "last.ckpt"
    size = (ref / "checkpoints" / "last.ckpt").stat().st_size
    epochs = 0  # committed by the runs so far
    unlogged = []  # epochs whose end a kill cut off right after their checkpoint
    for k, (action, point) in enumerate(TRAIN_FAULTS):
        case = f"{action} at {point} of last.ckpt"
        probe = tmp_path / f"probe{k}"
        if point == "step":  # epoch done and committed, then killed in the last step of the next one
            env = fault_env("kill", "step", n=2 * STEPS_PER_EPOCH - 1)
        else:  # the run's 2nd checkpoint write
            env = fault_env(action, point_at(point, case, size - 4096), "last.ckpt", n=1)
        proc = jobs.run("train", *train_args(tiny, run), env=with_probe(env, probe), check=False)
        if action == "kill":
            assert killed(proc), (case, proc.returncode, proc.stderr[-3000:])
        else:
            check_full_disk(proc, "cannot write checkpoint", "disk is full", "previous checkpoint under that name is intact")
        expected_resume = [(str(last), epochs * STEPS_PER_EPOCH)] if epochs else []
        assert resumed_from(proc) == expected_resume, (case, proc.stderr[-2000:])
        assert optimizer_steps(probe) == 2 * STEPS_PER_EPOCH, case
        epochs += 2 if point == "replaced" else 1
        if point == "replaced":
            unlogged.append(epochs - 1)
        ckpt = load_checkpoint(last)  # whole, and the one of the last committed epoch
        assert ckpt["global_step"] == epochs * STEPS_PER_EPOCH, case
        leftovers = [p.name for p in last.parent.iterdir() if p.name != "last.ckpt"]
        if action == "kill" and point in BEFORE_COMMIT:
            assert len(leftovers) == 1 and Path(leftovers[0]).match(".last.ckpt.*.tmp"), (case, leftovers)
        else:
            assert leftovers == [], (case, leftovers)
        assert not (run / "train_summary.json").exists()
        check_csv_rows(csv_rows(run))
        if point == "step":  # the log holds a step past the checkpoint, which the re-run redoes
            assert max(int(r["step"]) for r in csv_rows(run)) >= ckpt["global_step"], case

    probe = tmp_path / "probe-final"
    final = jobs.run("train", *train_args(tiny, run), env={"CAPTIONING_PROBE_DIR": str(probe)})
    resumed_at = epochs * STEPS_PER_EPOCH
    assert resumed_from(final) == [(str(last), resumed_at)] and resumed_at > 0
    assert optimizer_steps(probe) == EPOCHS * STEPS_PER_EPOCH - resumed_at  # only the steps left
    assert temp_files(run) == []
    rows, ref_rows = csv_rows(run), csv_rows(ref)
    check_csv_rows(rows)
    # Row by row: the same steps once each, the same values.  The one row a resume cannot give
    # back is the epoch mean of the loss (``train/loss_epoch``) of an epoch killed between its
    # checkpoint (written when validation ends) and its end: Lightning does not checkpoint epoch
    # aggregates and resumes after that epoch.  The step losses it averages are all there.
    lost = [r for r in ref_rows if r not in rows]
    assert [int(r["epoch"]) for r in lost] == unlogged
    assert all(r["train/loss_epoch"] and not r["train/loss_step"] for r in lost)
    assert rows == [r for r in ref_rows if r not in lost]
    state_dicts_equal(load_weights(run), load_weights(ref))
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["global_step"] == json.loads((ref / "train_summary.json").read_text())["global_step"]


RESUME_VARIANTS = {
    # train_args keywords and overrides, optimizer steps per epoch, the step in which the job is
    # killed: two steps past a checkpoint, so that the CSV log holds one step the re-run must redo
    "hard_attention": ({"model": "hard_attention", "epochs": 3, "limit": 3}, [], 3, 8),
    # the shapes of test_train_cli's compiled run: 32 items x 3 captions, per-image batches of 5 items (15 captions) and a
    # last one of 2 padded to them, one graph (cached by inductor)
    "compile": ({"epochs": 2, "limit": None}, ["compile=true", "model.dropout=0.0", "data.batch_size=16",
                                               "data.max_length=5"], 7, 9),
}


@pytest.mark.parametrize("variant", sorted(RESUME_VARIANTS))
def test_resume_after_sigkill_trains_only_the_remaining_steps(jobs, tiny, tmp_path, variant):
    """A restart from step 0 would give the same weights (training is seeded): what tells a resume
    apart is the checkpoint the killed job left, the re-run's ``resuming from`` line, and the
    number of optimizer steps the re-run takes."""
    from captioning.train.checkpoint import load_checkpoint

    keywords, extra, per_epoch, kill_after = RESUME_VARIANTS[variant]
    total = keywords["epochs"] * per_epoch
    ref, run = tmp_path / "reference", tmp_path / "run"
    jobs.run("train", *train_args(tiny, ref, *extra, **keywords))
    assert json.loads((ref / "train_summary.json").read_text())["global_step"] == total
    last = run / "checkpoints" / "last.ckpt"
    broken = jobs.run("train", *train_args(tiny, run, *extra, **keywords), check=False,
                      env=with_probe(fault_env("kill", "step", n=kill_after - 1), tmp_path / "p1"))
    assert killed(broken), broken.stderr[-3000:]
    assert optimizer_steps(tmp_path / "p1") == kill_after
    at = kill_after // per_epoch * per_epoch
    assert load_checkpoint(last)["global_step"] == at > 0  # committed whole before the kill
    assert not (run / "train_summary.json").exists()
    assert max(int(r["step"]) for r in csv_rows(run)) >= at  # logged steps that the re-run redoes

    again = jobs.run("train", *train_args(tiny, run, *extra, **keywords),
                     env={"CAPTIONING_PROBE_DIR": str(tmp_path / "p2")})
    assert resumed_from(again) == [(str(last), at)]
    assert optimizer_steps(tmp_path / "p2") == total - at
    rows, ref_rows = csv_rows(run), csv_rows(ref)
    check_csv_rows(rows)
    if variant != "compile":
        assert rows == ref_rows
        state_dicts_equal(load_weights(run), load_weights(ref))
        return
    # Compiled kernels are not bit-reproducible from one compilation to the next (a cold compile
    # and an inductor cache hit differ in the last bits), so values agree to float32 precision.
    assert [{k: bool(v) for k, v in r.items() if k != "step"} | {"step": r["step"]} for r in rows] == \
        [{k: bool(v) for k, v in r.items() if k != "step"} | {"step": r["step"]} for r in ref_rows]
    for mine, theirs in zip(rows, ref_rows, strict=True):
        for key, value in theirs.items():
            if value and key not in ("step", "epoch"):
                assert float(mine[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-7), (mine["step"], key)
    a, b = load_weights(run), load_weights(ref)
    assert sorted(a) == sorted(b)
    for k in b:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ evaluation

PLOT = "metrics_by_length.png"
# in the order the job writes its files, so that every run rewrites the file the fault before hit
EVAL_FAULTS = [
    ("kill", "write", "results.json"),
    ("kill", "write", "metrics.json"),
    # the attention rows first: predictions.json never points into an older attention.npy
    *[("kill", p, "attention.npy") for p in ("write", "replaced")],
    ("enospc", "write", "attention.npy"),
    *[("kill", p, "predictions.json") for p in ("write", "fsync", "fsynced", "replace", "replaced")],
    *[("enospc", p, "predictions.json") for p in ("write", "fsync", "replace")],
    ("kill", "write", PLOT),
    ("enospc", "write", PLOT),
    ("kill", "write", "report.json"),
    ("kill", "write", "report.md"),
    ("enospc", "write", "report.md"),
]
OUTPUTS = ("results.json", "metrics.json", "attention.npy", "predictions.json", PLOT, "report.json", "report.md", "provenance.json")


def evaluate_args(ckpt: Path, out: Path) -> list[str]:
    return [f"ckpt_path={ckpt}", "split=test", "decode=beam", "decode.beam_size=3", "metrics=[bleu,rouge,cider]",
            f"output_dir={out}", "num_workers=0", "trainer.enable_progress_bar=false", f"hydra.run.dir={out}/hydra"]


def test_evaluation_faults_at_every_commit_step(jobs, tiny, tmp_path):
    ckpt = tiny["reference"] / "checkpoints" / "last.ckpt"
    clean, out = tmp_path / "clean", tmp_path / "eval"
    jobs.run("evaluate", *evaluate_args(ckpt, clean))
    assert same_files(clean, clean) == sorted(OUTPUTS)
    args = evaluate_args(ckpt, out)
    for action, point, name in EVAL_FAULTS:
        case = f"{action} at {point} of {name}"
        spec = point_at(point, case, (clean / name).stat().st_size)
        proc = jobs.run("evaluate", *args, env=fault_env(action, spec, name), check=False)
        if action == "kill":
            assert killed(proc), (case, proc.returncode, proc.stderr[-3000:])
        else:
            line = check_full_disk(proc, "No space left on device", f"while writing {out / name};")
            assert ".tmp" not in line, line
        written = OUTPUTS[: OUTPUTS.index(name) + (point == "replaced")]
        for p in out.iterdir():  # every final name holds a whole file, equal to the clean run's
            if p.is_file() and not p.name.startswith("."):
                assert p.read_bytes() == (clean / p.name).read_bytes(), (case, p.name)
        assert all((out / w).is_file() for w in written), case
        temps = [p.name for p in temp_files(out)]
        if action == "kill" and point in BEFORE_COMMIT:
            assert len(temps) == 1 and Path(temps[0]).match(f".{name}.*.tmp"), (case, temps)
        else:
            assert temps == [], (case, temps)

    jobs.run("evaluate", *args)
    assert temp_files(out) == []
    same_files(out, clean)


def test_probe_records_what_the_process_did(jobs, tmp_path):
    """The probe sees a process that never trains (no optimizer step) as exactly that."""
    proc = jobs.run("train", "--cfg", "job", env={"CAPTIONING_PROBE_DIR": str(tmp_path / "p")})
    assert "model:" in proc.stdout
    events = probe_events(tmp_path / "p")
    assert len(events) == 1 and [e["event"] for e in next(iter(events.values()))] == ["start"]


def test_repo_has_no_fault_hooks():
    """The injection lives in the tests only: the package never reads the fault variables."""
    for path in (REPO / "captioning").rglob("*.py"):
        text = path.read_text()
        assert "CAPTIONING_FAULT" not in text and "CAPTIONING_PROBE" not in text, path
