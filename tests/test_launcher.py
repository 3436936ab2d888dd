"""Multi-node launching: a real sweep through Hydra's submitit launcher (its local executor, the
plugin and code path SLURM jobs take), and the SLURM preset checked the way Lightning checks it.

Lightning under SLURM (``SLURMEnvironment.validate_settings``) requires ``--ntasks-per-node`` ==
its devices per node and ``--nodes`` == ``trainer.num_nodes``; ``trainer=ddp`` has ``devices=-1``,
all the GPUs SLURM gives the node (``--gpus-per-node``).  The tests build the sbatch script that
submitit would submit for the composed config and run Lightning's own check on its values.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import REPO, data_overrides, make_tiny_image_dataset, run_cli

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
submitit = pytest.importorskip("submitit")

FAST = ["model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "optim.lr=0.01",
        "optim.warmup_steps=0", "logger=csv", "callbacks.progress=null", "callbacks.early_stopping=null",
        "trainer.enable_progress_bar=false", "trainer.max_epochs=1"]


@pytest.mark.slow
def test_sweep_through_the_submitit_launcher_runs_every_job(tmp_path: Path) -> None:
    """``captioning-train -m hydra/launcher=submitit_local seed=0,1``: two submitit jobs, each with
    its checkpoints and summary in its own folder of the sweep (``<run_name>-<fingerprint>``)."""
    data = make_tiny_image_dataset(tmp_path / "tiny", n=24)
    sweep = tmp_path / "sweep"
    run_cli("train", "-m", "hydra/launcher=submitit_local", "seed=0,1",
            *data_overrides(data["root"], data["features_dir"]), *FAST,
            f"hydra.sweep.dir={sweep}", env={"OMP_NUM_THREADS": "1"})
    job_ids = set()
    for seed in (0, 1):
        (run,) = sweep.glob(f"tiny-*-s{seed}-*")
        summary = json.loads((run / "train_summary.json").read_text())
        assert run.name.endswith(f"-{summary['fingerprint']}")
        assert summary["global_step"] > 0 and summary["run_dir"] == str(run)
        ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
        assert ckpt["hyper_parameters"]["config"]["seed"] == seed
        assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
        assert "val/CIDEr" in summary["metrics"]
        hydra_cfg = (run / ".hydra" / "hydra.yaml").read_text()
        assert "submitit_launcher.LocalLauncher" in hydra_cfg
        job_id = re.search(r"\n    id: '(\d+)'", hydra_cfg)[1]  # submitit's job id, not Hydra's default
        assert (sweep / ".submitit" / job_id / f"{job_id}_0_result.pkl").is_file()  # ran as that job
        job_ids.add(job_id)
    assert len(job_ids) == 2


# ------------------------------------------------------------------------------ the SLURM preset


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    import captioning.cli.train  # noqa: F401  (registers the train schema)

    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        cfg = compose("train", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # ${hydra.job.name} and friends resolve as in a run
    return cfg


def sbatch_options(cfg, folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The ``#SBATCH`` options submitit writes for ``cfg.hydra.launcher``, built as the launcher does
    (``BaseSubmititLauncher.launch``).  submitit wants an ``srun`` on the PATH: a stub is put there."""
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    stub = folder / "bin" / "srun"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    params = dict(instantiate(cfg.hydra.launcher).params)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor = submitit.AutoExecutor(cluster="slurm", folder=folder / "submitit",
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    params.pop("submitit_folder")
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()})
    text = executor._executor._make_submission_file_text("python -m captioning.cli.train", "uid")
    return dict(re.findall(r"^#SBATCH --([\w-]+)=(\S+)$", text, flags=re.M))


def lightning_accepts(opts: dict[str, str], devices: int, num_nodes: int, monkeypatch) -> None:
    """Lightning's own SLURM check, in the environment SLURM gives each task of this sbatch script.
    ``devices=-1`` counts every GPU of the node (``--gpus-per-node``)."""
    from lightning_fabric.plugins.environments import SLURMEnvironment

    nodes, per_node = int(opts["nodes"]), int(opts["ntasks-per-node"])
    for key, value in {"SLURM_NNODES": nodes, "SLURM_NTASKS_PER_NODE": per_node, "SLURM_NTASKS": nodes * per_node,
                       "SLURM_JOB_NAME": opts["job-name"]}.items():
        monkeypatch.setenv(key, str(value))
    seen = int(opts["gpus-per-node"]) if devices == -1 else devices
    SLURMEnvironment().validate_settings(num_devices=seen, num_nodes=num_nodes)


@pytest.mark.parametrize(("overrides", "nodes", "per_node"), [
    (["trainer.num_nodes=1"], 1, 8),
    (["trainer.num_nodes=2"], 2, 8),
    (["trainer.num_nodes=2", "hydra.launcher.gpus_per_node=4"], 2, 4),
    (["trainer.num_nodes=3", "hydra.launcher.gpus_per_node=2", "trainer.devices=2"], 3, 2),
], ids=["1node", "2nodes", "2nodes-4gpus", "3nodes-2gpus-explicit-devices"])
def test_slurm_preset_agrees_with_lightnings_slurm_check(tmp_path, monkeypatch, overrides, nodes, per_node) -> None:
    cfg = _compose(["trainer=ddp", *overrides])
    opts = sbatch_options(cfg, tmp_path, monkeypatch)
    assert (opts["nodes"], opts["ntasks-per-node"], opts["gpus-per-node"]) == (str(nodes), str(per_node), str(per_node))
    assert cfg.trainer.strategy == "ddp" and cfg.trainer.num_nodes == nodes
    lightning_accepts(opts, cfg.trainer.devices, cfg.trainer.num_nodes, monkeypatch)


def test_lightnings_slurm_check_refuses_a_mismatch(tmp_path, monkeypatch) -> None:
    """The check above can fail: devices per node other than the tasks per node are refused (the
    preset's comment says to set hydra.launcher.gpus_per_node, not trainer.devices alone)."""
    cfg = _compose(["trainer=ddp", "trainer.num_nodes=2", "trainer.devices=4"])
    opts = sbatch_options(cfg, tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="ntasks-per-node=8"):
        lightning_accepts(opts, cfg.trainer.devices, cfg.trainer.num_nodes, monkeypatch)
    with pytest.raises(ValueError, match="nodes"):
        lightning_accepts(opts, -1, 3, monkeypatch)
