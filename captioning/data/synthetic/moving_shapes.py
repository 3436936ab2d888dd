"""Synthetic video captioning data: shapes that appear, disappear, change colour, grow or shrink,
one event after another, so the caption depends on the ORDER of the events.

    "a red circle appears and then a blue square turns green"
    "first a blue square turns green, then a red circle appears"   (the reverse order)
    "a white star shrinks after a yellow cross disappears"

Design choices (documented for the experiments that use this data):

* Per-frame features are globally pooled CNN vectors (no spatial position), so every event is
  visible in *what* is on screen, not *where*: appear / disappear / turns <colour> /
  grows / shrinks.  Objects do not move ("moves left" would be invisible to pooled features);
  each object stays in its own quadrant of the frame.
* Videos come in pairs (2k, 2k+1) with the same objects and the same events in reversed
  order, so every set of events occurs equally often in both orders.  Event types come in
  inverse pairs with equal probability (appear/disappear, grow/shrink, colour a->b / b->a) and
  event times are symmetric about the middle of the video, so the data distribution is
  invariant under time reversal: mean pooling over frames cannot tell "X appears, then Y
  disappears" from its time reversal "Y appears, then X disappears" at all.
* Event k happens at frame ``t_k`` (first frame of the new state), near (k + 1) F / (n + 1)
  with a random jitter.  Its grounding span is ``[t_k - h, t_k + h)``: the last frames of
  the old state and the first frames of the new state.  Spans of different events never
  overlap.  Other objects (0-1 distractors) never change and are not mentioned.

Layout under ``root`` (see docs/CONTRACTS.md): ``videos/video<N>.mp4`` (H.264, yuv420p,
exactly ``frames`` frames, no B-frames, single-threaded x264: the same bytes in a fresh
process; in a long-lived process a few P-frames have been seen to encode differently, within
a few levels of the same pixels),
``annotations/videodatainfo.json`` (MSR-VTT: train/validate/test) and
``annotations/grounding.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from captioning.data.synthetic.common import (
    COLOURS,
    PALETTE,
    SHAPES,
    add_noise,
    caption_stats,
    item_rng,
    mask_box,
    parallel_map,
    shape_mask,
    split_sizes,
    textured_background,
)
from captioning.errors import ConfigError
from captioning.utils.io import atomic_write_json

DEFAULT_NUM_VIDEOS = 1200
CAPTIONS_PER_VIDEO = 5
EVENT_TYPES = ("appear", "disappear", "change", "grow", "shrink")
INVERSE = {"appear": "disappear", "disappear": "appear", "change": "change", "grow": "shrink", "shrink": "grow"}
DISTRACTOR_PROB = 0.5
MSRVTT_SPLITS = ("train", "validate", "test")

_TEMPLATES: dict[int, tuple[str, ...]] = {
    1: ("{0}", "in this video {0}", "{0} in the video", "we see that {0}", "the video shows that {0}"),
    2: (
        "{0} and then {1}",
        "first {0}, then {1}",
        "{1} after {0}",
        "{0} before {1}",
        "{0}, and afterwards {1}",
    ),
    3: (
        "{0}, then {1} and then {2}",
        "first {0}, then {1}, and finally {2}",
        "{0} and then {1} and then {2}",
        "{0} before {1}, and then {2}",
        "{0}, {1} and finally {2}",
    ),
}


@dataclass
class VideoObject:
    shape: str
    colours: tuple[str, str]  # before / after its event (equal when it does not change colour)
    radii: tuple[float, float]  # before / after
    visible: tuple[bool, bool]  # before / after
    cx: float
    cy: float
    angle: float
    event: str | None = None  # None: a distractor that never changes
    frame: int = 0  # first frame of the "after" state

    def state(self, f: int) -> tuple[str, float, bool]:
        k = 1 if (self.event is not None and f >= self.frame) else 0
        return self.colours[k], self.radii[k], self.visible[k]

    def phrase(self) -> str:
        c0, c1 = self.colours
        verb = {"appear": "appears", "disappear": "disappears", "change": f"turns {c1}",
                "grow": "grows", "shrink": "shrinks"}[self.event or "appear"]
        return f"a {c0} {self.shape} {verb}"

    def words(self) -> list[str]:
        return self.phrase().split()[1:]


def span_half_width(num_events: int, frames: int) -> int:
    """Half-width h of the grounding span [t - h, t + h) around each event's transition frame t."""
    spacing = frames / (num_events + 1)
    return max(1, int((spacing - 2 * int(spacing / 4)) / 2))


def event_times(num_events: int, frames: int, rng: np.random.Generator) -> list[int]:
    """Transition frames t_k: sorted, at least 2h apart, symmetric about frames/2 in distribution."""
    spacing = frames / (num_events + 1)
    jitter = int(spacing / 4)
    return [int(round((k + 1) * spacing)) + int(rng.integers(-jitter, jitter + 1)) for k in range(num_events)]


def size_name(r: float, size: int) -> str:
    return "small" if r < 0.135 * size else "large"


def _object_state(rng: np.random.Generator, event: str, small: float, large: float) -> dict[str, Any]:
    c0 = str(rng.choice(COLOURS))
    c1 = str(rng.choice([c for c in COLOURS if c != c0])) if event == "change" else c0
    r = small if rng.random() < 0.5 else large
    radii = {"grow": (small, large), "shrink": (large, small)}.get(event, (r, r))
    visible = {"appear": (False, True), "disappear": (True, False)}.get(event, (True, True))
    return {"colours": (c0, c1), "radii": radii, "visible": visible}


def plan_pair(seed: int, pair: int, num_events_choices: Sequence[int], size: int) -> list[dict[str, Any]]:
    """The shared content of videos 2*pair and 2*pair+1: event objects (in forward order)."""
    rng = item_rng(seed, pair, stream=1)
    n = int(rng.choice(list(num_events_choices)))
    shapes = [str(s) for s in rng.permutation(SHAPES)]
    small, large = 0.1 * size, 0.17 * size
    plans = []
    for k in range(n):
        event = str(rng.choice(EVENT_TYPES))
        plans.append({"shape": shapes[k], "event": event, **_object_state(rng, event, small, large)})
    return plans


def build_video(
    index: int, seed: int, frames: int, size: int, num_events_choices: Sequence[int] = (2,)
) -> list[VideoObject]:
    """All objects of video ``index`` with their event frames; event objects first, in time order."""
    pair, reverse = divmod(index, 2)
    plans = plan_pair(seed, pair, num_events_choices, size)
    if reverse:
        plans = plans[::-1]
    rng = item_rng(seed, index, stream=2)
    times = event_times(len(plans), frames, rng)
    n_distractors = int(len(plans) < 4 and rng.random() < DISTRACTOR_PROB)
    used = {p["shape"] for p in plans}
    spare = [s for s in SHAPES if s not in used]
    small, large = 0.1 * size, 0.17 * size
    cells = rng.permutation(4)
    cell = size / 2
    objs = []
    for k, spec in enumerate(plans + [{"shape": spare[j], "event": None} for j in range(n_distractors)]):
        cx0, cy0 = (cells[k] % 2) * cell, (cells[k] // 2) * cell
        pad = large + 0.04 * size
        cx = cx0 + float(rng.uniform(pad, cell - pad))
        cy = cy0 + float(rng.uniform(pad, cell - pad))
        angle = float(rng.uniform(-0.3, 0.3)) if spec["shape"] in ("square", "cross") else (
            0.0 if spec["shape"] == "circle" else float(rng.uniform(-np.pi, np.pi)))
        if spec["event"] is None:
            colour = str(rng.choice(COLOURS))
            r = small if rng.random() < 0.5 else large
            objs.append(VideoObject(spec["shape"], (colour, colour), (r, r), (True, True), cx, cy, angle))
        else:
            objs.append(VideoObject(spec["shape"], spec["colours"], spec["radii"], spec["visible"], cx, cy,
                                    angle, event=spec["event"], frame=times[k]))
    return objs


def render_video(
    index: int, seed: int = 0, frames: int = 48, size: int = 96, num_events_choices: Sequence[int] = (2,)
) -> tuple[np.ndarray, list[VideoObject], dict[str, Any], list[str]]:
    """Render one video: (frames uint8 [F, H, W, 3], objects, grounding entry, 5 captions)."""
    objs = build_video(index, seed, frames, size, num_events_choices)
    events = [o for o in objs if o.event is not None]
    rng = item_rng(seed, index, stream=3)
    background = textured_background(rng, size, size)
    jitters = [rng.uniform(-10.0, 10.0, size=3) for _ in objs]
    cache: dict[tuple[int, ...], np.ndarray] = {}
    out = np.empty((frames, size, size, 3), np.uint8)
    for f in range(frames):
        key = tuple(int(e.event is not None and f >= e.frame) for e in objs)
        if key not in cache:
            canvas = background.copy()
            for o, jit in zip(objs, jitters, strict=True):
                colour, r, visible = o.state(f)
                if visible:
                    mask = shape_mask(o.shape, o.cx, o.cy, r, o.angle, size, size)
                    canvas[mask] = np.asarray(PALETTE[colour], np.float32) + jit
            cache[key] = canvas
        out[f] = add_noise(rng, cache[key], sigma=3.0)
    half = span_half_width(len(events), frames)
    ground_events = []
    for o in events:
        r = max(o.radii)
        box = mask_box(shape_mask(o.shape, o.cx, o.cy, r, o.angle, size, size))
        ground_events.append({
            "span": [max(0, o.frame - half), min(frames, o.frame + half)],
            "words": o.words(),
            "frame": o.frame,
            "type": o.event,
            "shape": o.shape,
            "colour": o.colours[0],
            "colour_after": o.colours[1],
            "size": size_name(o.radii[0], size),
            "size_after": size_name(o.radii[1], size),
            "box": box,
        })
    templates = list(_TEMPLATES[len(events)])
    phrases = [o.phrase() for o in events]
    order = rng.permutation(len(templates))[:CAPTIONS_PER_VIDEO]
    captions = [templates[i].format(*phrases) for i in order]
    entry = {"num_frames": frames, "events": ground_events,
             "distractors": [{"shape": o.shape, "colour": o.colours[0]} for o in objs if o.event is None]}
    return out, objs, entry, captions


def encode_mp4(path: str | Path, video: np.ndarray, fps: int = 12, crf: int = 18) -> None:
    """Encode uint8 frames [F, H, W, 3] as H.264 yuv420p mp4 (no B-frames, 1 encoder thread)."""
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = int(video.shape[2]), int(video.shape[1])
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_count = 1
        stream.options = {"crf": str(crf), "preset": "veryfast", "bf": "0", "g": str(fps)}
        for i, arr in enumerate(video):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)


def _write_video(task: tuple) -> tuple[dict[str, Any], list[str]]:
    path, index, seed, frames, size, fps, num_events = task
    video, _, entry, captions = render_video(index, seed, frames, size, num_events)
    encode_mp4(path, video, fps=fps)
    return entry, captions


def generate_moving_shapes(
    root: str | Path,
    num_videos: int = DEFAULT_NUM_VIDEOS,
    seed: int = 0,
    frames: int = 48,
    size: int = 96,
    fps: int = 12,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    num_events: Sequence[int] = (2,),
    workers: int | None = None,
) -> dict[str, Any]:
    """Write the moving-shapes dataset under ``root``; returns a summary.

    ``num_events``: the allowed numbers of events per video (e.g. ``(2, 3)``), drawn uniformly
    per pair of videos.  Video ``video<N>`` depends only on (seed, N), whatever ``workers``
    (processes; None: up to 4 CPUs).
    """
    root = Path(root)
    n_train, n_val, n_test = split_sizes(num_videos, splits)
    if any(int(k) not in _TEMPLATES for k in num_events) or not num_events:
        raise ConfigError(f"num_events must be a non-empty subset of {sorted(_TEMPLATES)}, got {num_events}")
    (root / "videos").mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {
        "info": {"description": "synthetic moving shapes (MSR-VTT format)", "version": "1.0", "year": 2024,
                 "contributor": "captioning.data.synthetic", "seed": seed, "fps": fps, "frames": frames},
        "videos": [],
        "sentences": [],
    }
    grounding: dict[str, Any] = {"kind": "video", "dataset": "moving_shapes", "items": {}}
    all_captions: list[str] = []
    event_counts: dict[str, int] = {}
    sen_id = 0
    tasks = [(str(root / "videos" / f"video{i}.mp4"), i, seed, frames, size, fps, tuple(num_events))
             for i in range(num_videos)]
    for i, (entry, captions) in enumerate(parallel_map(_write_video, tasks, workers)):
        video_id = f"video{i}"
        split = MSRVTT_SPLITS[0] if i < n_train else MSRVTT_SPLITS[1] if i < n_train + n_val else MSRVTT_SPLITS[2]
        info["videos"].append({"category": 0, "url": f"synthetic://moving_shapes/{video_id}", "video_id": video_id,
                               "start time": 0.0, "end time": round(frames / fps, 3), "split": split, "id": i})
        for c in captions:
            info["sentences"].append({"caption": c, "video_id": video_id, "sen_id": sen_id})
            sen_id += 1
        grounding["items"][video_id] = entry
        all_captions.extend(captions)
        for e in entry["events"]:
            event_counts[e["type"]] = event_counts.get(e["type"], 0) + 1
    atomic_write_json(root / "annotations" / "videodatainfo.json", info)
    atomic_write_json(root / "annotations" / "grounding.json", grounding)
    return {
        "dataset": "moving_shapes",
        "root": str(root),
        "num_videos": num_videos,
        "seed": seed,
        "frames": frames,
        "size": size,
        "fps": fps,
        "splits": {"train": n_train, "validate": n_val, "test": n_test},
        "event_types": dict(sorted(event_counts.items())),
        **caption_stats(all_captions),
    }
