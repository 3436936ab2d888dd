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
