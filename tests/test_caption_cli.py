"""``captioning-caption``: raw media -> checkpoint backbone -> captions.json, figures, index.html.

The checkpoints are built here: a few synthetic shapes images / moving-shapes videos, features
extracted with the extraction job (EfficientNet-Lite0, random weights, small inputs), and an
untrained ``CaptioningModule`` saved in the Lightning checkpoint layout (``save_checkpoint``, also
used by ``test_api.py``).  Attention is forced where a
test needs to know where it is (the scorer is monkeypatched in-process).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from PIL import Image
from test_heatmaps import _panel_pixels

from captioning.viz.captions_file import read_captions

IMAGE_SIZE = 128  # EfficientNet-Lite0: stride 32 -> a 4x4 grid
GRID = (4, 4)
FRAMES = 6


# ------------------------------------------------------------------------------ checkpoints


def _vocab(texts: list[str]) -> dict:
    from captioning.data.tokenizer import tokenize
    from captioning.data.vocab import Vocabulary

    return Vocabulary.build([tokenize(t) for t in texts], min_count=1).to_dict()


def save_checkpoint(path: Path, meta: dict, vocab: dict, data: dict, features_dir: Path,
                    variant: str = "soft_attention", seed: int = 0) -> Path:
    """A tiny untrained LSTM decoder (random weights from ``seed``) saved as a checkpoint."""
    from captioning.train.module import CaptioningModule

    torch.manual_seed(seed)
    model_cfg = {"name": "lstm", "variant": variant, "embed_dim": 16, "hidden_dim": 32, "attention_dim": 16,
                 "dropout": 0.0, "doubly_stochastic": 0.0}
    config = {"model": model_cfg, "data": data, "features_dir": str(features_dir),
              "decode": {"beam_size": 1, "max_length": 6}}
    model = CaptioningModule.from_hparams(config, vocab, meta)
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    return path


def _extract(items: list[tuple[str, str]], kind: str, enc, features_dir: Path) -> dict:
    from captioning.features.backbones import build_backbone
    from captioning.features.extract import run_extraction, unique_items
    from captioning.store.feature_store import FeatureStore

    backbone = build_backbone(enc)
    run_extraction(unique_items(items), kind, backbone, features_dir,
                   trainer={"accelerator": "cpu", "devices": 1},
                   batch_size=8, num_workers=0, progress=False)
    meta = dict(FeatureStore.open(features_dir).meta)
    meta.setdefault("encoder", asdict(enc))  # recorded by the extraction job (older stores lack it)
    return meta


@pytest.fixture(scope="module")
def image_ckpt(tmp_path_factory) -> dict:
    from captioning.config import DataConfig
    from captioning.data.annotations import read_dataset
    from captioning.data.synthetic import generate_shapes
    from captioning.features.backbones import EncoderConfig

    tmp = tmp_path_factory.mktemp("caption_images")
    root = tmp / "shapes"
    generate_shapes(root, num_images=12, seed=0, image_size=IMAGE_SIZE, workers=1)
    data = DataConfig(name="tiny_shapes", kind="image", format="coco", root=str(root),
                      media_dir=str(root / "images"),
                      annotations={s: str(root / "annotations" / f"captions_{s}.json")
                                   for s in ("train", "val", "test")})
    records = read_dataset(data).records
    enc = EncoderConfig(weights="none", image_size=IMAGE_SIZE)
    features_dir = root / "features"
    meta = _extract([(r.item_id, str(root / "images" / r.path)) for r in records], "image", enc, features_dir)
    assert meta["grid"] == list(GRID)
    vocab = _vocab([c for r in records for c in r.captions])
    soft = save_checkpoint(tmp / "soft.ckpt", meta, vocab, asdict(data), features_dir)
    hard = save_checkpoint(tmp / "hard.ckpt", meta, vocab, asdict(data), features_dir, variant="hard_attention")
    images = sorted((root / "images").glob("*.jpg"))
    return {"root": root, "soft": soft, "hard": hard, "images": images, "records": records, "meta": meta,
            "enc": enc, "features_dir": features_dir, "vocab": vocab, "data": asdict(data)}


@pytest.fixture(scope="module")
def video_ckpt(tmp_path_factory) -> dict:
    from captioning.data.synthetic import generate_moving_shapes
    from captioning.features.backbones import EncoderConfig

    tmp = tmp_path_factory.mktemp("caption_videos")
    root = tmp / "moving_shapes"
    generate_moving_shapes(root, num_videos=3, seed=0, frames=16, size=64, workers=1)
    videos = sorted((root / "videos").glob("*.mp4"))
    enc = EncoderConfig(weights="none", frames=FRAMES, frame_size=64)
    features_dir = root / "features"
    meta = _extract([(v.stem, str(v)) for v in videos], "video", enc, features_dir)
    assert meta["positions"] == FRAMES
    info = json.loads((root / "annotations" / "videodatainfo.json").read_text())
    vocab = _vocab([s["caption"] for s in info["sentences"]])
    ckpt = save_checkpoint(tmp / "video.ckpt", meta, vocab, {}, features_dir)
    return {"root": root, "ckpt": ckpt, "videos": videos, "meta": meta, "enc": enc, "features_dir": features_dir}


def _config(ckpt: Path, inputs: list, out: Path, **kw):
    from captioning.cli.caption import CaptionConfig
    from captioning.models.search import DecodeConfig

    return CaptionConfig(ckpt_path=str(ckpt), inputs=[str(i) for i in inputs], output_dir=str(out),
                         decode=DecodeConfig(beam_size=2, max_length=6), device="cpu", batch_size=4,
                         num_workers=0, progress=False, **kw)


def _force_attention(monkeypatch, position: int) -> None:
    """Make every attention distribution (almost exactly) one-hot at ``position``."""
    from captioning.models.attention import AdditiveAttention

    def scores(self, h, keys, w=None):
        e = torch.zeros(h.shape[0], keys.shape[1], dtype=h.dtype, device=h.device)
        e[:, position] = 60.0
        return e

    # the step scores from h_{t-1} (scores) or from its query part of the one product (scores_from_query)
    monkeypatch.setattr(AdditiveAttention, "scores", scores)
    monkeypatch.setattr(AdditiveAttention, "scores_from_query", scores)


def _check_entries(entries: list[dict]) -> None:
    from captioning.viz.gallery import captions_errors

    assert captions_errors(entries) == []
    assert captions_errors(entries, use_jsonschema=False) == []
    for e in entries:
        if "error" not in e:
            assert len(e["tokens"]) == len(e["attention"]) >= 1
            assert e["caption"] == " ".join(e["tokens"])
            for row in e["attention"]:  # read back from attention.npy: float16, each weight to 2^-11
                assert sum(row) == pytest.approx(1.0, abs=1e-3)


# ------------------------------------------------------------------------------------ inputs


def test_collect_inputs_files_folders_and_errors(tmp_path):
    from captioning.caption.inputs import collect_inputs

    d = tmp_path / "media"
    (d / "sub").mkdir(parents=True)
    (d / ".hidden").mkdir()
    for name in ("b.jpg", "a.PNG", "sub/c.jpeg", ".hidden/h.jpg", ".x.jpg", "notes.txt", "clip.mp4"):
        (d / name).write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    out = d / "results"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "0000_a.png").write_bytes(b"x")
    explicit = tmp_path / "readme.md"
    explicit.write_text("hi")
    video = d / "clip.mp4"
    inputs = [str(d), str(tmp_path / "missing.jpg"), str(explicit), str(video), str(d / "b.jpg"),
              str(tmp_path / "empty")]

    slots, notes = collect_inputs(inputs, "image", recursive=True, exclude=out)
    ok = [s.input for s in slots if s.error is None]
    assert ok == [str(d / "a.PNG"), str(d / "b.jpg"), str(d / "sub" / "c.jpeg")]  # b.jpg once
    errors = {s.input: s.error for s in slots if s.error}
    assert "input not found" in errors[str(tmp_path / "missing.jpg")]
    assert "unsupported file type '.md'" in errors[str(explicit)]
    assert "is a video but this checkpoint captions images" in errors[str(video)]
    assert "holds no image files" in errors[str(tmp_path / "empty")]
    assert all("\n" not in e for e in errors.values())
    assert any("unsupported type: notes.txt" in n for n in notes)
    assert any("clip.mp4" in n and "captions images" in n for n in notes)
    assert [s.input for s in slots][:3] == ok  # the folder's files come first, in the order given

    flat, _ = collect_inputs([str(d)], "image", recursive=False)
    assert [s.input for s in flat] == [str(d / "a.PNG"), str(d / "b.jpg")]


def test_resolve_device():
    from captioning.caption.api import resolve_device
    from captioning.errors import ConfigError

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="device"):
        resolve_device("tpu9")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA GPU"):
            resolve_device("cuda")


# --------------------------------------------------------------------------- end to end (slow)


@pytest.mark.slow
def test_raw_image_features_equal_stored_features(image_ckpt):
    """Raw media through the backbone as captioning runs it (batch norms folded, as the extraction
    job folds them) give the stored features bit for bit."""
    from conftest import featurize_files

    from captioning.features.backbones import build_backbone
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(image_ckpt["features_dir"])
    paths = [image_ckpt["root"] / "images" / r.path for r in image_ckpt["records"][:5]]
    got = featurize_files(build_backbone(image_ckpt["enc"]).for_inference(), paths, "image", batch_size=3)
    for r, f in zip(image_ckpt["records"][:5], got, strict=True):
        stored = store[r.item_id]
        assert f.error is None and f.features.dtype == torch.float16
        assert f.valid == stored.valid == GRID[0] * GRID[1]
        np.testing.assert_array_equal(f.features.numpy(), np.asarray(stored.features))
        assert tuple(f.pixels.shape) == (3, IMAGE_SIZE, IMAGE_SIZE) and f.pixels.dtype == torch.uint8


@pytest.mark.slow
def test_raw_video_features_equal_stored_features(video_ckpt):
    from conftest import featurize_files

    from captioning.features.backbones import build_backbone
    from captioning.store.feature_store import FeatureStore

    store = FeatureStore.open(video_ckpt["features_dir"])
    # the extraction's batch (8 videos): the backbone then sees the same frame batch, so fp16 features
    # agree to the bit under any threading (single-threaded convs round differently per batch size)
    got = featurize_files(build_backbone(video_ckpt["enc"]).for_inference(), video_ckpt["videos"], "video", batch_size=8)
    for v, f in zip(video_ckpt["videos"], got, strict=True):
        stored = store[v.stem]
        assert f.error is None
        np.testing.assert_array_equal(f.features.numpy(), np.asarray(stored.features))
        assert f.frame_indices == stored.frame_indices and len(f.frame_indices) == FRAMES
        assert tuple(f.pixels.shape) == (FRAMES, 3, 64, 64)


def _rebuild_image_figure(entry: dict, image: np.ndarray, hard: bool):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from captioning.viz.image_grid import brightest_cell, build_image_attention_figure

    att = np.array(entry["attention"])
    grid = tuple(entry["attention_shape"])
    points = [brightest_cell(r, grid) for r in att] if hard else None
    fig = build_image_attention_figure(image, entry["tokens"], att, grid, hard_points=points,
                                       title=" ".join(entry["tokens"]))
    FigureCanvasAgg(fig)
    return fig


@pytest.mark.slow
@pytest.mark.parametrize("cell", [(1, 3), (3, 0)])
def test_forced_attention_is_brightest_at_that_region(image_ckpt, tmp_path, monkeypatch, cell):
    from captioning.cli.caption import caption

    _force_attention(monkeypatch, cell[0] * GRID[1] + cell[1])
    image = image_ckpt["images"][0]
    summary = caption(_config(image_ckpt["soft"], [image], tmp_path / "out"))
    assert summary.failed == 0 and summary.captioned == 1
    entry = summary.entries[0]
    _check_entries(summary.entries)
    assert entry["attention_shape"] == list(GRID)
    att = np.array(entry["attention"])
    assert (att.argmax(axis=1) == cell[0] * GRID[1] + cell[1]).all() and att.max() > 0.99

    png_path = tmp_path / "out" / entry["figure"]
    # the first panel is the crop the model saw: rebuild the figure from it to find the panels
    crop = np.asarray(Image.open(image).convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE)))
    fig = _rebuild_image_figure(entry, crop, hard=False)
    for ax in fig.axes[1: 1 + len(entry["tokens"])]:
        panel = _panel_pixels(fig, ax, png_path)
        heat = panel[..., 0] - panel[..., 2]  # jet over a gray image: red minus blue grows with the weight
        y, x = np.unravel_index(int(np.argmax(heat)), heat.shape)
        ph, pw = heat.shape
        assert (int(y * GRID[0] // ph), int(x * GRID[1] // pw)) == cell


def test_captions_file_round_trips_into_the_figures(image_ckpt, tmp_path):
    """captions.json + attention.npy read back (read_captions) draw the job's figures again, to the
    float16 rounding of the weights; each word's log-prob (then <eos>'s) sums to the score."""
    from captioning.caption.api import CaptionResult
    from captioning.cli.caption import caption
    from captioning.features.featurize import display_crop
    from captioning.viz.heatmaps import plot_result

    out = tmp_path / "out"
    summary = caption(_config(image_ckpt["soft"], image_ckpt["images"][:2], out))
    back = read_captions(out / "captions.json")
    assert json.loads((out / "captions.json").read_text())[1]["attention"] == [len(back[0]["tokens"]),
                                                                              len(back[0]["tokens"]) + len(back[1]["tokens"])]
    for path, mem, e in zip(image_ckpt["images"][:2], summary.entries, back, strict=True):
        np.testing.assert_allclose(e["attention"], mem["attention"], rtol=2.0**-11, atol=1e-7)
        assert len(e["token_log_probs"]) == len(e["tokens"]) + 1  # finished: <eos>'s last
        assert sum(e["token_log_probs"]) == pytest.approx(e["score"], abs=1e-3)  # no length penalty
        crop = display_crop(image_ckpt["meta"], path).permute(1, 2, 0).numpy()
        again = plot_result(CaptionResult(e["input"], "image", tokens=e["tokens"], attention=e["attention"],
                                          attention_shape=e["attention_shape"], image=crop), tmp_path / "again.png")
        drawn = np.asarray(Image.open(out / e["figure"]).convert("RGB"), dtype=np.int16)
        redrawn = np.asarray(Image.open(again).convert("RGB"), dtype=np.int16)
        assert drawn.shape == redrawn.shape and np.abs(drawn - redrawn).mean() < 0.05, np.abs(drawn - redrawn).mean()


@pytest.mark.slow
def test_hard_attention_marks_the_argmax_location(image_ckpt, tmp_path, monkeypatch):
    from captioning.cli.caption import caption

    cell = (2, 1)
    _force_attention(monkeypatch, cell[0] * GRID[1] + cell[1])
    summary = caption(_config(image_ckpt["hard"], [image_ckpt["images"][1]], tmp_path / "out"))
    entry = summary.entries[0]
    crop = np.asarray(Image.open(image_ckpt["images"][1]).convert("RGB"))
    fig = _rebuild_image_figure(entry, crop, hard=True)
    panel = _panel_pixels(fig, fig.axes[1], tmp_path / "out" / entry["figure"])
    cyan = (panel[..., 0] < 90) & (panel[..., 1] > 190) & (panel[..., 2] > 200)  # the marker colour
    assert cyan.sum() > 20
    ys, xs = np.nonzero(cyan)
    ph, pw = cyan.shape
    assert (int(ys.mean() * GRID[0] // ph), int(xs.mean() * GRID[1] // pw)) == cell
    # the soft model's panels carry no marker
    _force_attention(monkeypatch, cell[0] * GRID[1] + cell[1])
    soft = caption(_config(image_ckpt["soft"], [image_ckpt["images"][1]], tmp_path / "soft"))
    fig = _rebuild_image_figure(soft.entries[0], crop, hard=False)
    panel = _panel_pixels(fig, fig.axes[1], tmp_path / "soft" / soft.entries[0]["figure"])
    assert ((panel[..., 0] < 90) & (panel[..., 1] > 190) & (panel[..., 2] > 200)).sum() == 0


@pytest.mark.slow
def test_cli_corrupt_unsupported_and_missing_inputs(image_ckpt, tmp_path):
    media = tmp_path / "in"
    media.mkdir()
    for p in image_ckpt["images"][:3]:
        shutil.copy(p, media / p.name)
    (media / "broken.jpg").write_bytes(image_ckpt["images"][3].read_bytes()[:300])  # truncated JPEG
    (media / "notes.txt").write_text("not an image")
    explicit = tmp_path / "list.csv"
    explicit.write_text("a,b")
    out = tmp_path / "out"
    proc = run_cli("caption", f"ckpt_path={image_ckpt['soft']}", f"inputs=[{media},{explicit},{tmp_path}/nope.png]",
                   f"output_dir={out}", "decode.beam_size=2", "decode.max_length=5", "num_workers=0",
                   "device=cpu", check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    entries = read_captions(out / "captions.json")
    _check_entries(entries)
    by_input = {Path(e["input"]).name: e for e in entries}
    assert set(by_input) == {p.name for p in image_ckpt["images"][:3]} | {"broken.jpg", "list.csv", "nope.png"}
    assert "cannot decode image" in by_input["broken.jpg"]["error"]
    assert "unsupported file type '.csv'" in by_input["list.csv"]["error"]
    assert "input not found" in by_input["nope.png"]["error"]
    for p in image_ckpt["images"][:3]:
        e = by_input[p.name]
        assert "error" not in e and e["kind"] == "image"
        assert (out / e["figure"]).is_file()
        assert len(e["attention"][0]) == GRID[0] * GRID[1]
    assert len(list((out / "figures").glob("*.png"))) == 3
    html = (out / "index.html").read_text()
    assert "3 captioned, 3 failed" in html and "broken.jpg" in html
    assert "notes.txt" in proc.stdout + proc.stderr  # skipped with a note
    assert f"results in {out}" in proc.stdout
    assert proc.stderr.count("failed: ") == 3

    # the same folder again: the output folder's figures are not inputs; max_items limits
    run_cli("caption", f"ckpt_path={image_ckpt['soft']}", f"inputs=[{media}]", f"output_dir={media}/res",
                    "max_items=2", "num_workers=0", "device=cpu", "progress=false", check=False)
    entries = json.loads((media / "res" / "captions.json").read_text())
    assert len([e for e in entries if "error" not in e]) == 2


@pytest.mark.slow
def test_cli_config_errors_exit_2(image_ckpt, tmp_path):
    proc = run_cli("caption", f"ckpt_path={image_ckpt['soft']}", f"output_dir={tmp_path}/o", check=False)
    assert proc.returncode == 2 and "nothing to caption" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("caption", f"ckpt_path={tmp_path}/none.ckpt", f"inputs=[{image_ckpt['images'][0]}]",
                   f"output_dir={tmp_path}/o", check=False)
    assert proc.returncode == 2 and "checkpoint not found" in proc.stderr


@pytest.mark.slow
def test_checkpoint_without_encoder_meta_is_refused(image_ckpt, tmp_path):
    from captioning.cli.caption import caption
    from captioning.errors import CheckpointError

    meta = {k: v for k, v in image_ckpt["meta"].items() if k != "encoder"}
    old = save_checkpoint(tmp_path / "old.ckpt", meta, image_ckpt["vocab"], image_ckpt["data"],
                           image_ckpt["features_dir"])
    with pytest.raises(CheckpointError, match="older version"):
        caption(_config(old, [image_ckpt["images"][0]], tmp_path / "out"))
    # a backbone that does not give the recorded settings is refused too
    meta = {**image_ckpt["meta"], "encoder": {**image_ckpt["meta"]["encoder"], "image_size": 96}}
    other = save_checkpoint(tmp_path / "other.ckpt", meta, image_ckpt["vocab"], image_ckpt["data"],
                             image_ckpt["features_dir"])
    with pytest.raises(CheckpointError, match="differs"):
        caption(_config(other, [image_ckpt["images"][0]], tmp_path / "out"))


@pytest.mark.slow
def test_html_escapes_captions_and_file_names(image_ckpt, tmp_path, monkeypatch):
    import captioning.caption.api as api
    from captioning.cli.caption import caption

    load = api.load_captioner

    def load_with_html_words(path, map_location="cpu"):
        model = load(path, map_location)
        model.vocab.itos[4:] = [f'<b onmouseover="x">{w}</b>&' for w in model.vocab.itos[4:]]
        return model

    monkeypatch.setattr(api, "load_captioner", load_with_html_words)  # where the caption API looks it up
    odd = tmp_path / "in" / "<img src=x onerror=alert(1)>.jpg"
    odd.parent.mkdir()
    shutil.copy(image_ckpt["images"][0], odd)
    summary = caption(_config(image_ckpt["soft"], [odd], tmp_path / "out"))
    assert summary.failed == 0
    assert summary.entries[0]["tokens"][0].startswith("<b ")
    html = (tmp_path / "out" / "index.html").read_text()
    assert "<b " not in html and "<img src=x" not in html
    assert "&lt;b onmouseover=&quot;x&quot;&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert (tmp_path / "out" / summary.entries[0]["figure"]).is_file()


@pytest.mark.slow
def test_store_split_matches_raw_captions(image_ckpt, tmp_path):
    from captioning.cli.caption import caption

    stored = caption(_config(image_ckpt["soft"], [], tmp_path / "store", store_split="test"))
    test_records = [r for r in image_ckpt["records"] if r.split == "test"]
    assert stored.failed == 0 and stored.captioned == len({r.item_id for r in test_records})
    _check_entries(stored.entries)
    raw_inputs = [image_ckpt["root"] / "images" / e["input"] for e in stored.entries]
    raw = caption(_config(image_ckpt["soft"], raw_inputs, tmp_path / "raw"))
    for a, b in zip(stored.entries, raw.entries, strict=True):
        assert a["tokens"] == b["tokens"]
        np.testing.assert_allclose(a["attention"], b["attention"], atol=1e-5)
    # a missing media file only costs its figure
    (image_ckpt["root"] / "images" / stored.entries[0]["input"]).rename(tmp_path / "moved.jpg")
    try:
        again = caption(_config(image_ckpt["soft"], [], tmp_path / "store2", store_split="test"))
    finally:
        (tmp_path / "moved.jpg").rename(image_ckpt["root"] / "images" / stored.entries[0]["input"])
    assert again.failed == 1 and "cannot draw the figure" in again.entries[0]["error"]


@pytest.mark.slow
def test_video_highlights_the_attended_frame(video_ckpt, tmp_path, monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from captioning.cli.caption import caption
    from captioning.viz.video_frames import HIGHLIGHT_OVERALL, build_video_attention_figure

    forced = 4
    _force_attention(monkeypatch, forced)
    summary = caption(_config(video_ckpt["ckpt"], [video_ckpt["videos"][0]], tmp_path / "out"))
    assert summary.failed == 0
    entry = summary.entries[0]
    _check_entries(summary.entries)
    assert entry["kind"] == "video" and entry["attention_shape"] == [FRAMES]
    assert len(entry["frame_indices"]) == FRAMES
    att = np.array(entry["attention"])
    assert (att.argmax(axis=1) == forced).all()

    from captioning.data.video import read_frames

    frames = read_frames(video_ckpt["videos"][0], entry["frame_indices"])
    fig, info = build_video_attention_figure(frames, entry["tokens"], att, entry["frame_indices"],
                                             title=" ".join(entry["tokens"]))
    FigureCanvasAgg(fig).draw()
    assert info["overall"] == forced
    png = np.asarray(Image.open(tmp_path / "out" / entry["figure"]).convert("RGB")).astype(float)
    red = np.array([int(HIGHLIGHT_OVERALL[i: i + 2], 16) for i in (1, 3, 5)], dtype=float)
    H = png.shape[0]
    share = []
    for ax in info["strip_axes"]:
        bb = ax.get_window_extent()
        y0, x0, x1 = int(round(H - bb.y1)), int(round(bb.x0)), int(round(bb.x1))
        band = png[max(0, y0 - 2): y0 + 2, x0 + 3: x1 - 3]  # the top border of the thumbnail
        share.append(float((np.abs(band - red).sum(-1) < 60).mean()))
    assert int(np.argmax(share)) == info["strip"].index(forced) and max(share) > 0.5
    assert sorted(share)[-2] < 0.2


@pytest.mark.slow
def test_cli_video_input_exit_0(video_ckpt, tmp_path):
    out = tmp_path / "out"
    proc = run_cli("caption", f"ckpt_path={video_ckpt['ckpt']}", f"inputs=[{video_ckpt['root'] / 'videos'}]",
                   f"output_dir={out}", "decode.beam_size=3", "num_workers=1", "device=auto", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = read_captions(out / "captions.json")
    _check_entries(entries)
    assert len(entries) == len(video_ckpt["videos"])
    for e in entries:
        assert e["kind"] == "video" and len(e["frame_indices"]) == FRAMES
        assert (out / e["figure"]).is_file()
    assert (out / "index.html").is_file() and "results in" in proc.stdout
