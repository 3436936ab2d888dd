"""Synthetic data generators: determinism, boxes/spans that match the pixels, decodable videos,
captions that bind colours to shapes in left-to-right order, shared colours/shapes, video pairs
that are frame permutations of each other, and the generate CLI's skip/stamp logic."""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from pathlib import Path

import av
import decord
import numpy as np
import pytest
import yaml
from conftest import REPO, run_cli
from PIL import Image

from captioning.data.synthetic import ensure_generated, generate_moving_shapes, generate_shapes
from captioning.data.synthetic.common import (
    COLOUR_TOLERANCE,
    COLOURS,
    PALETTE,
    SHAPES,
    caption_tokens,
    split_sizes,
)
from captioning.data.synthetic.datasets import GENERATOR_VERSION, generation_params
from captioning.data.synthetic.moving_shapes import EVENT_TYPES, UNITS, plan_pair, render_video
from captioning.data.synthetic.shapes import GRID, caption_templates, image_layout
from captioning.data.video import sample_frame_indices
from captioning.errors import ConfigError

N_IMAGES, N_VIDEOS, FRAMES = 20, 8, 32



def colour_masks(pixels: np.ndarray, tolerance: float = COLOUR_TOLERANCE) -> dict[str, np.ndarray]:
    """For uint8 pixels [..., 3]: colour name -> bool mask of pixels within ``tolerance`` of it."""
    px = pixels.astype(np.float32)
    return {name: np.sqrt(((px - np.asarray(rgb, np.float32)) ** 2).sum(-1)) < tolerance for name, rgb in PALETTE.items()}

def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _pairs(caption: str) -> list[tuple[str, str]]:
    """(colour, shape) of every colour word directly followed by a shape word."""
    t = caption_tokens(caption)
    return [(a, b) for a, b in zip(t, t[1:], strict=False) if a in COLOURS and b in SHAPES]


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    generate_shapes(root, num_images=N_IMAGES, seed=0, workers=1)
    return root


@pytest.fixture(scope="module")
def videos_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("moving")
    generate_moving_shapes(root, num_videos=N_VIDEOS, seed=0, frames=FRAMES, workers=1, events=EVENT_TYPES)
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
    assert grounding["word_classes"] == {"colour": list(COLOURS), "shape": list(SHAPES)}
    assert sorted(int(k) for k in grounding["items"]) == sorted(ids)


def test_shapes_boxes_match_pixels(shapes_root):
    grounding = json.loads((shapes_root / "annotations" / "grounding.json").read_text())["items"]
    chance = []
    for image_id, item in grounding.items():
        pixels = np.asarray(Image.open(shapes_root / "images" / f"{int(image_id):06d}.jpg").convert("RGB"))
        masks = colour_masks(pixels)
        inside = np.zeros(pixels.shape[:2], bool)
        assert item["size"] == [224, 224]
        assert 2 <= len(item["objects"]) <= 6
        for rank, obj in enumerate(item["objects"]):
            x0, y0, x1, y1 = obj["box"]
            assert 0 <= x0 < x1 <= 224 and 0 <= y0 < y1 <= 224
            assert obj["rank"] == rank and obj["words"] == [obj["colour"], obj["shape"]]
            # the box is about centred on the layout point, which lies on the half-cell lattice
            cx, cy = obj["center"]
            assert abs((x0 + x1) / 2 - cx) <= 4 and abs((y0 + y1) / 2 - cy) <= 6, (image_id, obj)
            assert cx % 16 == 0 and cy % 16 == 0 and 32 <= min(cx, cy) and max(cx, cy) <= 192
            inside[max(0, y0 - 2):y1 + 2, max(0, x0 - 2):x1 + 2] = True  # JPEG blurs edges by ~1 px
            in_box = {c: int(m[y0:y1, x0:x1].sum()) for c, m in masks.items()}
            # the object's colour dominates its box (a star fills ~35% of its box)
            assert max(in_box, key=in_box.get) == obj["colour"], (image_id, obj, in_box)
            assert in_box[obj["colour"]] >= 0.25 * (x1 - x0) * (y1 - y0), (image_id, obj, in_box)
            # the box is tight: the colour comes within a few pixels of every side (JPEG blurs thin tips)
            m = masks[obj["colour"]][y0:y1, x0:x1]
            assert m[:4].any() and m[-4:].any() and m[:, :4].any() and m[:, -4:].any(), (image_id, obj)
            # pointing chance: cells of the 7x7 grid (32 px) whose centre is in the box
            centres = np.arange(7) * 32 + 16
            chance.append(((centres >= x0) & (centres < x1)).sum() * ((centres >= y0) & (centres < y1)).sum() / 49)
        # no palette colour outside the boxes (beyond noise and JPEG edge blur)
        outside = ~inside
        for c, m in masks.items():
            assert (m & outside).sum() <= 0.001 * outside.sum(), (image_id, c)
    assert set(chance) <= {1 / 49, 2 / 49, 4 / 49}
    assert 0.03 < np.mean(chance) < 0.07


def test_shapes_captions_list_objects_left_to_right(shapes_root):
    grounding = json.loads((shapes_root / "annotations" / "grounding.json").read_text())["items"]
    captions: dict[int, list[str]] = {}
    for split in ("train", "val", "test"):
        for a in json.loads((shapes_root / "annotations" / f"captions_{split}.json").read_text())["annotations"]:
            captions.setdefault(a["image_id"], []).append(a["caption"])
    for image_id, caps in captions.items():
        objects = grounding[str(image_id)]["objects"]
        by_x = sorted(objects, key=lambda o: o["box"][0] + o["box"][2])
        assert [o["rank"] for o in by_x] == list(range(len(objects)))
        truth = [(o["colour"], o["shape"]) for o in by_x]
        assert len(set(caps)) == 5
        for cap in caps:
            assert _pairs(cap) == truth, (cap, truth)


def test_layouts_share_colours_and_shapes():
    """200 layouts (no rendering): distinct pairs, shared colours/shapes, 1-cell x gaps, no overlap."""
    counts, shared = Counter(), 0
    two_object = Counter()
    for i in range(200):
        objs = image_layout(i, seed=7)
        n = len(objs)
        counts[n] += 1
        pairs = [(o.colour, o.shape) for o in objs]
        assert len(set(pairs)) == n  # every object has its own (colour, shape)
        colours_repeat = len({o.colour for o in objs}) < n
        shapes_repeat = len({o.shape for o in objs}) < n
        shared += colours_repeat or shapes_repeat
        if n >= 3:
            assert colours_repeat and shapes_repeat, pairs
        else:
            two_object[(colours_repeat, shapes_repeat)] += 1
        cell = 224 / GRID
        xs = [o.cx for o in objs]
        assert all(b - a >= cell for a, b in zip(xs, xs[1:], strict=False))  # sorted, >= 1 cell apart
        for k, a in enumerate(objs):
            for b in objs[k + 1:]:
                gap = a.r + b.r + cell / 4
                assert abs(a.cx - b.cx) >= gap or abs(a.cy - b.cy) >= gap
    assert set(counts) == {2, 3, 4, 5, 6} and min(counts.values()) >= 25
    assert shared / 200 >= 0.85
    # two objects: sharing a colour, sharing a shape, or sharing neither (binding ambiguous) all occur
    assert {(True, False), (False, True), (False, False)} <= set(two_object)


def test_caption_length_grows_with_object_count():
    lengths: dict[int, list[int]] = {}
    for i in range(150):
        objs = image_layout(i, seed=3)
        lengths.setdefault(len(objs), []).extend(len(caption_tokens(c)) for c in caption_templates(objs))
    means = [np.mean(lengths[n]) for n in sorted(lengths)]
    assert sorted(lengths) == [2, 3, 4, 5, 6]
    assert all(b > a + 2 for a, b in zip(means, means[1:], strict=False)), means
    longest = max(max(v) for v in lengths.values())
    assert longest == 23
    assert yaml.safe_load((REPO / "conf" / "data" / "shapes.yaml").read_text())["max_length"] >= longest


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
    generate_moving_shapes(again, num_videos=N_VIDEOS, seed=0, frames=FRAMES, workers=2, events=EVENT_TYPES)
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
    generate_moving_shapes(other, num_videos=2, seed=1, frames=FRAMES, workers=1, events=EVENT_TYPES)
    a, b = _files(videos_root), _files(other)
    assert a["videos/video0.mp4"] != b["videos/video0.mp4"]
    assert a["annotations/grounding.json"] != b["annotations/grounding.json"]


def _hashes(frames: np.ndarray) -> list[str]:
    return [hashlib.sha1(f.tobytes()).hexdigest() for f in frames]


@pytest.mark.parametrize("frames", [32, 48])
def test_video_pairs_are_frame_permutations(frames):
    """Videos 2k, 2k+1: the same multiset of frames (and of 16 uniformly sampled frames), the events
    in opposite order; mean pooling over frames cannot tell them apart."""
    sampled, _ = sample_frame_indices(frames, 16, "uniform")
    for pair in range(4):
        a, ea, ca = render_video(2 * pair, seed=2, frames=frames)
        b, eb, cb = render_video(2 * pair + 1, seed=2, frames=frames)
        ha, hb = _hashes(a), _hashes(b)
        assert sorted(ha) == sorted(hb) and ha != hb
        assert sorted(ha[i] for i in sampled) == sorted(hb[i] for i in sampled)
        assert np.array_equal(a.astype(np.int64).sum(0), b.astype(np.int64).sum(0))
        assert [e["words"] for e in ea["events"]] == [e["words"] for e in eb["events"]][::-1]
        assert set(ca).isdisjoint(cb)
        # each event is seen by 3-4 of the 16 sampled frames
        for e in ea["events"] + eb["events"]:
            assert sum(e["span"][0] <= i < e["span"][1] for i in sampled) in (3, 4)


def test_event_plans():
    types, units = Counter(), Counter()
    for pair in range(100):
        plan = plan_pair(0, pair, (2,), 96, EVENT_TYPES)
        assert len(plan.events) == 2 and len({e.shape for e in plan.events + plan.distractors}) == len(
            plan.events + plan.distractors)
        assert sum(e.units for e in plan.events) + sum(plan.gaps) == UNITS
        assert plan.gaps[0] >= 1 and plan.gaps[1] >= 2 and plan.gaps[2] >= 1
        types.update(e.event for e in plan.events)
        units.update(e.units for e in plan.events)
    assert set(types) == {"appear", "disappear", "turn", "grow", "shrink"} and min(types.values()) >= 20
    assert set(units) == {3, 4}


def _count(frame: np.ndarray, box: list[int], colour: str) -> int:
    x0, y0, x1, y1 = box
    return int(colour_masks(frame[y0:y1, x0:x1])[colour].sum())


def check_events(frames: np.ndarray, item: dict, num_events: int) -> set[str]:
    """Each event is visible exactly in its span: frames inside show the event state, frames outside
    the neutral state; spans are disjoint and separated by neutral frames.  Returns the event types."""
    num_frames = len(frames)
    u = num_frames // UNITS
    assert item["num_frames"] == num_frames
    events = item["events"]
    assert len(events) == num_events and [e["rank"] for e in events] == list(range(num_events))
    earliest = u  # >= 1 neutral unit first, >= 2 between events, >= 1 at the end
    for e in events:
        f0, f1 = e["span"]
        assert earliest <= f0 < f1 <= num_frames - u, e["span"]
        assert f0 % u == 0 and (f1 - f0) // u in (3, 4)
        earliest = f1 + 2 * u
        c0, c1 = e["colour"], e["new_colour"]
        for f in range(num_frames):
            active = f0 <= f < f1
            n0 = _count(frames[f], e["box"], c0)
            what = (e["words"], f)
            if e["type"] == "appear":
                assert (n0 >= 30) if active else (n0 <= 3), what
            elif e["type"] == "disappear":
                assert (n0 <= 3) if active else (n0 >= 30), what
            elif e["type"] == "turn":
                n1 = _count(frames[f], e["box"], c1)
                assert c0 != c1
                assert (n0 <= 3 and n1 >= 30) if active else (n0 >= 30 and n1 <= 3), what
            else:
                assert n0 >= 30, what
        if e["type"] in ("grow", "shrink"):
            during = [_count(frames[f], e["box"], c0) for f in range(f0, f1)]
            outside = [_count(frames[f], e["box"], c0) for f in range(num_frames) if not f0 <= f < f1]
            big, small = (min(during), max(outside)) if e["type"] == "grow" else (min(outside), max(during))
            assert big > 1.8 * small, (e["type"], during, outside)
    return {e["type"] for e in events}


def check_spans(root: Path, num_frames: int, num_events: int) -> set[str]:
    """``check_events`` on every decoded video under ``root``."""
    grounding = json.loads((root / "annotations" / "grounding.json").read_text())
    assert grounding["kind"] == "video" and grounding["reverse_order_words"] == ["after"]
    assert set(grounding["word_classes"]) == {"colour", "shape", "verb"}
    types = set()
    for video_id, item in grounding["items"].items():
        frames = decord.VideoReader(str(root / "videos" / f"{video_id}.mp4")).get_batch(
            list(range(num_frames))).asnumpy()
        types |= check_events(frames, item, num_events)
    return types


def test_rendered_events_visible_exactly_in_their_spans():
    types = set()
    for i in range(8):  # 4 pairs of seed 4 show all five event types
        frames, item, _ = render_video(i, seed=4, frames=FRAMES, events=EVENT_TYPES)
        types |= check_events(frames, item, 2)
    assert types == {"appear", "disappear", "turn", "grow", "shrink"}


def test_default_events_are_appearances_and_other_kinds_are_checked():
    assert {e.event for pair in range(20) for e in plan_pair(0, pair, (2,), 96).events} == {"appear"}
    params = generation_params("moving_shapes", 4)
    assert params["events"] == ["appear"]
    assert generation_params("moving_shapes", 4, events=["turn", "grow"])["events"] == ["turn", "grow"]
    for bad in ([], ["appear", "appear"], ["explode"]):
        with pytest.raises(ConfigError, match="events must be distinct names"):
            generation_params("moving_shapes", 4, events=bad)


def test_video_spans_are_the_visible_frames(videos_root):
    """The same on the encoded videos (decoded frames)."""
    assert len(check_spans(videos_root, FRAMES, 2)) >= 3


def test_three_event_videos(tmp_path):
    generate_moving_shapes(tmp_path, num_videos=2, seed=0, frames=FRAMES, num_events=(3,), workers=1, events=EVENT_TYPES)
    check_spans(tmp_path, FRAMES, 3)
    info = json.loads((tmp_path / "annotations" / "videodatainfo.json").read_text())
    lengths = [len(caption_tokens(s["caption"])) for s in info["sentences"]]
    assert max(lengths) <= yaml.safe_load((REPO / "conf" / "data" / "moving_shapes.yaml").read_text())["max_length"]


def test_video_captions_and_msrvtt_format(videos_root):
    info = json.loads((videos_root / "annotations" / "videodatainfo.json").read_text())
    grounding = json.loads((videos_root / "annotations" / "grounding.json").read_text())["items"]
    assert [v["video_id"] for v in info["videos"]] == [f"video{i}" for i in range(N_VIDEOS)]
    assert Counter(v["split"] for v in info["videos"]) == {"train": 6, "validate": 1, "test": 1}
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
            # the order words put them in the right order: "B after A", "after A, B", otherwise A ... B
            if " after " in f" {text} " and not text.startswith("after "):
                assert text.index(second) < text.index(first), cap
            else:
                assert text.index(first) < text.index(second), cap
            assert len(caption_tokens(cap)) <= 12


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
    assert sum(stamp["summary"]["length_histogram"].values()) == 30
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
    with pytest.raises(ConfigError, match="frames must be >= 16"):
        ensure_generated("moving_shapes", tmp_path / "m", frames=8)


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
    assert stamp["params"] == {"dataset": "moving_shapes", "version": GENERATOR_VERSION, "num_items": 4,
                               "seed": 0, "frames": 16, "video_size": 64, "events": ["appear"]}
    assert GENERATOR_VERSION == 2
    assert len(decord.VideoReader(str(root / "videos" / "video3.mp4"))) == 16
    assert decord.VideoReader(str(root / "videos" / "video3.mp4"))[0].shape == (64, 64, 3)
    proc = run_cli("generate", "dataset=circles", f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 2 and "unknown synthetic dataset" in proc.stderr


def test_no_import_cycle():
    """The synthetic modules import each other along common <- generators <- datasets only."""
    package = "captioning.data.synthetic"
    allowed = {"common": set(), "shapes": {"common"}, "moving_shapes": {"common"},
               "datasets": {"common", "shapes", "moving_shapes"}}
    for module, ok in allowed.items():
        tree = ast.parse((REPO / "captioning" / "data" / "synthetic" / f"{module}.py").read_text())
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == package:
                used |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                used.add(node.module.rsplit(".", 1)[1])
            elif isinstance(node, ast.Import):
                used |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith(package + ".")}
        assert used <= ok, (module, used - ok)
    assert "shapes" in allowed["datasets"]  # the table imports both generators


def test_palette_is_separable():
    """Palette colours are far apart, so the colour tests above are meaningful."""
    rgb = np.asarray(list(PALETTE.values()), float)
    d = np.sqrt(((rgb[:, None] - rgb[None]) ** 2).sum(-1)) + np.eye(len(rgb)) * 1e9
    assert d.min() > 2 * COLOUR_TOLERANCE
    greys = np.stack([np.arange(0, 181)] * 3, axis=1)[:, None, :].astype(float)
    assert np.sqrt(((greys - rgb[None]) ** 2).sum(-1)).min() > 1.4 * COLOUR_TOLERANCE  # backgrounds are greys <= ~175
