"""Bad input corpora through the real CLIs (``captioning-extract``, ``captioning-train``, as subprocesses).

Each bad input is either processed correctly or reported by name, and the job goes on to the end.

Image corpus (COCO format, one dataset, extracted once for the whole module):

    000000.jpg .. 000005.jpg   plain JPEGs                         -> features
    alpha.png                  RGBA, half-transparent              -> features
    gray16.png                 16-bit grayscale PNG                -> features
    cmyk.jpg                   CMYK JPEG                           -> features
    one_pixel.png              1x1 image                           -> features
    huge.jpg                   9000x7000 JPEG                      -> features (decoded reduced: bounded memory)
    truncated.jpg              first half of a JPEG                -> failure "truncated" (never padded: the
                                                                      loader keeps LOAD_TRUNCATED_IMAGES off)
    zero.jpg                   0 bytes                             -> failure "empty (0 bytes)"
    missing.jpg                in the annotations, not on disk     -> failure "not found"

  ``captioning-extract`` exits 1, the three failures (and nothing else) are in the store's failures
  list and named in the output; running it again retries only them (the rest: skipped as done).

Annotation problems in the same corpus (``data.on_error``: skip, the default, or raise):

    captions_train.json  a second ``images`` entry for id 4              -> "duplicate image id"
                         file_name ``../outside.jpg`` (a real JPEG)      -> refused: escapes the data root
                         file_name ``<absolute path of a real JPEG>``    -> refused: absolute path
                         file_name ``/etc/passwd``                       -> refused: absolute path
                         a caption with latin-1 bytes                    -> "not valid UTF-8"
                         a caption of blanks                             -> "caption is empty"
    captions_val.json    image id 1 again (it is in train)               -> "duplicate id"
                         "a zebra juggling xylophones"                   -> unknown words (not in the vocabulary)

  skip: ``captioning-extract`` names every problem and never reads a refused path;
  ``captioning-train`` (1 epoch, tiny decoder) trains to the end on the items that have features,
  counting the skipped records and the items without features.
  raise: ``captioning-train`` exits 2 at start with one line naming the file and the record.

Video corpora (tiny: 64 px frames, ``encoder.frames=4``, ``encoder.short_video=pad``):

    MSR-VTT (paths are always ``<video_id>.mp4``):
        good, vfr (variable frame rate), 12 frames   -> features, valid 4, frames (1, 4, 7, 10)
        short (2 frames < K)                         -> features, valid 2, frames (0, 1, 1, 1)
        text (a text file), zero (0 bytes)           -> failure
        audio (an audio-only mp4)                    -> failure "no video stream"
        nostream (mp4 given a video stream, no frame: -> failure "no video stream"
                  the muxer writes no stream at all)
    MSVD (the path's extension is looked up in media_dir): one clip per container
        .webm (VP9), .webm (VP8), .mkv (H.264), .avi (MPEG-4 part 2) -> features, valid 4

  ``captioning-extract`` exits 1 (0 for the container corpus), failures named in the list and the output.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_cli
from PIL import Image
from test_extract import (
    cli_env,
    image_cli_args,
    make_images,
    make_videos,
    run_extract_cli,
    video_cli_args,
)
from test_train_cli import train_args
from test_video import _audio_only, _no_frames, has_encoder
from test_video import write_video as write_clip

from captioning.store.feature_store import FeatureStore

pytestmark = pytest.mark.slow

N_GOOD = 6
READABLE = ["alpha.png", "gray16.png", "cmyk.jpg", "one_pixel.png", "huge.jpg"]
UNREADABLE = {"truncated.jpg": "truncated", "zero.jpg": "empty (0 bytes)", "missing.jpg": "not found"}
NON_UTF8 = "@@latin-1 bytes@@"  # replaced by invalid UTF-8 bytes once the json is written
TINY_TRAIN = ["model.embed_dim=16", "model.hidden_dim=32", "model.attention_dim=16", "trainer.max_epochs=1",
              "data.batch_size=4"]
THREADS = {"OMP_NUM_THREADS": "1"}  # 2 cores: no thread oversubscription
CONTAINERS = [("vp9_0_1", "webm", "libvpx-vp9"), ("vp8_0_1", "webm", "libvpx"), ("h264_0_1", "mkv", "libx264"),
              ("mpeg4_0_1", "avi", "mpeg4")]  # MSVD clip id, container, codec


# ------------------------------------------------------------------------------------ helpers


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def awkward_images() -> dict[str, bytes | None]:
    """file name -> content (None: referenced by the annotations but not on disk)."""
    rng = np.random.default_rng(1)
    alpha = Image.new("RGBA", (40, 30), (0, 0, 0, 0))
    alpha.paste((255, 0, 0, 128), (10, 5, 30, 25))
    sixteen = Image.fromarray(np.linspace(0, 65535, 48 * 64).reshape(48, 64).astype(np.uint16))
    noise = encode(Image.fromarray(rng.integers(0, 255, (128, 128, 3), dtype=np.uint8)), "JPEG", quality=90)
    return {
        "alpha.png": encode(alpha, "PNG"),
        "gray16.png": encode(sixteen, "PNG"),
        "cmyk.jpg": encode(Image.new("CMYK", (48, 64), (0, 255, 255, 0)), "JPEG", quality=90),
        "one_pixel.png": encode(Image.new("RGB", (1, 1), (9, 99, 199)), "PNG"),
        "huge.jpg": encode(Image.new("RGB", (9000, 7000), (200, 30, 30)), "JPEG", quality=50),
        "truncated.jpg": noise[: len(noise) // 2],
        "zero.jpg": b"",
        "missing.jpg": None,
    }


def add_annotation_problems(root: Path) -> dict[str, Path]:
    """Append the bad records of the module docstring to the corpus's annotation files."""
    ann = root / "annotations"
    good = (root / "images" / "000000.jpg").read_bytes()
    outside = root / "outside.jpg"  # readable, but outside media_dir (root/images)
    outside.write_bytes(good)
    elsewhere = root.parent / f"{root.name}-elsewhere.jpg"
    elsewhere.write_bytes(good)

    train = json.loads((ann / "captions_train.json").read_text())
    train["images"] += [{"id": 4, "file_name": "000001.jpg"}, {"id": 90, "file_name": "../outside.jpg"},
                        {"id": 91, "file_name": str(elsewhere)}, {"id": 92, "file_name": "/etc/passwd"}]
    train["annotations"] += [{"id": 100 + i, "image_id": i, "caption": "a picture out of bounds"}
                             for i in (90, 91, 92)]
    train["annotations"] += [{"id": 200, "image_id": 1, "caption": NON_UTF8},
                             {"id": 201, "image_id": 4, "caption": "   "}]
    raw = json.dumps(train).encode().replace(NON_UTF8.encode(), b"caf\xe9 cr\xe8me")  # latin-1 bytes
    (ann / "captions_train.json").write_bytes(raw)

    val = json.loads((ann / "captions_val.json").read_text())
    val["images"].append({"id": 1, "file_name": "000000.jpg"})
    val["annotations"] += [{"id": 300, "image_id": 1, "caption": "a picture in two splits"},
                           {"id": 301, "image_id": 2, "caption": "a zebra juggling xylophones"}]
    (ann / "captions_val.json").write_text(json.dumps(val))
    return {"outside": outside, "elsewhere": elsewhere}


def extract_with_peak_rss(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    """``captioning-extract args`` run by a wrapper process that reports the CLI's peak RSS (MiB)."""
    wrapper = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
               "print('peak-rss-kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "captioning.cli.extract", *args],
                          cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=300)
    peak = re.findall(r"peak-rss-kib (\d+)", proc.stderr)
    assert peak, proc.stderr[-3000:]
    return proc, int(peak[-1]) // 1024


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def failures_by_id(store: FeatureStore) -> dict[str, dict]:
    return {f["id"]: f for f in store.failures}


def assert_failures_reported(proc: subprocess.CompletedProcess, store: FeatureStore,
                             expected: dict[str, tuple[str, str]]) -> None:
    """Exactly ``expected`` (id -> (file name, error text)) failed: in the failures list and in the output."""
    failed = failures_by_id(store)
    assert sorted(failed) == sorted(expected), failed
    for item_id, (name, error) in expected.items():
        rec = failed[item_id]
        assert Path(rec["path"]).name == name and error in rec["error"], rec
        assert re.search(rf"failed: {item_id}: [^\n]*{re.escape(name)}: ", output(proc)), f"{name} not named"
    assert f"{len(expected)} failed" in output(proc)
    assert "Traceback" not in output(proc)


# ------------------------------------------------------------------------------- image corpus


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The image corpus, extracted once: root, features dir, name -> id, the extract run, its peak RSS."""
    root = tmp_path_factory.mktemp("corpus") / "images"
    extra = awkward_images()
    ids = make_images(root, N_GOOD, extra=extra)
    names = [f"{i:06d}.jpg" for i in range(N_GOOD)] + list(extra)
    escapes = add_annotation_problems(root)
    features = root / "features"
    proc, peak_mb = extract_with_peak_rss(*image_cli_args(root, features))
    return {"root": root, "features": features, "id": dict(zip(names, ids, strict=True)), "proc": proc,
            "peak_mb": peak_mb, **escapes}


def test_image_corpus_extract_reports_bad_files_and_keeps_the_rest(images: dict) -> None:
    files = images["root"] / "images"
    assert Image.open(files / "gray16.png").mode in ("I;16", "I") and Image.open(files / "cmyk.jpg").mode == "CMYK"
    proc, ident = images["proc"], images["id"]
    assert proc.returncode == 1, output(proc)[-4000:]
    store = FeatureStore.open(images["features"])
    readable = [f"{i:06d}.jpg" for i in range(N_GOOD)] + READABLE
    assert sorted(store.ids) == sorted(ident[n] for n in readable)
    for name in readable:
        feats = np.asarray(store[ident[name]].features, dtype=np.float32)
        assert feats.shape == (4, 1280) and np.isfinite(feats).all(), name  # 64 px -> 2x2 grid
    assert_failures_reported(proc, store, {ident[n]: (n, err) for n, err in UNREADABLE.items()})
    assert f"{len(readable)} processed" in output(proc)

    # The same command again: the good items are done, only the bad ones are retried (and fail again).
    again, peak_again_mb = extract_with_peak_rss(*image_cli_args(images["root"], images["features"]))
    assert again.returncode == 1, output(again)[-4000:]
    assert f"0 processed, {len(readable)} skipped as done, {len(UNREADABLE)} failed" in output(again)
    assert sorted(FeatureStore.open(images["features"]).ids) == sorted(store.ids)
    # huge.jpg (9000x7000 = 189 MB as RGB) is decoded at 1/2 scale: the first run, which decoded it,
    # peaks well below "the rerun + a full decode" (a same-size PNG, not reducible, costs ~+280 MB).
    assert images["peak_mb"] - peak_again_mb < 150, (images["peak_mb"], peak_again_mb)


def test_paths_escaping_the_data_root_are_refused_by_name_and_never_read(images: dict) -> None:
    proc = images["proc"]
    text = output(proc)
    for record, path, why in [("image id 90", "../outside.jpg", "escapes the data root"),
                              ("image id 91", str(images["elsewhere"]), "absolute path"),
                              ("image id 92", "/etc/passwd", "absolute path")]:
        line = next((ln for ln in text.splitlines() if "skipped annotation" in ln and record in ln), None)
        assert line is not None, f"{record} not reported"
        assert "captions_train.json" in line and repr(path) in line and why in line and "refused" in line, line
    store = FeatureStore.open(images["features"])
    # Both JPEGs are readable: had they been opened, they would have features or a failure record.
    assert not {"90", "91", "92"} & (set(store.ids) | set(failures_by_id(store)))
    assert all(str(images[k]) not in json.dumps(store.failures) for k in ("outside", "elsewhere"))


# --------------------------------------------------------------------------- annotation problems


def test_train_skips_bad_annotations_and_items_without_features(images: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    data = {"root": images["root"], "features_dir": images["features"]}
    proc = run_cli("train", *train_args(data, run_dir, *TINY_TRAIN), env=THREADS, check=False, timeout=300)
    text = output(proc)
    assert proc.returncode == 0 and "Traceback" not in text, text[-6000:]
    for problem in ["image id 4: duplicate image id", "image id 90: path '../outside.jpg' escapes the data root",
                    "image id 92: absolute path '/etc/passwd' refused",
                    "annotations[8] (image id 1): caption is not valid UTF-8 text (b'caf\\xe9 cr\\xe8me')",
                    "annotations[9] (image id 4): caption is empty",
                    "captions_val.json: id 1: duplicate id (already read from"]:
        assert problem in text, problem
    assert "tiny: 7 annotation problems skipped" in text
    # zero.jpg (train), missing.jpg (val) and truncated.jpg (test) have captions but no features.
    assert text.count("1 of 4 items have no features") == 1 and text.count("1 of 5 items have no features") == 2
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["epochs"] == 1 and summary["global_step"] > 0 and summary["best_val_CIDEr"] is not None
    # train items with features: 000000.jpg, 000003.jpg, alpha.png, one_pixel.png; one caption each
    # (the non-UTF-8 and the empty caption were dropped).
    assert summary["train_samples"] == 4
    vocab = json.loads((run_dir / "vocab.json").read_text())["itos"]
    assert "picture" in vocab and not {"zebra", "juggling", "xylophones"} & set(vocab)  # val-only words: <unk>


def test_train_on_error_raise_stops_at_start_naming_file_and_record(images: dict, tmp_path: Path) -> None:
    data = {"root": images["root"], "features_dir": images["features"]}
    proc = run_cli("train", *train_args(data, tmp_path / "run", *TINY_TRAIN, "data.on_error=raise"), env=THREADS,
                   check=False, timeout=300)
    assert proc.returncode == 2, output(proc)[-6000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    train_file = images["root"] / "annotations" / "captions_train.json"
    assert errors[0].startswith(f"error: {train_file}: image id 4: duplicate image id"), errors[0]
    assert "data.on_error=skip" in errors[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------------------------------------------ videos


def clip_bytes(tmp: Path, name: str, **kw) -> bytes:
    return write_clip(tmp / name, **kw).read_bytes()


def assert_video_features(store: FeatureStore, expected: dict[str, tuple[int, tuple[int, ...]]]) -> None:
    """id -> (valid frames, sampled frame indices); padded frames have zero features."""
    assert sorted(store.ids) == sorted(expected)
    for vid, (valid, frames) in expected.items():
        item = store[vid]
        feats = np.asarray(item.features, dtype=np.float32)
        assert feats.shape == (4, 1280) and np.isfinite(feats).all(), vid
        assert (item.valid, item.frame_indices) == (valid, frames), vid
        assert not feats[valid:].any() and all(feats[:valid].any(axis=1)), vid


def test_msrvtt_video_corpus(tmp_path: Path) -> None:
    if not has_encoder("aac"):
        pytest.skip("PyAV has no aac encoder here (audio-only file)")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    extra = {
        "good": clip_bytes(scratch, "good.mp4", n=12),
        "vfr": clip_bytes(scratch, "vfr.mp4", n=12, vfr_ms=[40, 100, 20, 200]),
        "short": clip_bytes(scratch, "short.mp4", n=2),
        "text": b"this is not a video\n" * 20,
        "zero": b"",
        "audio": _audio_only(scratch / "audio.mp4").read_bytes(),
        "nostream": _no_frames(scratch / "nostream.mp4").read_bytes(),
    }
    root = tmp_path / "msrvtt"
    make_videos(root, 0, extra=extra)
    features = tmp_path / "features"
    proc = run_extract_cli(*video_cli_args(root, features, "encoder.short_video=pad"), check=False)
    assert proc.returncode == 1, output(proc)[-4000:]
    store = FeatureStore.open(features)
    # 12 frames, K=4: centres of 4 segments of 3 frames; 2 frames: both, then padding (zero features)
    assert_video_features(store, {"good": (4, (1, 4, 7, 10)), "vfr": (4, (1, 4, 7, 10)),
                                  "short": (2, (0, 1, 1, 1))})
    assert_failures_reported(proc, store, {"text": ("text.mp4", "not a readable video file"),
                                           "zero": ("zero.mp4", "empty (0 bytes)"),
                                           "audio": ("audio.mp4", "no video stream"),
                                           "nostream": ("nostream.mp4", "no video stream (streams: none)")})


def test_msvd_containers(tmp_path: Path) -> None:
    containers = [(clip, ext, codec) for clip, ext, codec in CONTAINERS if has_encoder(codec)]
    if not containers:
        pytest.skip("PyAV has none of the video encoders")
    root = tmp_path / "msvd"
    (root / "videos").mkdir(parents=True)
    lines = []
    for clip, ext, codec in containers:
        write_clip(root / "videos" / f"{clip}.{ext}", codec=codec, n=12)
        lines.append(f"{clip} a clip in a {ext} container")
    (root / "AllVideoDescriptions.txt").write_text("\n".join(lines) + "\n")
    args = ["data=msvd" if a == "data=moving_shapes" else a for a in video_cli_args(root, tmp_path / "features")]
    proc = run_extract_cli(*args)
    store = FeatureStore.open(tmp_path / "features")
    assert_video_features(store, {clip: (4, (1, 4, 7, 10)) for clip, _, _ in containers})
    assert not store.failures and f"{len(containers)} processed" in output(proc)
