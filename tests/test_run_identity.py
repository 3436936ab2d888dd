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
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import data_overrides, make_tiny_image_dataset, run_cli

from captioning.errors import ConfigError
from captioning.train.identity import (
    CONTINUATION_KEYS,
    IDENTITY_VERSION,
    describe,
    fingerprint,
    identity,
    identity_diff,
    identity_table,
    run_config,
)
from captioning.train.run_folder import (
    RECORD_NAME,
    decide_resume,
    hold_run_folder,
    normalise_resume,
    read_record,
    run_entry,
    world_size,
    write_record,
)

REPO = Path(__file__).resolve().parents[1]

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


def changed(config: dict, **dotted) -> dict:
    """A deep copy of ``config`` with ``a__b=value`` set at ``a.b``."""
    out = json.loads(json.dumps(config))
    for key, value in dotted.items():
        *parents, leaf = key.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def test_identity_is_the_config_without_what_may_change_while_continuing():
    # the cosine schedule (the default) spans the budget: the budget is part of the run
    assert identity(CONFIG) == {"seed": 0, "optim": {"lr": 0.001}, "data": {"batch_size": 8},
                                "trainer": {"max_epochs": 2, "precision": "32-true", "devices": 1}}
    # a fixed schedule: more epochs continue the run
    fixed = changed(CONFIG, optim__schedule_steps=100)
    assert identity(fixed)["trainer"] == {"precision": "32-true", "devices": 1}
    assert identity(changed(CONFIG, optim__scheduler="none"))["trainer"] == {"precision": "32-true", "devices": 1}
    assert CONFIG["trainer"]["max_epochs"] == 2  # the input is not modified


def test_fingerprint_is_the_short_sha256_of_the_canonical_identity():
    canonical = ('{"data":{"batch_size":8},"optim":{"lr":0.001},"seed":0,'
                 '"trainer":{"devices":1,"max_epochs":2,"precision":"32-true"}}')
    assert fingerprint(CONFIG) == hashlib.sha256(canonical.encode()).hexdigest()[:10]


CALLBACKS = {
    "checkpoint": {"_target_": "ResumableCheckpoint", "dirpath": "/out/r/checkpoints", "filename": "e{epoch}",
                   "monitor": "val/CIDEr", "mode": "max", "save_top_k": 1, "save_last": True},
    "early_stopping": {"_target_": "EarlyStopping", "monitor": "val/CIDEr", "patience": 5},
    "lr_monitor": {"_target_": "LearningRateMonitor"},
    "progress": {"_target_": "progress_bar", "bar": "rich"},
}


@pytest.mark.parametrize(("what", "dotted", "same"), [
    ("a moved dataset", {"data__root": "/moved", "data__grounding": "/moved/g.json", "features_dir": "/moved/f"}, True),
    ("loader workers", {"data__num_workers": 8}, True),
    ("another machine", {"trainer__accelerator": "gpu", "trainer__strategy": "ddp"}, True),
    ("the run folder", {"output_dir": "/elsewhere", "callbacks__checkpoint__dirpath": "/elsewhere/checkpoints"}, True),
    ("what is shown", {"callbacks__progress__bar": "tqdm", "callbacks__lr_monitor": None, "logger": {}}, True),
    ("a list of two devices is two", {"trainer__devices": [0, 1]}, False),
    ("the budget of a schedule that spans it", {"trainer__max_epochs": 30}, False),
    ("the schedule's length", {"optim__schedule_steps": 100}, False),
    ("the devices: the global batch", {"trainer__devices": 2}, False),
    ("the nodes: the global batch", {"trainer__num_nodes": 2}, False),
    ("the store's identity", {"store_id": "0123456789"}, False),
    ("the checkpoint's monitor", {"callbacks__checkpoint__monitor": "val/BLEU_4"}, False),
    ("early stopping", {"callbacks__early_stopping__patience": 2}, False),
    ("early stopping off", {"callbacks__early_stopping": None}, False),
    ("SWA", {"callbacks__swa": {"_target_": "StochasticWeightAveraging", "swa_lrs": 1e-4}}, False),
    ("the learning rate", {"optim__lr": 0.005}, False),
    ("the per-process batch", {"data__batch_size": 16}, False),
])
def test_what_continues_a_run_keeps_its_fingerprint_and_what_is_the_run_changes_it(what, dotted, same):
    base = {**CONFIG, "callbacks": CALLBACKS, "store_id": "abcdef0123"}
    assert (fingerprint(changed(base, **dotted)) == fingerprint(base)) is same, what


def test_a_fixed_schedule_lets_the_budget_change_and_a_device_list_counts_as_its_length():
    fixed = changed({**CONFIG, "callbacks": CALLBACKS}, optim__schedule_steps=100)
    assert fingerprint(changed(fixed, trainer__max_epochs=30, trainer__max_steps=500)) == fingerprint(fixed)
    assert fingerprint(changed(fixed, trainer__devices=[0, 1])) == fingerprint(changed(fixed, trainer__devices=2))
    off = changed(fixed, callbacks__early_stopping=None)  # a callback turned off is a callback left out
    assert fingerprint(off) == fingerprint({**fixed, "callbacks": {k: v for k, v in CALLBACKS.items()
                                                                    if k != "early_stopping"}})
    swa = changed(fixed, callbacks__swa={"_target_": "x.StochasticWeightAveraging", "swa_epoch_start": 0.75})
    assert fingerprint(changed(swa, trainer__max_epochs=30)) != fingerprint(swa)  # SWA starts at 0.75 x the budget
    swa["callbacks"]["swa"]["swa_epoch_start"] = 3  # from epoch 3: the budget may grow
    assert fingerprint(changed(swa, trainer__max_epochs=30)) == fingerprint(swa)


def test_every_key_decided_says_why_and_names_a_key_of_the_training_config():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import captioning.cli.train  # noqa: F401  (registers the schema and resolvers)
    from captioning.config import to_config
    from captioning.train.job import TrainConfig
    from captioning.train.module import config_dict

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("train", overrides=["callbacks=[default,swa]", "output_dir=/out/r"])
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    config = run_config(config_dict(to_config(OmegaConf.create(container), TrainConfig)))
    keys = set()
    stack = [("", config)]
    while stack:
        prefix, node = stack.pop()
        for k, v in node.items():
            keys.add(prefix + k)
            if isinstance(v, dict):
                stack.append((f"{prefix}{k}.", v))
    assert not [k for k in CONTINUATION_KEYS if k not in keys], "keys decided on that no config has"
    assert all(len(rule.why) > 10 for rule in CONTINUATION_KEYS.values())
    assert {"trainer.max_epochs", "trainer.devices", "data.num_workers", "callbacks.swa", "store_id",
            "data.grounding", "optim.schedule_steps"} <= set(CONTINUATION_KEYS)


def composed_fingerprint(*overrides: str) -> str:
    """The fingerprint ``captioning-train`` gives the real composed config (conf/train.yaml)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import captioning.cli.train  # noqa: F401
    from captioning.config import to_config
    from captioning.train.job import TrainConfig
    from captioning.train.module import config_dict

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("train", overrides=["output_dir=/out/r", *overrides])
    container = OmegaConf.to_container(cfg, resolve=False)
    container.pop("hydra", None)
    return fingerprint(run_config(config_dict(to_config(OmegaConf.create(container), TrainConfig))))


def test_a_moved_dataset_is_the_same_run_in_the_composed_config():
    """data.grounding, data.media_dir, the annotations and features_dir all resolve from data.root."""
    assert composed_fingerprint("data.root=/a/shapes") == composed_fingerprint("data.root=/b/elsewhere/shapes")
    assert composed_fingerprint("data.root=/a/shapes") != composed_fingerprint("data.root=/a/shapes", "seed=1")


def test_the_store_is_part_of_the_run_and_its_path_is_not(tmp_path):
    from captioning.store.layout import store_id

    meta = {"settings": {"backbone": "synthetic"}, "kind": "image", "positions": 4, "dim": 16, "grid": [2, 2],
            "dtype": "float16"}
    for name, settings in (("a", meta["settings"]), ("moved", meta["settings"]), ("b", {"backbone": "other"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({**meta, "settings": settings}))
    a, moved, b = (run_config({**CONFIG, "features_dir": str(tmp_path / n)}) for n in ("a", "moved", "b"))
    assert a["store_id"] == store_id(meta) == moved["store_id"] != b["store_id"]
    assert fingerprint(a) == fingerprint(moved) != fingerprint(b)
    two = run_config({**CONFIG, "features_dir": [str(tmp_path / "a"), str(tmp_path / "b")]})
    assert two["store_id"] == [a["store_id"], b["store_id"]]  # streams: each store's identity
    assert run_config({**CONFIG, "features_dir": str(tmp_path / "none")})["store_id"] is None


def test_identity_diff_names_the_keys_that_differ():
    new = changed(CONFIG, optim__lr=0.005, seed=3, data__num_workers=9)  # workers: not a difference
    diff = identity_diff(CONFIG, new)
    assert diff == {"optim.lr": (0.001, 0.005), "seed": (0, 3)}
    assert describe(diff) == "optim.lr 0.001 -> 0.005, seed 0 -> 3"
    new["extra"] = {"k": 1}
    assert "extra.k (absent) -> 1" in describe(identity_diff(CONFIG, new))
    assert "extra.k" not in identity_diff(CONFIG, new, common_only=True)


def saved(config: dict, processes: int = 1, **run) -> dict:
    return {"config": config, "run": run_entry(config, processes, **run)}


def test_resume_policies(tmp_path):
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    other = changed(CONFIG, optim__lr=0.01)
    assert decide_resume("auto", last, CONFIG, None) is False  # nothing there: a fresh run
    assert decide_resume("auto", last, CONFIG, saved(CONFIG)) is True
    assert decide_resume("must", last, CONFIG, saved(CONFIG)) is True
    with pytest.raises(ConfigError, match=r"resume=must: nothing to resume in .*run"):
        decide_resume("must", last, CONFIG, None)
    with pytest.raises(ConfigError, match="resume=never: .* already holds a run"):
        decide_resume("never", last, CONFIG, saved(CONFIG))
    with pytest.raises(ConfigError, match=r"holds another run \(its last.ckpt: .*: optim.lr 0.01 -> 0.001\); to "
                                          r"continue it"):
        decide_resume("auto", last, CONFIG, saved(other))
    # a checkpoint written before run identity: compared on the keys both configs have
    legacy = json.loads(json.dumps(CONFIG))
    del legacy["data"]["batch_size"]
    assert decide_resume("auto", last, CONFIG, {"config": legacy, "run": None}) is True
    with pytest.raises(ConfigError, match="optim.lr"):
        decide_resume("auto", last, CONFIG, {"config": other, "run": None})


def test_a_record_of_another_run_is_refused_with_or_without_a_checkpoint(tmp_path):
    """The folder's run.json is checked whether or not a checkpoint exists (a run that died before
    its first checkpoint, or trained with callbacks.checkpoint=null)."""
    folder = tmp_path / "run"
    last = folder / "checkpoints" / "last.ckpt"
    write_record(folder, CONFIG, run_entry(CONFIG, 1))
    assert read_record(folder) == saved(CONFIG)
    assert decide_resume("auto", last, CONFIG, None, read_record(folder), 1) is False  # the same run: it starts
    other = changed(CONFIG, seed=1)
    with pytest.raises(ConfigError, match=rf"holds another run \(its {RECORD_NAME}: .*seed 0 -> 1"):
        decide_resume("auto", last, other, None, read_record(folder), 1)
    (folder / RECORD_NAME).write_text("{not json")
    with pytest.raises(ConfigError, match="malformed JSON .* move it away"):
        read_record(folder)


def test_the_world_size_must_match_when_devices_are_counted_at_the_start(tmp_path):
    """``trainer.devices=-1`` (all GPUs) is the same config on a node with fewer GPUs: the world
    size recorded at the start is checked."""
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    gpus = changed(CONFIG, trainer__devices=-1)
    assert decide_resume("auto", last, gpus, saved(gpus, processes=8), None, 8) is True
    with pytest.raises(ConfigError, match=r"world size \(trainer.devices x trainer.num_nodes processes\) 8 -> 4"):
        decide_resume("auto", last, gpus, saved(gpus, processes=8), None, 4)
    from captioning.config import TrainerConfig

    assert world_size(TrainerConfig(devices=[0, 1], num_nodes=2)) == 4 and world_size(TrainerConfig(devices="3")) == 3
    assert world_size(TrainerConfig(accelerator="cpu", devices="auto")) == 1  # counted by Lightning


def test_a_longer_budget_is_refused_unless_the_schedule_is_fixed_at_the_length_it_trained(tmp_path):
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ten = saved(CONFIG, schedule_steps=40)  # a 2-epoch run whose cosine schedule resolved to 40 steps
    longer = changed(CONFIG, trainer__max_epochs=4)
    with pytest.raises(ConfigError, match=r"trainer.max_epochs 2 -> 4\); the cosine schedule spans the budget: "
                                          r"to continue this run past its budget on the same schedule add "
                                          r"optim.schedule_steps=40, or .*\(init_from=.*last.ckpt run_name=<name>\)"):
        decide_resume("auto", last, longer, ten)
    assert decide_resume("auto", last, changed(longer, optim__schedule_steps=40), ten) is True
    with pytest.raises(ConfigError, match="optim.schedule_steps"):  # another length is another schedule
        decide_resume("auto", last, changed(longer, optim__schedule_steps=80), ten)


def test_records_of_an_older_identity_are_compared_on_the_keys_both_have(tmp_path):
    """A checkpoint written when callbacks and devices could change while continuing: its old
    fingerprint means nothing now; its config still does, key by key."""
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    config = {**CONFIG, "callbacks": CALLBACKS, "store_id": "abcdef0123"}
    old = {"config": {k: v for k, v in config.items() if k != "store_id"},
           "run": {"fingerprint": "0123456789"}}  # identity version 1
    assert IDENTITY_VERSION == 2
    assert decide_resume("auto", last, config, old) is True
    with pytest.raises(ConfigError, match="callbacks.early_stopping.patience 5 -> 1"):
        decide_resume("auto", last, changed(config, callbacks__early_stopping__patience=1), old)


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


def test_the_documented_table_is_the_one_the_code_decides():
    doc = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Runs: what a run is"):doc.index("## Sweeps\n")]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    assert table == identity_table()


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
    # a larger budget is another run while the cosine schedule spans the budget: refused, naming
    # the schedule's length the run resolved (and recorded in run.json and its checkpoints)
    proc = run_cli("train", *args(tiny, "optim.lr=1e-3", "trainer.max_epochs=3", f"hydra.run.dir={run}"),
                   check=False, env={"OMP_NUM_THREADS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "trainer.max_epochs 2 -> 3" in errors[0] and f"optim.schedule_steps={STEPS}" in errors[0]
    assert snapshot(run) == before
    # continued on that schedule, with the dataset moved (copied elsewhere): the same run resumes
    moved = {"root": tmp_path / "moved" / "tiny", "features_dir": tmp_path / "moved" / "tiny" / "features" / "synthetic"}
    shutil.copytree(tiny["root"], moved["root"])
    proc = run_cli("train", *args(moved, "optim.lr=1e-3", "trainer.max_epochs=3", f"optim.schedule_steps={STEPS}",
                                  f"hydra.run.dir={run}"), env={"OMP_NUM_THREADS": "1"})
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'} (step {STEPS})" in proc.stdout + proc.stderr
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["global_step"] == STEPS + 5 and summary["schedule_steps"] == STEPS
    # best.ckpt, carried through the resume: the best ranked checkpoint, the same file
    assert os.path.samefile(run / "checkpoints" / "best.ckpt", summary["best_checkpoint"])


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


def other_store(data: dict, dest: Path) -> Path:
    """The same features written with other encoder settings: another store (another store_id)."""
    import numpy as np

    from captioning.store.feature_store import FeatureStore
    from captioning.store.writer import FeatureStoreWriter

    src = FeatureStore.open(data["features_dir"])
    writer = FeatureStoreWriter(dest, {**dict(src.meta), "settings": {"backbone": "other", "weights": "none"}},
                                shard_size=16)
    for item_id in src.ids:
        writer.add(item_id, np.asarray(src[item_id].features, np.float32))
    writer.close()
    return dest


def sweep_runs(sweep: Path) -> dict[str, dict]:
    """Each job folder of a sweep -> its train_summary.json, run.json and composed config."""
    from omegaconf import OmegaConf

    return {p.name: {"summary": json.loads((p / "train_summary.json").read_text()),
                     "record": json.loads((p / "run.json").read_text()),
                     "config": OmegaConf.to_container(OmegaConf.load(p / ".hydra" / "config.yaml"))}
            for p in sorted(sweep.iterdir()) if (p / "train_summary.json").is_file()}


@pytest.mark.slow
def test_a_sweep_over_the_budget_the_callbacks_and_the_store_trains_every_job_from_scratch(tiny, tmp_path):
    """``-m trainer.max_epochs=1,2 callbacks=[default,swa],default features_dir=A,B``: 8 runs, 8 folders,
    each trained from step 0 over its own whole budget (the budget is part of a run whose cosine
    schedule spans it; SWA replaces the weights; the store's identity is part of the run)."""
    sweep, store_b = tmp_path / "sweep", other_store(tiny, tmp_path / "store_b")
    stores = f"features_dir={tiny['features_dir']},{store_b}"
    base = [a for a in args(tiny) if not a.startswith("features_dir=")]
    run_cli("train", "-m", *base, "trainer.max_epochs=1,2", "callbacks=[default,swa],default", stores,
            f"hydra.sweep.dir={sweep}", env={"OMP_NUM_THREADS": "1"})
    runs = sweep_runs(sweep)
    assert len(runs) == 8 and len({r["summary"]["fingerprint"] for r in runs.values()}) == 8, sorted(runs)
    for name, r in runs.items():
        epochs = r["config"]["trainer"]["max_epochs"]
        assert r["summary"]["global_step"] == 5 * epochs, name  # from scratch, its own budget
        assert name.endswith(r["summary"]["fingerprint"]) and r["record"]["run"]["fingerprint"] == name[-10:]
        assert r["record"]["run"]["schedule_steps"] == 5 * epochs  # each its own schedule
    assert all(row["status"] == "COMPLETED" for row in summary_rows(sweep))

    def folder(epochs: int, swa: bool, store: Path) -> Path:
        (name,) = [n for n, r in runs.items() if r["config"]["trainer"]["max_epochs"] == epochs
                   and ("swa" in r["config"]["callbacks"]) is swa and r["config"]["features_dir"] == str(store)]
        return sweep / name

    plain, averaged = weights(folder(2, False, tiny["features_dir"])), weights(folder(2, True, tiny["features_dir"]))
    assert any(not torch.equal(plain[k], averaged[k]) for k in plain)  # SWA changed the weights
    ids = {runs[folder(2, False, s).name]["record"]["config"]["store_id"] for s in (tiny["features_dir"], store_b)}
    assert len(ids) == 2


@pytest.mark.slow
def test_a_ddp_sweep_over_devices_trains_each_world_size_in_its_own_folder(tiny, tmp_path):
    """``-m trainer=ddp_cpu trainer.devices=1,2``: Lightning starts rank 1 by running the command
    again; it runs as the job alone in the job's folder (not a sweep of its own), and the second
    job is not taken for a rank started by a cluster."""
    sweep = tmp_path / "sweep"
    base = [a for a in args(tiny) if a != "trainer=cpu"]
    run_cli("train", "-m", *base, "trainer=ddp_cpu", "trainer.devices=1,2", f"hydra.sweep.dir={sweep}",
            env={"OMP_NUM_THREADS": "1"}, timeout=400)
    runs = sweep_runs(sweep)
    assert sorted(r["record"]["run"]["world_size"] for r in runs.values()) == [1, 2], sorted(runs)
    assert len({r["summary"]["fingerprint"] for r in runs.values()}) == 2
    assert all(r["summary"]["global_step"] == STEPS for r in runs.values())  # each from scratch
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == sorted([*runs, "jobs"])  # no stray folder


@pytest.mark.slow
def test_a_folder_whose_run_died_before_its_first_checkpoint_refuses_another_config(tiny, tmp_path):
    run = tmp_path / "run"
    inject = REPO / "tests" / "faults" / "inject"  # sitecustomize: SIGKILL after the first optimizer step
    env = {"OMP_NUM_THREADS": "1", "CAPTIONING_FAULT": "kill:step::0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(inject), os.environ.get("PYTHONPATH")]))}
    proc = run_cli("train", *args(tiny, f"hydra.run.dir={run}"), env=env, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (run / "run.json").is_file() and not (run / "checkpoints" / "last.ckpt").exists()
    before = snapshot(run)
    proc = run_cli("train", *args(tiny, "seed=1", f"hydra.run.dir={run}"), check=False, env={"OMP_NUM_THREADS": "1"})
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "holds another run (its run.json" in errors[0] and "seed 0 -> 1" in errors[0]
    assert snapshot(run) == before
