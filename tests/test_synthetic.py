"""Synthetic data generators: determinism, boxes/spans that match the pixels, decodable videos,
captions that mention every object, both event orders, and the generate CLI's skip/stamp logic."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import av
import decord
import numpy as np
import pytest
from conftest import run_cli
from PIL import Image

from captioning.data.synthetic import ensure_generated, generate_moving_shapes, generate_shapes
from captioning.data.synthetic.common import (
    COLOUR_TOLERANCE,
    PALETTE,
    caption_tokens,
    colour_masks,
    split_sizes,
)
from captioning.data.synthetic.moving_shapes import event_times, span_half_width
from captioning.errors import ConfigError

N_IMAGES, N_VIDEOS, FRAMES = 20, 10, 16


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, num_images=N_IMAGES, seed=0, workers=1)
    return root


@pytest.fixture(scope="module")
def videos_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("moving")
    generate_moving_shapes(root, num_videos=N_VIDEOS, seed=0, frames=FRAMES, workers=1)
    return root


# ----------------------------------------------------------------------------- shapes


def test_shapes_deterministic(shapes_root, tmp_path):
    again = tmp_path / "again"
    generate_shapes(again, num_images=N_IMAGES, seed=0, workers=2)  # process count must not matter
    assert _files(again) == _files(shapes_root)
    other = tmp_path / "other"
    generate_shapes(other, num_images=N_IMAGES, seed=1, workers=1)
    a, b = _files(shapes_root), _files(other)
    assert a.keys() == b.keys()
    assert a["annotations/grounding.json"] != b["annotations/grounding.json"]
    assert sum(a[k] != b[k] for k in a if k.startswith("images/")) == N_IMAGES


def test_shapes_coco_layout(shapes_root):
    ids = []
    counts = {}
    for split in ("train", "val", "test"):
        coco = json.loads((shapes_root / "annotations" / f"captions_{split}.json").read_text())
        assert {"info", "licenses", "images", "annotations"} <= coco.keys()
        counts[split] = len(coco["images"])
        per_image = Counter(a["image_id"] for a in coco["annotations"])
        for im in coco["images"]:
            assert (im["width"], im["height"]) == (224, 224)
            assert per_image[im["id"]] == 5
            with Image.open(shapes_root / "images" / im["file_name"]) as pil:
                assert pil.format == "JPEG" and pil.mode == "RGB" and pil.size == (224, 224)
            ids.append(im["id"])
    assert counts == {"train": 16, "val": 2, "test": 2}
    assert sorted(ids) == list(range(1, N_IMAGES + 1))
    ann_ids = [a["id"] for s in ("train", "val", "test")
               for a in json.loads((shapes_root / "annotations" / f"captions_{s}.json").read_text())["annotations"]]
    assert len(set(ann_ids)) == len(ann_ids)
    grounding = json.loads((shapes_root / "annotations" / "grounding.json").read_text())
    assert grounding["kind"] == "image"
    assert sorted(int(k) for k in grounding["items"]) == sorted(ids)


def test_shapes_boxes_match_pixels(shapes_root):
    grounding = json.loads((shapes_root / "annotations" / "grounding.json").read_text())["items"]
    for image_id, item in grounding.items():
        pixels = np.asarray(Image.open(shapes_root / "images" / f"{int(image_id):06d}.jpg").convert("RGB"))
        masks = colour_masks(pixels)
        inside = np.zeros(pixels.shape[:2], bool)
        assert item["size"] == [224, 224]
        assert 1 <= len(item["objects"]) <= 4
        for obj in item["objects"]:
            x0, y0, x1, y1 = obj["box"]
            assert 0 <= x0 < x1 <= 224 and 0 <= y0 < y1 <= 224
            inside[max(0, y0 - 2):y1 + 2, max(0, x0 - 2):x1 + 2] = True  # JPEG blurs edges by ~1 px
            in_box = {c: int(m[y0:y1, x0:x1].sum()) for c, m in masks.items()}
            # the object's colour dominates its box (a star fills ~35% of its box)
            assert max(in_box, key=in_box.get) == obj["colour"], (image_id, obj, in_box)
            assert in_box[obj["colour"]] >= 0.25 * (x1 - x0) * (y1 - y0), (image_id, obj, in_box)
            # the box is tight: the colour comes within a few pixels of every side (JPEG blurs thin tips)
            m = masks[obj["colour"]][y0:y1, x0:x1]
            assert m[:4].any() and m[-4:].any() and m[:, :4].any() and m[:, -4:].any(), (image_id, obj)
            assert {obj["colour"], obj["shape"], obj["size"]} <= set(obj["words"])
        # no palette colour outside the boxes (beyond noise and JPEG edge blur)
        outside = ~inside
        for c, m in masks.items():
            assert (m & outside).sum() <= 0.001 * outside.sum(), (image_id, c)


def test_shapes_captions_mention_objects(shapes_root):
    grounding = json.loads((shapes_root / "annotations" / "grounding.json").read_text())["items"]
    captions: dict[int, list[str]] = {}
    for split in ("train", "val", "test"):
        for a in json.loads((shapes_root / "annotations" / f"captions_{split}.json").read_text())["annotations"]:
            captions.setdefault(a["image_id"], []).append(a["caption"])
    vocab = set()
    for image_id, caps in captions.items():
        objects = grounding[str(image_id)]["objects"]
        for cap in caps:
            tokens = caption_tokens(cap)
            vocab.update(tokens)
            assert 2 <= len(tokens) <= 17, cap
            for obj in objects:
                assert obj["colour"] in tokens, (cap, obj)
                assert obj["shape"] in tokens or obj["words"][3] in tokens, (cap, obj)
            if len(objects) >= 3:  # counting captions use the right number
                numbers = {"two": 2, "three": 3, "four": 4}
                said = [numbers[t] for t in tokens if t in numbers and f"{t} shapes" in cap]
                assert all(n == len(objects) for n in said), cap
    assert len(vocab) < 60


def test_shapes_relations_are_true():
    """'X to the left of Y' / 'X above Y' agree with the object positions."""
    from captioning.data.synthetic.shapes import render_image

    checked = 0
    for i in range(60):
        _, objects, caps = render_image(i, seed=3)
        if len(objects) != 2:
            continue
        centre = {(o["colour"], o["shape"]): o["center"] for o in objects}
        for cap in caps:
            for rel, axis, sign in ((" to the left of ", 0, 1), (" to the right of ", 0, -1),
                                    (" above ", 1, 1), (" below ", 1, -1)):
                if rel in cap:
                    left, right = cap.split(rel)
                    a = tuple(caption_tokens(left)[-2:])
                    b = tuple(caption_tokens(right)[-2:])
                    assert sign * (centre[b][axis] - centre[a][axis]) > 0, (cap, centre)
                    checked += 1
    assert checked > 20


# ----------------------------------------------------------------------------- moving shapes


def test_videos_decode_to_frame_count(videos_root):
    for i in range(N_VIDEOS):
        path = videos_root / "videos" / f"video{i}.mp4"
        vr = decord.VideoReader(str(path))
        assert len(vr) == FRAMES
        assert vr[0].shape == (96, 96, 3)
        assert vr.get_batch(list(range(FRAMES))).shape[0] == FRAMES
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
            assert sum(1 for _ in c.decode(video=0)) == FRAMES


def _decoded(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.int16)


def test_videos_deterministic(videos_root, tmp_path):
    """Same seed, any process count: identical annotations and videos.  Videos are compared as
    decoded pixels: x264 (one thread) reproduces the bytes in a fresh process, but in a long-lived
    test process a few P-frames of a video have been seen to come out encoded differently
    (decoded difference <= 12 levels on < 2% of pixels; the next I-frame is identical again)."""
    again = tmp_path / "again"
    generate_moving_shapes(again, num_videos=N_VIDEOS, seed=0, frames=FRAMES, workers=2)
    a, b = _files(again), _files(videos_root)
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if not k.endswith(".mp4")} == {
        k: v for k, v in b.items() if not k.endswith(".mp4")
    }
    for i in range(N_VIDEOS):
        x, y = _decoded(again / "videos" / f"video{i}.mp4"), _decoded(videos_root / "videos" / f"video{i}.mp4")
        assert x.shape == y.shape == (FRAMES, 96, 96, 3)
        diff = np.abs(x - y)
        assert diff.max() <= 32 and diff.mean() < 0.5, (i, int(diff.max()), float(diff.mean()))
    other = tmp_path / "other"
    generate_moving_shapes(other, num_videos=4, seed=1, frames=FRAMES, workers=1)
    a, b = _files(videos_root), _files(other)
    assert a["videos/video0.mp4"] != b["videos/video0.mp4"]
    assert a["annotations/grounding.json"] != b["annotations/grounding.json"]


def _count(frame: np.ndarray, box: list[int], colour: str) -> int:
    x0, y0, x1, y1 = box
    return int(colour_masks(frame[y0:y1, x0:x1])[colour].sum())


def test_video_spans_match_frames(videos_root):
    check_spans(videos_root, FRAMES, 2)


def test_three_event_videos(tmp_path):
    generate_moving_shapes(tmp_path, num_videos=4, seed=0, frames=24, num_events=(3,), workers=1)
    check_spans(tmp_path, 24, 3)
    info = json.loads((tmp_path / "annotations" / "videodatainfo.json").read_text())
    assert all(len(caption_tokens(s["caption"])) <= 24 for s in info["sentences"])


def check_spans(root: Path, num_frames: int, num_events: int) -> None:
    """Each event's state change happens exactly at its frame t, inside its span, on decoded frames."""
    FRAMES = num_frames  # noqa: N806
    grounding = json.loads((root / "annotations" / "grounding.json").read_text())
    assert grounding["kind"] == "video"
    for video_id, item in grounding["items"].items():
        frames = decord.VideoReader(str(root / "videos" / f"{video_id}.mp4")).get_batch(
            list(range(FRAMES))).asnumpy()
        assert item["num_frames"] == FRAMES
        events = item["events"]
        assert len(events) == num_events
        h = span_half_width(len(events), FRAMES)
        previous_end = 0
        for e in events:
            t, (f0, f1) = e["frame"], e["span"]
            assert (f0, f1) == (t - h, t + h) and previous_end <= f0 < t < f1 <= FRAMES
            previous_end = f1
            for f in range(FRAMES):
                after = f >= t
                c0, c1 = e["colour"], e["colour_after"]
                n0, n1 = _count(frames[f], e["box"], c0), _count(frames[f], e["box"], c1)
                what = (video_id, e["words"], f)
                if e["type"] == "appear":
                    assert (n0 >= 30) if after else (n0 <= 3), what
                elif e["type"] == "disappear":
                    assert (n0 <= 3) if after else (n0 >= 30), what
                elif e["type"] == "change":
                    assert c0 != c1
                    assert (n0 <= 3 and n1 >= 30) if after else (n0 >= 30 and n1 <= 3), what
                else:
                    assert n0 >= 30, what
            # grow / shrink: the object's area changes by a large factor at t
            before = np.mean([_count(frames[f], e["box"], e["colour"]) for f in range(f0, t)])
            later = np.mean([_count(frames[f], e["box"], e["colour"]) for f in range(t, f1)])
            if e["type"] == "grow":
                assert later > 1.8 * before, (video_id, before, later)
            elif e["type"] == "shrink":
                assert before > 1.8 * later, (video_id, before, later)


def test_video_captions_and_msrvtt_format(videos_root):
    info = json.loads((videos_root / "annotations" / "videodatainfo.json").read_text())
    grounding = json.loads((videos_root / "annotations" / "grounding.json").read_text())["items"]
    assert [v["video_id"] for v in info["videos"]] == [f"video{i}" for i in range(N_VIDEOS)]
    assert Counter(v["split"] for v in info["videos"]) == {"train": 8, "validate": 1, "test": 1}
    for v in info["videos"]:
        assert v["id"] == int(v["video_id"][5:]) and v["end time"] > v["start time"] == 0
    sen_ids = [s["sen_id"] for s in info["sentences"]]
    assert len(set(sen_ids)) == len(sen_ids) == 5 * N_VIDEOS
    by_video: dict[str, list[str]] = {}
    for s in info["sentences"]:
        by_video.setdefault(s["video_id"], []).append(s["caption"])
    for video_id, caps in by_video.items():
        assert len(caps) == len(set(caps)) == 5
        first, second = (" ".join(e["words"]) for e in grounding[video_id]["events"])
        for cap in caps:
            text = " ".join(caption_tokens(cap))
            assert first in text and second in text, cap
            # the temporal word puts them in the right order
            if " after " in text:
                assert text.index(second) < text.index(first), cap
            else:
                assert text.index(first) < text.index(second), cap


def test_both_event_orders_equally_frequent(tmp_path):
    from captioning.data.synthetic.moving_shapes import build_video

    sequences = Counter()
    for i in range(40):
        events = [o for o in build_video(i, seed=5, frames=FRAMES, size=96) if o.event is not None]
        sequences[tuple(" ".join(o.words()) for o in events)] += 1
    assert len(sequences) >= 15
    for seq, n in sequences.items():
        assert sequences[seq[::-1]] == n, seq


def test_event_times_symmetric_about_middle():
    for n, frames in ((2, 48), (3, 48), (2, 16)):
        rng = np.random.default_rng(0)
        seen = Counter(tuple(event_times(n, frames, rng)) for _ in range(3000))
        for times in seen:
            mirrored = tuple(sorted(frames - t for t in times))
            assert mirrored in seen, (n, frames, times)
        h = span_half_width(n, frames)
        assert all(b - a >= 2 * h for ts in seen for a, b in zip(ts, ts[1:], strict=False))
        assert all(ts[0] - h >= 0 and ts[-1] + h <= frames for ts in seen)


# ----------------------------------------------------------------------------- generation driver


def test_split_sizes_validated():
    assert split_sizes(10, (0.8, 0.1, 0.1)) == (8, 1, 1)
    assert split_sizes(3, (1.0, 0.0, 0.0)) == (3, 0, 0)
    with pytest.raises(ConfigError, match="summing to 1"):
        split_sizes(10, (0.8, 0.3, 0.1))


def test_ensure_generated_skips_regenerates_and_keeps_features(tmp_path):
    root = tmp_path / "shapes"
    r1 = ensure_generated("shapes", root, num_items=6, seed=0)
    assert r1["generated"] and (root / "generated.json").is_file()
    stamp = json.loads((root / "generated.json").read_text())
    assert stamp["params"]["num_items"] == 6 and stamp["summary"]["splits"]["train"] == 5
    (root / "features").mkdir()
    (root / "features" / "keep.txt").write_text("x")
    before = (root / "images" / "000001.jpg").stat().st_mtime_ns
    assert not ensure_generated("shapes", root, num_items=6, seed=0)["generated"]
    assert (root / "images" / "000001.jpg").stat().st_mtime_ns == before
    assert ensure_generated("shapes", root, num_items=6, seed=0, force=True)["generated"]
    r4 = ensure_generated("shapes", root, num_items=4, seed=0)  # new parameters: regenerated
    assert r4["generated"] and len(list((root / "images").iterdir())) == 4
    assert (root / "features" / "keep.txt").read_text() == "x"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folders left
    with pytest.raises(ConfigError, match="unknown synthetic dataset"):
        ensure_generated("circles", tmp_path / "c")


def test_interrupted_generation_never_looks_finished(tmp_path, monkeypatch):
    import captioning.data.synthetic.shapes as shapes_mod

    root = tmp_path / "shapes"
    ensure_generated("shapes", root, num_items=3, seed=0)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shapes_mod, "generate_shapes", boom)
    with pytest.raises(KeyboardInterrupt):
        ensure_generated("shapes", root, num_items=5, seed=0)
    # the previous complete dataset is untouched and still stamped with its own parameters
    assert json.loads((root / "generated.json").read_text())["params"]["num_items"] == 3
    assert len(list((root / "images").iterdir())) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_generate_cli(tmp_path):
    root = tmp_path / "ms"
    args = ("dataset=moving_shapes", "num_items=4", "frames=16", "video_size=64", f"root={root}",
            f"hydra.run.dir={tmp_path / 'run'}")
    run_cli("generate", *args)
    stamp = json.loads((root / "generated.json").read_text())
    assert stamp["params"] == {"dataset": "moving_shapes", "version": 1, "num_items": 4, "seed": 0,
                               "frames": 16, "video_size": 64}
    assert len(decord.VideoReader(str(root / "videos" / "video3.mp4"))) == 16
    assert decord.VideoReader(str(root / "videos" / "video3.mp4"))[0].shape == (64, 64, 3)
    proc = run_cli("generate", "dataset=circles", f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 2 and "unknown synthetic dataset" in proc.stderr


def test_palette_is_separable():
    """Palette colours are far apart, so the colour tests above are meaningful."""
    rgb = np.asarray(list(PALETTE.values()), float)
    d = np.sqrt(((rgb[:, None] - rgb[None]) ** 2).sum(-1)) + np.eye(len(rgb)) * 1e9
    assert d.min() > 2 * COLOUR_TOLERANCE
    greys = np.stack([np.arange(0, 181)] * 3, axis=1)[:, None, :].astype(float)
    assert np.sqrt(((greys - rgb[None]) ** 2).sum(-1)).min() > 1.4 * COLOUR_TOLERANCE  # backgrounds are greys <= ~175
