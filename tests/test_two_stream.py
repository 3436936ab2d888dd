"""Two-stream video features through the jobs: the temporal model trained on a 2-D appearance store and
a 3-D motion store of the same sampled frames read as one (``features_dir=[app, mot]``), its decoder
taking the sum of their channels, streams on other frames refused by name, evaluation, and raw videos
captioned with both encoders rebuilt from the checkpoint (``captioning-caption``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from test_clips import CPU, items_in, make_clip_videos, tiny
from test_config import compose_train

from captioning.config import to_config
from captioning.errors import DataError
from captioning.features.backbones import EncoderConfig
from captioning.features.encoders import build_encoder
from captioning.features.extract import run_extraction
from captioning.predictions import read_predictions
from captioning.train.job import TrainConfig, train

FRAMES = 4
APPEARANCE = EncoderConfig(weights="none", frame_size=32, frames=FRAMES)  # EfficientNet-Lite0: 1280 channels
MOTION = tiny("r2plus1d_18", frames=FRAMES)  # clips of 2 frames at 32 px: 512 channels


@pytest.fixture(scope="module")
def streams(tmp_path_factory) -> dict:
    """9 videos (3 train, 3 val, 3 test) and three stores of them: appearance and motion on the same
    K=4 uniformly sampled frames, and appearance on other frames (every 2nd frame, then spread)."""
    root = tmp_path_factory.mktemp("twostream")
    ids = make_clip_videos(root, (12, 14, 16, 18, 20, 13, 15, 17, 19))
    dirs = {}
    for name, cfg in (("app", APPEARANCE), ("mot", MOTION),
                      ("app_fps", EncoderConfig(**{**APPEARANCE.__dict__, "frame_strategy": "fps", "target_fps": 5}))):
        dirs[name] = root / "features" / name
        run_extraction(items_in(root, ids), "video", build_encoder(cfg), dirs[name], trainer=CPU, batch_size=9,
                       num_workers=0, progress=False)
    return {"root": root, "ids": ids, **dirs}


def data_args(s: dict, *features: Path) -> list[str]:
    return ["data=moving_shapes", "data.name=clips", f"data.root={s['root']}", "data.synthetic=null",
            "data.grounding=null", "data.num_workers=0", f"features_dir=[{','.join(map(str, features))}]"]


def test_streams_on_other_frames_or_missing_are_refused_by_name(streams, tmp_path: Path) -> None:
    cfg = to_config(compose_train(*data_args(streams, streams["app_fps"], streams["mot"]), "model=temporal_attention"),
                    TrainConfig)
    assert cfg.features_dir == [str(streams["app_fps"]), str(streams["mot"])]
    cfg.output_dir = str(tmp_path / "run")
    with pytest.raises(DataError) as e:  # video0 (12 frames): uniform 1, 4, 7, 10; every 2nd frame: 0, 4, 6, 10
        train(cfg)
    msg = str(e.value)
    assert "disagree on the frame indices of item 'video0' ((0, 4, 6, 10) vs (1, 4, 7, 10))" in msg
    assert str(streams["app_fps"]) in msg and str(streams["mot"]) in msg and "\n" not in msg
    cfg.features_dir = [str(streams["app"]), str(tmp_path / "nowhere"), str(tmp_path / "neither")]
    with pytest.raises(DataError, match=f"no feature store at {tmp_path / 'nowhere'}, {tmp_path / 'neither'}: "):
        train(cfg)


@pytest.mark.slow
def test_temporal_model_trains_evaluates_and_captions_on_two_streams(streams, tmp_path: Path) -> None:
    from captioning.caption.api import Captioner
    from captioning.features.featurize import featurize_streams
    from captioning.store.feature_store import FeatureStore
    from captioning.store.streams import open_features
    from captioning.train.checkpoint import load_captioner

    app, mot = FeatureStore.open(streams["app"]), FeatureStore.open(streams["mot"])
    both = open_features([streams["app"], streams["mot"]])
    for vid in streams["ids"]:  # the same sampled frames in both streams, and in the joined store
        assert app[vid].frame_indices == mot[vid].frame_indices == both[vid].frame_indices
    run = tmp_path / "run"
    run_cli("train", *data_args(streams, streams["app"], streams["mot"]), "model=temporal_attention",
            "model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "data.batch_size=2",
            "trainer.max_epochs=1", "logger=csv", "callbacks.progress=null", "callbacks.early_stopping=null",
            "callbacks.attention_images=null", "trainer.enable_progress_bar=false", f"hydra.run.dir={run}")
    ckpt = run / "checkpoints" / "last.ckpt"
    model = load_captioner(ckpt)
    assert model.decoder.feature_dim == 1280 + 512 == app.meta["dim"] + mot.meta["dim"]
    position_dim = model.hparams["config"]["model"]["position_dim"]  # the preset's time code, concatenated
    assert model.decoder.attention.key_proj.in_features == 1280 + 512 + position_dim == 1856  # U_a [v; p]
    meta = model.hparams["feature_meta"]
    assert [s["settings"]["name"] for s in meta["streams"]] == ["efficientnet_lite0", "r2plus1d_18"]
    assert json.loads((run / "train_summary.json").read_text())["global_step"] == 2

    out = tmp_path / "eval"
    run_cli("evaluate", f"ckpt_path={ckpt}", "split=test", "decode=greedy", f"output_dir={out}", "metrics=[bleu]",
            "num_workers=0", "grounding=false", "trainer.enable_progress_bar=false", f"hydra.run.dir={out}/hydra")
    predictions = read_predictions(out / "predictions.json")
    assert len(predictions) == 3 and all(len(p["attention"][0]) == FRAMES for p in predictions if p["tokens"])

    # raw videos: both encoders rebuilt from the checkpoint, their features joined as the stores are
    captioner = Captioner.from_checkpoint(ckpt, device="cpu")
    assert [b.cfg.name for b in captioner.encoders()] == ["efficientnet_lite0", "r2plus1d_18"]
    videos = [streams["root"] / "videos" / f"{v}.mp4" for v in ("video2", "video5")]
    (raw,) = featurize_streams(captioner.encoders(), captioner.feature_meta, [(v.stem, str(v)) for v in videos])
    for f, vid in zip(raw, ("video2", "video5"), strict=True):
        assert f.error is None and f.item_id == vid and f.frame_indices == both[vid].frame_indices
        np.testing.assert_allclose(f.features.float().numpy(), np.asarray(both[vid].features, np.float32),
                                   rtol=1e-2, atol=2e-3)
    cap = tmp_path / "captions"
    run_cli("caption", f"ckpt_path={ckpt}", f"inputs=[{videos[0]},{videos[1]}]", f"output_dir={cap}", "device=cpu",
            "num_workers=0", "decode.beam_size=2", "decode.max_length=6", "progress=false",
            f"hydra.run.dir={tmp_path / 'hydra'}")
    entries = json.loads((cap / "captions.json").read_text())
    direct = captioner.caption(videos, beam_size=2, max_length=6)
    assert [e["caption"] for e in entries] == [r.caption for r in direct]
    for e, vid in zip(entries, ("video2", "video5"), strict=True):
        assert e["frame_indices"] == list(both[vid].frame_indices) and e["attention_shape"] == [FRAMES]
