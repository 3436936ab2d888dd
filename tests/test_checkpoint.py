"""Checkpoints load only through the safe loader: pickle payloads refused, corruption reported."""

from __future__ import annotations

import os
import pickle

import pytest
import torch

from captioning.errors import CheckpointError
from captioning.train.checkpoint import load_checkpoint


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch PWNED_BY_CHECKPOINT",))


def test_crafted_pickle_payload_is_refused_and_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"config": _Payload()}}, path)
    with pytest.raises(CheckpointError, match="refused by the safe loader"):
        load_checkpoint(path)
    assert not (tmp_path / "PWNED_BY_CHECKPOINT").exists()


def test_raw_pickle_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    assert not (tmp_path / "PWNED_BY_CHECKPOINT").exists()


def test_truncated_and_missing_and_empty(tmp_path):
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)},
                "hyper_parameters": {"config": {}, "vocab": {}, "feature_meta": {}}}, good)
    assert load_checkpoint(good)["state_dict"]["w"].shape == (1000,)
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(cut)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nope.ckpt")
    empty = tmp_path / "empty.ckpt"
    empty.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(empty)
    other = tmp_path / "other.ckpt"
    torch.save({"weights": torch.zeros(1)}, other)
    with pytest.raises(CheckpointError, match="not a captioning checkpoint"):
        load_checkpoint(other)


def _small_checkpoint(tmp_path, **config_changes):
    """A checkpoint of a small model as a script would save one (no ``run`` record)."""
    from dataclasses import asdict

    import torch

    from captioning.config import DataConfig
    from captioning.train.module import CaptioningModule

    config = {"data": asdict(DataConfig(name="tiny", root="r", media_dir="m")), "stage": "xe",
              "model": {"name": "lstm", "variant": "soft_attention", "embed_dim": 8, "hidden_dim": 8,
                        "attention_dim": 8},
              "optim": {}, "decode": {}, "features_dir": "f", "scst": {"baseline": "greedy"}, "finetune": {"blocks": 3}}
    vocab = {"itos": ["<pad>", "<bos>", "<eos>", "<unk>", "a"]}
    meta = {"kind": "image", "dim": 4, "positions": 4, "grid": [2, 2]}
    module = CaptioningModule.from_hparams(config, vocab, meta)
    path = tmp_path / "small.ckpt"
    torch.save({"state_dict": module.state_dict(), "global_step": 7,
                "hyper_parameters": {"config": {**config, **config_changes}, "vocab": vocab, "feature_meta": meta}},
               path)
    return path


def test_a_checkpoint_loads_with_its_stage_and_run(tmp_path):
    from captioning.train.checkpoint import checkpoint_run, load_captioner

    assert load_captioner(_small_checkpoint(tmp_path)).settings.stage.name == "xe"
    assert load_captioner(_small_checkpoint(tmp_path, stage="scst")).settings.stage.name == "scst"
    run = checkpoint_run(_small_checkpoint(tmp_path))
    assert run["step"] == 7 and len(run["fingerprint"]) == 10  # computed from its config


def test_a_config_layout_no_release_wrote_is_refused_in_one_line(tmp_path):
    """Flags that named the stage before it was one value (``scst.enabled``) were never released:
    such a checkpoint is refused, naming the key."""
    from captioning.train.checkpoint import load_captioner

    with pytest.raises(CheckpointError, match="enabled"):
        load_captioner(_small_checkpoint(tmp_path, scst={"enabled": True, "baseline": "greedy"}))


def test_a_checkpoint_this_code_cannot_build_fails_in_one_line(tmp_path):
    import torch

    from captioning.train.checkpoint import load_captioner

    path = _small_checkpoint(tmp_path)
    state = torch.load(path, weights_only=True)
    state["hyper_parameters"]["config"]["model"]["name"] = "gru"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"does not match this code's model: .*model.name='gru'.*"
                       r"to convert it, rename the key .*or load it with the code that wrote it \(an older version\)"):
        load_captioner(path)
