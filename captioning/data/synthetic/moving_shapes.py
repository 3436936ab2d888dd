"""Synthetic video captioning data where only the ORDER of two brief events tells the captions apart.

    "a red circle appears and then the blue square turns green"
    "first the blue square turns green, then a red circle appears"   (its pair: the reverse order)
    "the white star grows after the yellow cross disappears"

Design choices (documented for the experiments that use this data):

* Brief events, visible in globally pooled per-frame features (no position needed): an object
  *appears* for a moment and is gone again, a present object *disappears* for a moment, *turns*
  another colour for a moment, *grows* or *shrinks* for a moment; each then returns to its
  neutral state.  Objects never move; each sits in its own quadrant.  0-1 distractors never
  change and are not mentioned.
* Exact time-reversal pairs.  Videos 2k and 2k+1 share the background, the objects, the event
  durations and the gaps, with the events in opposite order.  Every frame is a deterministic
  function of the scene state (which event, if any, is visible) and of how many frames of that
  state came before it (its noise is seeded by (seed, pair, state, occurrence), not by time), so
  the two videos of a pair are frame permutations of each other before encoding.  Mean pooling
  over frames therefore sees the same multiset in both orders and is at chance on the order.
* Timing in 16 units of ``u = frames // 16`` frames (the remainder, if any, is added at the
  end): an event lasts 3 or 4 units (2 events) / 3 units (3 events), events are separated by >= 2
  neutral units and the video starts and ends with >= 1 neutral unit.  Every boundary falls on
  a multiple of ``u``, so with ``encoder.frames=16`` uniform sampling (one frame per unit when
  ``frames`` is a multiple of 16) every event is visible in exactly 3 or 4 sampled frames, and
  the two videos of a pair give the same multiset of sampled frames too.
* Default: 32 frames (u = 2) at 12 fps, 96 x 96 px.
* Grounding span of an event = exactly the frames in which it is visible, ``[f0, f1)``.

Captions name the events in time order with several phrasings; "B after A" and "after A, B"
express the order with "after" (the top-level ``reverse_order_words`` of grounding.json).

Layout under ``root`` (see docs/CONTRACTS.md): ``videos/video<N>.mp4`` (H.264, yuv420p,
exactly ``frames`` frames, no B-frames, single-threaded x264: the same bytes in a fresh
process; in a long-lived process a few P-frames have been seen to encode differently, within
a few levels of the same pixels),
``annotations/videodatainfo.json`` (MSR-VTT: train/validate/test) and
``annotations/grounding.json`` (per event: span, words, type, shape, colours, time rank, box;
top-level ``word_classes`` and ``reverse_order_words``).
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
DEFAULT_FRAMES = 32
CAPTIONS_PER_VIDEO = 5
UNITS = 16  # time units per video (one sampled frame each with encoder.frames=16)
EVENT_UNITS = {2: (3, 4), 3: (3,)}  # event durations by number of events
EVENT_TYPES = ("appear", "disappear", "turn", "grow", "shrink")
# The default draws only "appear" events: the one kind whose object a globally pooled frame
# vector identifies (the event frames hold exactly one object more than the neutral frames).
# With all five kinds, 2400 videos and a 256-d temporal model named the events' colour, shape
# and verb right only 61% / 68% / 51% of the time (event recall 0.09), so order could not be
# scored; the harder kinds stay available with events=[appear,disappear,turn,grow,shrink].
DEFAULT_EVENTS = ("appear",)
VERBS = {"appear": "appears", "disappear": "disappears", "turn": "turns", "grow": "grows", "shrink": "shrinks"}
REVERSE_ORDER_WORDS = ("after",)
WORD_CLASSES = {"colour": list(COLOURS), "shape": list(SHAPES), "verb": list(VERBS.values())}
DISTRACTOR_PROB = 0.5
MSRVTT_SPLITS = ("train", "validate", "test")

_TEMPLATES: dict[int, tuple[str, ...]] = {
    2: (
        "{0} and then {1}",
        "first {0}, then {1}",
        "{0} before {1}",
        "{1} after {0}",
        "after {0}, {1}",
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


@dataclass(frozen=True)
class VideoObject:
    """An object and its (optional) brief event: its look in the neutral and in the event state."""

    shape: str
    colour: str
    radius: float
    cx: float
    cy: float
    angle: float
    event: str | None = None  # None: a distractor that never changes
    units: int = 0  # event duration in time units
    new_colour: str | None = None  # "turn": the colour during the event
    event_radius: float | None = None  # "grow" / "shrink": the radius during the event

    def look(self, active: bool) -> tuple[str, float] | None:
        """(colour, radius) in the event state (``active``) or the neutral state; None: invisible."""
        if self.event == "appear":
            return (self.colour, self.radius) if active else None
        if self.event == "disappear" and active:
            return None
        if self.event == "turn" and active:
            return self.new_colour or self.colour, self.radius
        if self.event in ("grow", "shrink") and active:
            return self.colour, self.event_radius or self.radius
        return self.colour, self.radius

    def phrase(self) -> str:
        article = "a" if self.event == "appear" else "the"
        return f"{article} {' '.join(self.words())}"

    def words(self) -> list[str]:
        """The words that name the event (the phrase without its article)."""
        verb = VERBS[self.event or "appear"]
        tail = [verb, self.new_colour] if self.event == "turn" else [verb]
        return [self.colour, self.shape, *tail]


@dataclass(frozen=True)
class PairPlan:
    """What videos 2k and 2k+1 share: event objects (in video 2k's order), distractors, gaps."""

    events: tuple[VideoObject, ...]
    distractors: tuple[VideoObject, ...]
    gaps: tuple[int, ...]  # neutral units before, between and after the events (len = events + 1)


def sample_gaps(rng: np.random.Generator, durations: Sequence[int]) -> tuple[int, ...]:
    """Neutral units around the events: >= 1 at the ends, >= 2 between, summing to UNITS - sum(d)."""
    n = len(durations)
    minimum = [1] + [2] * (n - 1) + [1]
    spare = UNITS - sum(durations) - sum(minimum)
    if spare < 0:
        raise ConfigError(f"{n} events of {list(durations)} units do not fit in {UNITS} units")
    extra = rng.multinomial(spare, [1.0 / (n + 1)] * (n + 1))
    return tuple(int(m + e) for m, e in zip(minimum, extra, strict=True))


# Object radii as fractions of the frame side.  Objects must be large in the frame: the frame
# features are globally pooled CNN vectors, and a shape a few pixels wide leaves too little of its
# colour and shape in them to name it.
SMALL_RADIUS, LARGE_RADIUS = 0.14, 0.2


def plan_pair(seed: int, pair: int, num_events_choices: Sequence[int], size: int,
              events: Sequence[str] = DEFAULT_EVENTS) -> PairPlan:
    """The shared content of videos 2*pair and 2*pair+1 (events in video 2*pair's order)."""
    rng = item_rng(seed, pair, stream=1)
    n = int(rng.choice(list(num_events_choices)))
    durations = [int(rng.choice(EVENT_UNITS[n])) for _ in range(n)]
    gaps = sample_gaps(rng, durations)
    n_distractors = int(rng.random() < DISTRACTOR_PROB)
    shapes = [str(s) for s in rng.permutation(SHAPES)]
    quadrants = rng.permutation(4)
    small, large = SMALL_RADIUS * size, LARGE_RADIUS * size
    half = size / 2
    objs = []
    for k in range(n + n_distractors):
        shape, q = shapes[k], int(quadrants[k])
        pad = large + 0.04 * size
        cx = (q % 2) * half + float(rng.uniform(pad, half - pad))
        cy = (q // 2) * half + float(rng.uniform(pad, half - pad))
        limit = {"circle": 0.0, "square": 0.2, "cross": 0.1, "triangle": 0.15, "star": np.pi / 5}[shape]
        angle = float(rng.uniform(-limit, limit)) if limit else 0.0
        colour = str(rng.choice(COLOURS))
        radius = small if rng.random() < 0.5 else large
        if k >= n:
            objs.append(VideoObject(shape, colour, radius, cx, cy, angle))
            continue
        event = str(rng.choice(list(events)))
        new_colour = str(rng.choice([c for c in COLOURS if c != colour])) if event == "turn" else None
        event_radius = None
        if event in ("grow", "shrink"):
            radius, event_radius = (small, large) if event == "grow" else (large, small)
        objs.append(VideoObject(shape, colour, radius, cx, cy, angle, event, durations[k], new_colour,
                                event_radius))
    return PairPlan(tuple(objs[:n]), tuple(objs[n:]), gaps)


def check_events(events: Sequence[str]) -> tuple[str, ...]:
    """``events`` as a tuple of known, distinct event kinds (ConfigError otherwise)."""
    events = tuple(str(e) for e in events)
    if not events or len(set(events)) != len(events) or not set(events) <= set(EVENT_TYPES):
        raise ConfigError(f"events must be distinct names from {list(EVENT_TYPES)}, got {list(events)}")
    return events


def event_spans(plan: PairPlan, frames: int, reverse: bool = False) -> list[tuple[int, int]]:
    """Frame spans ``[f0, f1)`` of the events in time order (reversed order for video 2k+1)."""
    u = frames // UNITS
    events = plan.events[::-1] if reverse else plan.events
    spans, t = [], plan.gaps[0]
    for e, gap in zip(events, plan.gaps[1:], strict=True):
        spans.append((t * u, (t + e.units) * u))
        t += e.units + gap
    return spans


def render_video(
    index: int, seed: int = 0, frames: int = DEFAULT_FRAMES, size: int = 96, num_events_choices: Sequence[int] = (2,),
    events: Sequence[str] = DEFAULT_EVENTS,
) -> tuple[np.ndarray, dict[str, Any], list[str]]:
    """Render one video: (frames uint8 [F, H, W, 3], grounding entry, 5 captions).

    Frame f shows state s(f) (the index of the visible event, or -1 when none is) with the noise
    of its occurrence j (the j-th frame of state s in this video): pixels = f(pair, s, j).
    """
    if frames < UNITS:
        raise ConfigError(f"moving_shapes needs frames >= {UNITS}, got {frames}")
    pair, reverse = divmod(index, 2)
    plan = plan_pair(seed, pair, num_events_choices, size, events)
    order = list(range(len(plan.events)))[::-1] if reverse else list(range(len(plan.events)))
    events = [plan.events[k] for k in order]
    spans = event_spans(plan, frames, bool(reverse))
    objs = list(plan.events) + list(plan.distractors)
    scene_rng = item_rng(seed, pair, stream=2)
    background = textured_background(scene_rng, size, size)
    jitters = [scene_rng.uniform(-10.0, 10.0, size=3) for _ in objs]

    state = np.full(frames, -1, np.int64)  # index into plan.events, -1: neutral
    for k, (f0, f1) in zip(order, spans, strict=True):
        state[f0:f1] = k
    canvases: dict[int, np.ndarray] = {}
    seen: dict[int, int] = {}
    out = np.empty((frames, size, size, 3), np.uint8)
    for f, s in enumerate(state.tolist()):
        if s not in canvases:
            canvas = background.copy()
            for k, (o, jit) in enumerate(zip(objs, jitters, strict=True)):
                look = o.look(active=k == s)
                if look is not None:
                    colour, r = look
                    canvas[shape_mask(o.shape, o.cx, o.cy, r, o.angle, size, size)] = (
                        np.asarray(PALETTE[colour], np.float32) + jit)
            canvases[s] = canvas
        j = seen.get(s, 0)
        seen[s] = j + 1
        noise_rng = np.random.default_rng([int(seed), pair, 3, s + 1, j])
        out[f] = add_noise(noise_rng, canvases[s], sigma=3.0)

    ground_events = []
    for rank, (e, (f0, f1)) in enumerate(zip(events, spans, strict=True)):
        r = max(e.radius, e.event_radius or 0.0)
        ground_events.append({
            "span": [f0, f1],
            "words": e.words(),
            "type": e.event,
            "shape": e.shape,
            "colour": e.colour,
            "new_colour": e.new_colour,
            "rank": rank,
            "box": mask_box(shape_mask(e.shape, e.cx, e.cy, r, e.angle, size, size)),
        })
    templates = _TEMPLATES[len(events)]
    phrases = [e.phrase() for e in events]
    order = item_rng(seed, index, stream=3).permutation(len(templates))[:CAPTIONS_PER_VIDEO]
    captions = [templates[i].format(*phrases) for i in order]
    entry = {"num_frames": frames, "pair": pair, "reversed": bool(reverse), "events": ground_events,
             "distractors": [{"shape": o.shape, "colour": o.colour} for o in plan.distractors]}
    return out, entry, captions


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
    path, index, seed, frames, size, fps, num_events, events = task
    video, entry, captions = render_video(index, seed, frames, size, num_events, events)
    encode_mp4(path, video, fps=fps)
    return entry, captions


def generate_moving_shapes(
    root: str | Path,
    num_videos: int = DEFAULT_NUM_VIDEOS,
    seed: int = 0,
    frames: int = DEFAULT_FRAMES,
    size: int = 96,
    fps: int = 12,
    splits: Sequence[float] = (0.8, 0.1, 0.1),
    num_events: Sequence[int] = (2,),
    workers: int | None = None,
    events: Sequence[str] = DEFAULT_EVENTS,
) -> dict[str, Any]:
    """Write the moving-shapes dataset under ``root``; returns a summary.

    ``num_events``: the allowed numbers of events per video (a non-empty subset of (2, 3)),
    drawn uniformly per pair of videos.  ``events``: the event kinds drawn from (a non-empty
    subset of ``EVENT_TYPES``; default ``DEFAULT_EVENTS``).  Video ``video<N>`` depends only on (seed, N), whatever
    ``workers`` (processes; None: up to 4 CPUs).
    """
    root = Path(root)
    n_train, n_val, n_test = split_sizes(num_videos, splits)
    if not num_events or any(int(k) not in _TEMPLATES for k in num_events):
        raise ConfigError(f"num_events must be a non-empty subset of {sorted(_TEMPLATES)}, got {num_events}")
    if frames < UNITS:
        raise ConfigError(f"moving_shapes needs frames >= {UNITS} (a multiple of {UNITS} is best), got {frames}")
    events = check_events(events)
    (root / "videos").mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {
        "info": {"description": "synthetic moving shapes (MSR-VTT format)", "version": "2.0", "year": 2024,
                 "contributor": "captioning.data.synthetic", "seed": seed, "fps": fps, "frames": frames},
        "videos": [],
        "sentences": [],
    }
    grounding: dict[str, Any] = {"kind": "video", "dataset": "moving_shapes", "word_classes": WORD_CLASSES,
                                 "reverse_order_words": list(REVERSE_ORDER_WORDS), "items": {}}
    all_captions: list[str] = []
    event_counts: dict[str, int] = {}
    sen_id = 0
    tasks = [(str(root / "videos" / f"video{i}.mp4"), i, seed, frames, size, fps, tuple(num_events), events)
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
