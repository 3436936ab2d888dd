"""The Python API (``captioning.Captioner``): raw media, precomputed features, decoding options,
figures, the README's example, and a cheap ``import captioning``.

Checkpoints are tiny untrained decoders over a random-weight EfficientNet-Lite0 whose feature meta
is computed from the backbone itself (``store_meta``): no FeatureStore is needed to caption raw
media, so nothing is extracted here (``test_caption_cli.py`` covers stored features).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO
from PIL import Image
from test_caption_cli import save_checkpoint
from test_extract import write_video

SIZE = 64  # EfficientNet-Lite0: stride 32 -> a 2 x 2 grid
GRID = [2, 2]
FRAMES = 4
WORDS = ["a", "red", "green", "circle", "square", "on", "left", "right"]


def _vocab() -> dict:
    from captioning.data.vocab import Vocabulary

    return Vocabulary.build([WORDS, WORDS[:4]], min_count=1).to_dict()


def _meta(kind: str) -> dict:
    from captioning.features.backbones import EncoderConfig, build_backbone
    from captioning.features.extract import store_meta

    enc = EncoderConfig(weights="none", image_size=SIZE, frame_size=SIZE, frames=FRAMES)
    return store_meta(build_backbone(enc), kind, "float16")


def _image(path: Path, colour: tuple[int, int, int], corner: int) -> Path:
    arr = np.full((80, 96, 3), 235, np.uint8)
    y, x = divmod(corner, 2)
    arr[y * 40: y * 40 + 40, x * 48: x * 48 + 48] = colour
    Image.fromarray(arr).save(path)
    return path


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("api")
    image_meta, video_meta = _meta("image"), _meta("video")
    assert image_meta["grid"] == GRID and video_meta["positions"] == FRAMES
    photos = tmp / "photos"
    photos.mkdir()
    images = [_image(photos / f"p{i}.png", c, i) for i, c in enumerate([(220, 30, 30), (30, 200, 40), (40, 40, 220)])]
    write_video(tmp / "clip.mp4", frames=12, size=48)
    return {
        "tmp": tmp, "images": images, "video": tmp / "clip.mp4",
        "soft": save_checkpoint(tmp / "soft.ckpt", image_meta, _vocab(), {}, tmp, seed=1),
        "hard": save_checkpoint(tmp / "hard.ckpt", image_meta, _vocab(), {}, tmp, variant="hard_attention"),
        "mean": save_checkpoint(tmp / "mean.ckpt", image_meta, _vocab(), {}, tmp, variant="mean_pool"),
        "clip": save_checkpoint(tmp / "video.ckpt", video_meta, _vocab(), {}, tmp, seed=2),
    }


@pytest.fixture(scope="module")
def soft(ckpts):
    from captioning import Captioner

    return Captioner.from_checkpoint(ckpts["soft"], device="cpu")


def test_import_captioning_is_cheap_and_exports_captioner_lazily():
    code = "import sys, captioning; print(sorted(m for m in ('torch', 'captioning.caption.api') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr[-2000:]
    import captioning
    import captioning.caption.api as api
    from captioning import Captioner, CaptionResult

    assert Captioner is api.Captioner and CaptionResult is api.CaptionResult
    assert {"Captioner", "CaptionResult"} <= set(dir(captioning))
    with pytest.raises(AttributeError, match="no attribute 'Captionr'"):
        captioning.Captionr  # noqa: B018


def test_caption_images_folders_and_failures_in_input_order(soft, ckpts, tmp_path):
    missing = tmp_path / "nope.jpg"
    results = soft.caption([ckpts["images"][2], missing, ckpts["images"][0].parent, ckpts["video"]],
                           beam_size=2, max_length=4)
    names = [Path(r.input).name for r in results]
    # p2 named first; the folder's files sorted, p2 not repeated; then the failures in place
    assert names == ["p2.png", "nope.jpg", "p0.png", "p1.png", "clip.mp4"]
    assert [r.ok for r in results] == [True, False, True, True, False]
    assert "input not found" in results[1].error and results[1].tokens == []
    assert "is a video but this checkpoint captions images" in results[4].error
    for r in (results[0], results[2], results[3]):
        assert r.kind == "image" and r.attention_shape == GRID and r.frame_indices is None
        assert 1 <= len(r.tokens) <= 4 and r.caption == " ".join(r.tokens)
        assert set(r.tokens) <= set(WORDS) | {"<unk>"}
        assert r.attention.shape == (len(r.tokens), 4)
        np.testing.assert_allclose(r.attention.sum(axis=1), 1.0, atol=1e-5)
        assert r.image.shape == (SIZE, SIZE, 3) and r.image.dtype == np.uint8
        assert isinstance(r.score, float) and r.score <= 0.0  # summed log-probs (no length penalty)
        assert r.has_attention and not r.hard_attention
    # the crop the model saw: the red square fills the top-left quarter of p0 after resize + crop
    red = results[2].image
    assert red[5, 5, 0] > 180 and red[5, 5, 1] < 80 and red[-5, -5, 0] > 200 and red[-5, -5, 1] > 200


def test_caption_features_equals_raw_captioning(soft, ckpts):
    from conftest import featurize_files

    raw = soft.caption([str(p) for p in ckpts["images"]], beam_size=3)
    feats = featurize_files(soft.backbone(), ckpts["images"], "image")
    stacked = torch.stack([f.features for f in feats])  # [B, N, C] float16, as the store holds them
    direct = soft.caption_features(stacked, beam_size=3, names=["a", "b", "c"])
    assert [r.input for r in direct] == ["a", "b", "c"]
    for a, b in zip(raw, direct, strict=True):
        assert a.tokens == b.tokens and a.score == pytest.approx(b.score, abs=1e-5)
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)
        assert b.image is None


def test_caption_features_masks_positions_past_valid(soft):
    torch.manual_seed(0)
    x = torch.randn(3, 4, int(soft.feature_meta["dim"]))
    out = soft.caption_features(x, valid=[1, 2, 4], max_length=3)
    assert out[0].input == "features[0]"
    for r, v in zip(out, [1, 2, 4], strict=True):
        np.testing.assert_array_equal(r.attention[:, v:], 0.0)
        np.testing.assert_allclose(r.attention[:, :v].sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(out[0].attention[:, 0], 1.0)  # one valid position takes all the weight
    from captioning.errors import DataError

    with pytest.raises(DataError, match=r"\[N, \d+\]"):
        soft.caption_features(torch.zeros(1, 4, 7))
    with pytest.raises(DataError, match="valid"):
        soft.caption_features(x, valid=[0, 1, 1])


def test_decoding_options_map_onto_beam_config(soft, ckpts):
    from captioning.caption.api import beam_config
    from captioning.errors import ConfigError
    from captioning.models.search import DecodeConfig

    cfg = beam_config(beam_size=4, length_penalty="gnmt", alpha=0.7)
    assert cfg == DecodeConfig(beam_size=4, length_penalty="gnmt", alpha=0.7)
    base = DecodeConfig(beam_size=5, max_length=9)
    assert beam_config(base, max_length=3) == DecodeConfig(beam_size=5, max_length=3) and base.max_length == 9
    with pytest.raises(ConfigError, match=r"unknown decoding option\(s\) \['beam'\].*beam_size"):
        soft.caption(ckpts["images"][:1], beam=3)
    with pytest.raises(ConfigError, match="beam_size must be >= 1"):
        soft.caption(ckpts["images"][:1], beam_size=0)
    short = soft.caption_features(torch.randn(4, 4, int(soft.feature_meta["dim"])), max_length=2, min_length=2,
                                  beam_size=2)
    assert all(len(r.tokens) == 2 for r in short)


def test_hard_attention_and_models_without_attention(ckpts):
    from captioning import Captioner
    from captioning.caption.api import marks_hard_attention

    hard = Captioner.from_checkpoint(ckpts["hard"], device="cpu")
    assert marks_hard_attention(hard.module) and hard.hard_attention
    r = hard.caption(ckpts["images"][0], max_length=3)[0]
    assert r.hard_attention and r.ok
    mean = Captioner.from_checkpoint(ckpts["mean"], device="cpu").caption(ckpts["images"][0], max_length=3)[0]
    assert not mean.has_attention and not mean.hard_attention
    np.testing.assert_allclose(mean.attention, 0.25)  # uniform over the 2 x 2 grid


def test_video_results_carry_frame_weights_and_indices(ckpts, tmp_path):
    from captioning import Captioner

    clip = Captioner.from_checkpoint(ckpts["clip"], device="cpu")
    assert clip.kind == "video" and clip.grid is None
    r = clip.caption([ckpts["video"]], beam_size=2, max_length=4)[0]
    assert r.ok and r.kind == "video" and r.attention_shape == [FRAMES]
    assert r.frame_indices == [1, 4, 7, 10]  # 4 uniform segment centres of 12 frames
    assert r.attention.shape == (len(r.tokens), FRAMES) and r.image.shape == (FRAMES, SIZE, SIZE, 3)
    png = r.figure(tmp_path / "clip.png")
    assert Image.open(png).size[0] > 200


def test_figure_of_a_result_and_of_features_without_pixels(soft, tmp_path):
    from captioning.viz.heatmaps import plot_result

    r = soft.caption_features(torch.randn(1, 4, int(soft.feature_meta["dim"])), max_length=3)[0]
    path = r.figure(tmp_path / "f.png")
    w, h = Image.open(path).size
    assert path == tmp_path / "f.png" and w > 200 and h > 100
    r.error = "broken"
    with pytest.raises(ValueError, match="no caption to draw: broken"):
        plot_result(r, tmp_path / "g.png")


def _readme_snippet() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Python API section holds one python example"
    return blocks[0]


def test_readme_python_api_example_runs(ckpts, tmp_path, monkeypatch, capsys):
    snippet = _readme_snippet()
    ckpt = re.search(r'from_checkpoint\("([^"]+)"', snippet).group(1)
    (tmp_path / ckpt).parent.mkdir(parents=True)
    (tmp_path / ckpt).write_bytes(ckpts["soft"].read_bytes())
    _image(tmp_path / "photo.jpg", (230, 200, 20), 3)
    (tmp_path / "photos").mkdir()
    for p in ckpts["images"][:2]:
        (tmp_path / "photos" / p.name).write_bytes(p.read_bytes())
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md#python-api", "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(" -> ")[0] for line in lines] == ["photo.jpg", "photos/p0.png", "photos/p1.png"]
    for line in lines:
        words = line.split(" -> ")[1].rsplit(" [2, 2]", 1)[0].split()
        assert words and set(words) <= set(WORDS) | {"<unk>"}, line
    assert Image.open(tmp_path / "photo_attention.png").size[0] > 200


def test_caption_split_decodes_the_checkpoint_feature_store(ckpts, soft, tmp_path):
    import json
    from dataclasses import asdict

    from conftest import featurize_files

    from captioning import Captioner
    from captioning.config import DataConfig
    from captioning.store.feature_store import FeatureStore
    from captioning.store.writer import FeatureStoreWriter

    images = ckpts["images"]
    (tmp_path / "annotations").mkdir()
    coco = {"images": [{"id": i + 1, "file_name": p.name} for i, p in enumerate(images)],
            "annotations": [{"id": i + 1, "image_id": i + 1, "caption": "a red square"} for i in range(3)]}
    (tmp_path / "annotations" / "test.json").write_text(json.dumps(coco))
    data = DataConfig(name="tiny", root=str(tmp_path), media_dir=str(images[0].parent),
                      annotations={"test": str(tmp_path / "annotations" / "test.json")})
    with FeatureStoreWriter(tmp_path / "features", soft.feature_meta) as writer:
        for i, f in enumerate(featurize_files(soft.backbone(), images, "image")):
            writer.add(str(i + 1), f.features.numpy())
    meta = dict(FeatureStore.open(tmp_path / "features").meta)
    ckpt = save_checkpoint(tmp_path / "split.ckpt", meta, _vocab(), asdict(data), tmp_path / "features", seed=1)

    stored = Captioner.from_checkpoint(ckpt, device="cpu").caption_split("test", beam_size=2, max_items=2)
    raw = soft.caption(images[:2], beam_size=2)  # same seed, same weights
    assert [r.input for r in stored] == ["p0.png", "p1.png"]
    for a, b in zip(stored, raw, strict=True):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a.attention, b.attention, atol=1e-6)
        np.testing.assert_array_equal(a.image, b.image)  # the crop recomputed with the stored settings
