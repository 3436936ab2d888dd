"""Every run its own: the run fingerprint, the resume policy, sweep folders and the sweep summary,
provenance on every number, and the same command giving the same run.

Unit tests check the identity against hand-computed values; the end-to-end tests run the real
``captioning-train`` (and Hydra's sweepers and launchers) in subprocesses.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import data_overrides, make_tiny_image_dataset, run_cli

from captioning.errors import ConfigError
from captioning.train.identity import (
    CONTINUATION_KEYS,
    decide_resume,
    describe,
    fingerprint,
    hold_run_folder,
    identity,
    identity_diff,
    normalise_resume,
)

# ------------------------------------------------------------------------------------ the identity

CONFIG = {
    "seed": 0,
    "optim": {"lr": 0.001},
    "trainer": {"max_epochs": 2, "precision": "32-true", "devices": 1},
    "data": {"root": "/data/a", "batch_size": 8, "num_workers": 2},
    "logger": {"csv": {"_target_": "x"}},
    "run_name": "r",
    "output_dir": "/out/r",
}


def test_identity_is_the_config_without_the_continuation_keys():
    assert identity(CONFIG) == {"seed": 0, "optim": {"lr": 0.001}, "trainer": {"precision": "32-true"},
                                "data": {"batch_size": 8}}
    assert CONFIG["trainer"]["max_epochs"] == 2  # the input is not modified


def test_fingerprint_is_the_short_sha256_of_the_canonical_identity():
    canonical = '{"data":{"batch_size":8},"optim":{"lr":0.001},"seed":0,"trainer":{"precision":"32-true"}}'
    assert fingerprint(CONFIG) == hashlib.sha256(canonical.encode()).hexdigest()[:10]


def test_what_continues_a_run_keeps_its_fingerprint_and_what_changes_it_does_not():
    base = fingerprint(CONFIG)
    continued = json.loads(json.dumps(CONFIG))
    continued["trainer"].update(max_epochs=30, devices=4)
    continued["data"].update(root="/moved", num_workers=8)
    continued["output_dir"] = "/elsewhere"
    assert fingerprint(continued) == base
    for dotted, value in (("optim.lr", 0.005), ("seed", 1), ("data.batch_size", 16), ("trainer.precision", "bf16")):
        other = json.loads(json.dumps(CONFIG))
        *parents, leaf = dotted.split(".")
        node = other
        for p in parents:
            node = node[p]
        node[leaf] = value
        assert fingerprint(other) != base, dotted


def test_every_continuation_key_says_why():
    assert all(isinstance(why, str) and len(why) > 10 for why in CONTINUATION_KEYS.values())
    assert {"trainer.max_epochs", "trainer.devices", "data.num_workers", "logger", "callbacks"} <= set(CONTINUATION_KEYS)


def test_identity_diff_names_the_keys_that_differ():
    new = json.loads(json.dumps(CONFIG))
    new["optim"]["lr"] = 0.005
    new["seed"] = 3
    new["trainer"]["max_epochs"] = 9  # a continuation key: not a difference
    diff = identity_diff(CONFIG, new)
    assert diff == {"optim.lr": (0.001, 0.005), "seed": (0, 3)}
    assert describe(diff) == "optim.lr 0.001 -> 0.005, seed 0 -> 3"
    new["extra"] = {"k": 1}
    assert "extra.k (absent) -> 1" in describe(identity_diff(CONFIG, new))
    assert "extra.k" not in identity_diff(CONFIG, new, common_only=True)


def test_resume_policies(tmp_path):
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    same = {"config": CONFIG, "run": {"fingerprint": fingerprint(CONFIG)}}
    other = json.loads(json.dumps(CONFIG))
    other["optim"]["lr"] = 0.01
    assert decide_resume("auto", last, CONFIG, None) is False  # nothing there: a fresh run
    assert decide_resume("auto", last, CONFIG, same) is True
    assert decide_resume("must", last, CONFIG, same) is True
    with pytest.raises(ConfigError, match=r"resume=must: nothing to resume in .*run"):
        decide_resume("must", last, CONFIG, None)
    with pytest.raises(ConfigError, match="resume=never: .* already holds a run"):
        decide_resume("never", last, CONFIG, same)
    with pytest.raises(ConfigError, match=r"holds another run .*: optim.lr 0.01 -> 0.001\); to continue it"):
        decide_resume("auto", last, CONFIG, {"config": other, "run": {"fingerprint": fingerprint(other)}})
    # a checkpoint written before run identity: compared on the keys both configs have
    legacy = json.loads(json.dumps(CONFIG))
    del legacy["data"]["batch_size"]
    assert decide_resume("auto", last, CONFIG, {"config": legacy, "run": None}) is True
    with pytest.raises(ConfigError, match="optim.lr"):
        decide_resume("auto", last, CONFIG, {"config": other, "run": None})


def test_a_run_folder_is_held_by_one_process_at_a_time(tmp_path):
    run = tmp_path / "run"
    with hold_run_folder(run):
        assert run.is_dir()
        with pytest.raises(ConfigError, match=r"run is being trained by another process .* Nothing was changed"):
            with hold_run_folder(run):  # another open of the folder: as another process would
                pass
        with hold_run_folder(run, rank=1):  # a DDP rank other than zero: its parent holds the folder
            pass
    with hold_run_folder(run):  # released when the holder's block ends
        started, ready = os.pipe()
        child = os.fork()  # e.g. a DataLoader worker, alive after its parent let go
        if child == 0:
            os.write(ready, b"1")  # the fork handlers have run
            time.sleep(5)
            os._exit(0)
        os.read(started, 1)
    try:
        with hold_run_folder(run):  # the child did not keep the folder held
            pass
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


def test_resume_values_of_older_configs():
    assert [normalise_resume(v) for v in (True, "true", False, "False", "must", "NEVER")] == [
        "auto", "auto", "never", "never", "must", "never"]
    with pytest.raises(ConfigError, match="resume='sometimes': use auto"):
        normalise_resume("sometimes")


# ---------------------------------------------------------------------------- through the real CLI

FAST = ["model=soft_attention", "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16",
        "trainer=cpu", "debug=tiny", "logger=csv", "callbacks.progress=null", "trainer.enable_progress_bar=false"]
STEPS = 10  # debug=tiny: 2 epochs x 5 batches


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    return make_tiny_image_dataset(tmp_path_factory.mktemp("identity") / "tiny")


def args(data: dict, *extra: str) -> list[str]:
    return [*data_overrides(data["root"], data["features_dir"]), *FAST, *extra]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def summary_rows(sweep: Path) -> list[dict]:
    with open(sweep / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_a_sweep_trains_every_job_in_its_own_folder(tiny, tmp_path, launcher):
    """``captioning-train -m ... optim.lr=1e-3,1e-4``: two folders, each trained its full budget, different
    weights; the summary lists both with their own val CIDEr and says what differs."""
    sweep = tmp_path / "lr"
    extra = [] if launcher == "basic" else [f"hydra/launcher={launcher}"]
    run_cli("train", "-m", *args(tiny, "optim.lr=1e-3,1e-4", f"hydra.sweep.dir={sweep}", *extra),
            env={"OMP_NUM_THREADS": "1"})
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "train_summary.json").is_file())
    assert len(runs) == 2, sorted(p.name for p in sweep.iterdir())
    summaries = [json.loads((r / "train_summary.json").read_text()) for r in runs]
    for run, s in zip(runs, summaries, strict=True):
        assert s["global_step"] == STEPS  # each job trained its own budget: nothing was resumed
        assert run.name == f"tiny-soft_attention-additive-s0-{s['fingerprint']}"
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert ckpt["run"]["fingerprint"] == s["fingerprint"]
    assert summaries[0]["fingerprint"] != summaries[1]["fingerprint"]
    a, b = (weights(r) for r in runs)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    rows = summary_rows(sweep)
    assert sorted(r["differs"] for r in rows) == ["optim.lr=0.0001", "optim.lr=0.001"]
    for row in rows:
        mine = json.loads((Path(row["run_dir"]) / "train_summary.json").read_text())
        assert row["status"] == "COMPLETED" and float(row["best_val_CIDEr"]) == pytest.approx(mine["best_val_CIDEr"])
        assert row["fingerprint"] == mine["fingerprint"] and int(row["global_step"]) == STEPS
    assert (sweep / "summary.md").read_text().count("| COMPLETED |") == 2


@pytest.mark.slow
def test_a_rerun_with_another_setting_is_refused_and_leaves_the_folder_as_it_was(tiny, tmp_path):
    run = tmp_path / "run"
    run_cli("train", *args(tiny, "optim.lr=1e-3", f"hydra.run.dir={run}"), env={"OMP_NUM_THREADS": "1"})
    before = snapshot(run)
    proc = run_cli("train", *args(tiny, "optim.lr=5e-3", f"hydra.run.dir={run}"), check=False,
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "holds another run" in errors[0] and "optim.lr 0.001 -> 0.005" in errors[0]
    assert "run_name=<name>" in errors[0]  # the way forward
    assert snapshot(run) == before  # byte for byte, no file added
    with hold_run_folder(run):  # the same run, while another process trains it: refused, nothing written
        proc = run_cli("train", *args(tiny, "optim.lr=1e-3", f"hydra.run.dir={run}"), check=False,
                       env={"OMP_NUM_THREADS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "is being trained by another process" in errors[0]
    assert snapshot(run) == before
    # the same settings with a larger budget continue it
    proc = run_cli("train", *args(tiny, "optim.lr=1e-3", "trainer.max_epochs=3", f"hydra.run.dir={run}"),
                   env={"OMP_NUM_THREADS": "1"})
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'} (step {STEPS})" in proc.stdout + proc.stderr
    assert json.loads((run / "train_summary.json").read_text())["global_step"] == STEPS + 5


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_weights_and_metrics(tiny, tmp_path):
    """Seeded data order, loader workers and dropout: identical bits on one machine at one thread count."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        run_cli("train", *args(tiny, "data.num_workers=2", f"hydra.run.dir={run}"), env={"OMP_NUM_THREADS": "2"})
    a, b = (weights(r) for r in runs)
    assert all(torch.equal(a[k], b[k]) for k in a)
    ma, mb = (json.loads((r / "train_summary.json").read_text())["metrics"] for r in runs)
    assert ma == mb and "val/CIDEr" in ma


@pytest.mark.slow
def test_provenance_and_the_parent_run_of_a_second_stage(tiny, tmp_path):
    first, second = tmp_path / "xe", tmp_path / "scst"
    run_cli("train", *args(tiny, f"hydra.run.dir={first}"), env={"OMP_NUM_THREADS": "1"})
    xe = json.loads((first / "train_summary.json").read_text())
    prov = xe["provenance"]
    assert prov["version"] and prov["torch"] == str(torch.__version__) and prov["run"] == xe["fingerprint"]
    assert isinstance(prov["git_dirty"], bool) and len(prov["git_commit"]) == 40  # run from a checkout
    assert len(prov["store_id"]) == 10 and prov["threads"] == 1
    assert (first / ".hydra" / "config.yaml").is_file() and (first / "train.log").is_file()
    run_cli("train", *args(tiny, "stage=scst", "scst.samples=2", "trainer.max_epochs=1",
                           f"init_from={first / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={second}"),
            env={"OMP_NUM_THREADS": "1"})
    scst = json.loads((second / "train_summary.json").read_text())
    assert scst["parent"]["fingerprint"] == xe["fingerprint"] and scst["parent"]["step"] == STEPS
    assert torch.load(second / "checkpoints" / "last.ckpt", weights_only=True)["run"]["parent"] == scst["parent"]
    # every evaluation and caption output names the run it came from
    ev, cap = tmp_path / "eval", tmp_path / "captions"
    run_cli("evaluate", f"ckpt_path={second / 'checkpoints' / 'last.ckpt'}", "split=val", "metrics=[bleu,cider]",
            f"output_dir={ev}", "num_workers=0", "trainer.enable_progress_bar=false", f"hydra.run.dir={ev}/hydra")
    record = json.loads((ev / "provenance.json").read_text())
    assert record["run"] == scst["fingerprint"] and record["checkpoints"][0]["fingerprint"] == scst["fingerprint"]
    assert record["store_id"] == prov["store_id"] and record["git_commit"] == prov["git_commit"]
    for name in ("results.json", "metrics.json", "predictions.json"):
        assert record["files"][name] == hashlib.sha256((ev / name).read_bytes()).hexdigest()
    assert json.loads((ev / "report.json").read_text())["meta"]["provenance"]["run"] == scst["fingerprint"]
    run_cli("caption", f"ckpt_path={first / 'checkpoints' / 'last.ckpt'}", "store_split=test", "max_items=2",
            f"output_dir={cap}", "device=cpu", "num_workers=0", "progress=false", f"hydra.run.dir={cap}/hydra",
            check=False)  # the tiny store records no preprocessing to draw figures with: entries fail, captions stand
    record = json.loads((cap / "provenance.json").read_text())
    assert record["checkpoints"][0]["fingerprint"] == xe["fingerprint"]
    assert record["files"]["captions.json"] == hashlib.sha256((cap / "captions.json").read_bytes()).hexdigest()


@pytest.mark.slow
def test_resume_must_without_a_checkpoint_fails_in_one_line(tiny, tmp_path):
    proc = run_cli("train", *args(tiny, "resume=must", f"hydra.run.dir={tmp_path / 'new'}"), check=False)
    assert proc.returncode == 2
    assert "resume=must: nothing to resume" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_a_failed_sweep_job_is_a_row_with_its_error_and_the_others_train(tiny, tmp_path):
    sweep = tmp_path / "sweep"
    proc = run_cli("train", "-m", *args(tiny, "model.dropout=0.1,1.5", f"hydra.sweep.dir={sweep}"), check=False,
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0  # the sweep says something failed
    ok, bad = sorted(summary_rows(sweep), key=lambda r: r["job"])
    assert ok["status"] == "COMPLETED" and int(ok["global_step"]) == STEPS and ok["differs"] == "model.dropout=0.1"
    assert bad["status"] == "FAILED" and bad["differs"] == "model.dropout=1.5"
    assert bad["error"] == "JobFailed: model.dropout must be in [0, 1] (got 1.5)"
