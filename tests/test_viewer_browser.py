"""The attention viewer in a real browser: headless Chromium (Debian's package, installed by .ci/run)
driven by Playwright with the system browser (``executable_path``; Playwright's own browser download
is never used).  Skipped, with one line, where Chromium is not installed (in CI, ``CI=true``, that is an
error: .ci/run installs it).

* a tiny model trained through the CLIs on images with one coloured shape in one cell of a 3x3
  grid (its features carry the object's colour and shape in that cell): its evaluation viewer,
  hovering the word that names the object, shows the most attended cell that ``attention.npy``
  says (the page's report and the overlay canvas's pixels), and the object's outline; the compare
  view shows another checkpoint's caption and its own attention; a screenshot is taken;
* a video: ``captioning-caption ... viewer=true`` on moving shapes, the word's most attended frame
  shown large and its bar the tallest; scrubbing the filmstrip moves the large frame;
* image regions: the most attended box is the one marked;
* a 5,000-item evaluation's viewer is ready in under 3 s (its items are paged).

``python tests/test_viewer_browser.py <viewer/index.html> <out.jpg|png> [item id]`` takes the screenshot
of any viewer the way the tests take theirs (docs/img/viewer.jpg is that of ``make demo``'s test split).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import run_cli  # noqa: E402
from screenshots import save_screenshot  # noqa: E402

from captioning.viz.viewer import Layout, RunInfo, ViewerConfig, ViewerItem, ViewerRun, ViewerWriter  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
COLOURS, SHAPES = ["red", "green", "blue"], ["square", "circle", "triangle"]
RGB = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (40, 70, 230)}
GRID, CELL = 3, 32  # a 3x3 grid of 32-px cells: 96x96 images


def open_browser(user_data_dir: str | Path):
    """(playwright, a persistent Chromium context on an empty profile); the caller closes both."""
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    ctx = pw.chromium.launch_persistent_context(str(user_data_dir), executable_path=CHROMIUM, headless=True,
                                                args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 800})
    return pw, ctx


def open_viewer(ctx, index_html: Path, key: str | None = None):
    """A page showing ``index_html`` (the item ``key``), ready; its console errors in ``page.errors``."""
    page = ctx.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.requests = []  # the scheme of every resource the page asks for (file only: no network)
    page.on("request", lambda r: page.requests.append(r.url.split(":", 1)[0]))
    page.goto(index_html.resolve().as_uri() + (f"#{quote(key, safe='')}" if key is not None else ""))
    page.wait_for_selector("body[data-ready]", timeout=15000)
    return page


def screenshot(ctx, index_html: Path, out_png: Path, key: str | None = None) -> dict:
    """Open the viewer, hover the first word whose object the data name (else the second word) and
    save a screenshot with the page's text inside it (tests/screenshots.py: refused when the page
    prints an absolute path); returns what the page reported for that word and its runs' files."""
    page = open_viewer(ctx, index_html, key)
    grounded = page.evaluate("Viewer.state.item.r[0].g")
    t = grounded[0]["t"] if grounded else min(1, len(page.evaluate("Viewer.state.item.r[0].tok")) - 1)
    page.hover(f"#panel-0 .w[data-t='{t}']")
    save_screenshot(page.screenshot(), out_png, page.inner_text("body"))
    shown = {"t": t, "word": page.get_attribute("#panel-0", "data-word"), "argmax": page.get_attribute("#panel-0", "data-argmax"),
             "info": page.inner_text("#info-0"), "sources": page.eval_on_selector_all(".panel .src", "ps => ps.map(p => p.textContent)")}
    page.close()
    return shown


if CHROMIUM is None and not os.environ.get("CI"):  # CI (.ci/run installs it): every test fails instead
    pytest.skip("Chromium not found (apt-get install chromium): the viewer's browser tests are skipped",
                allow_module_level=True)
pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install -e '.[dev]')")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.fail("Chromium not found in CI: .ci/run installs it (apt-get install chromium)", pytrace=False)
    pw, ctx = open_browser(tmp_path_factory.mktemp("chromium-profile"))
    yield ctx
    ctx.close()
    pw.stop()


# ------------------------------------------------------------------------------ a tiny trained model


def make_pointing_dataset(root: Path, n: int = 240, seed: int = 0) -> Path:
    """Images with two coloured shapes in two cells of a 3x3 grid, captions "a <colour> <shape> and a
    <colour> <shape>" in raster order, the objects' boxes in grounding.json, and a FeatureStore whose
    cell features are noise except the objects' cells, which carry a colour and a shape code.
    Returns the store folder."""
    from captioning.store.writer import FeatureStoreWriter

    rng = np.random.default_rng(seed)
    side = GRID * CELL
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    splits: dict[str, tuple[list, list]] = {s: ([], []) for s in ("train", "val", "test")}
    grounding = {"kind": "image", "word_classes": {"colour": COLOURS, "shape": SHAPES}, "items": {}}
    meta = {"settings": {"backbone": "synthetic", "weights": "none", "preprocessing": {
        "size": side, "resize": side, "crop": "center", "mean": [0.5] * 3, "std": [0.5] * 3}},
        "kind": "image", "positions": GRID * GRID, "dim": 16, "grid": [GRID, GRID], "dtype": "float16"}
    writer = FeatureStoreWriter(root / "features", meta, shard_size=64)
    for i in range(1, n + 1):
        cells = sorted(int(p) for p in rng.choice(GRID * GRID, size=2, replace=False))
        img = Image.new("RGB", (side, side), (128, 128, 128))
        feats = rng.normal(0, 0.05, size=(GRID * GRID, 16)).astype(np.float32)
        objects, words = [], []
        for p in cells:
            c, s = int(rng.integers(3)), int(rng.integers(3))
            box = [(p % GRID) * CELL + 3, (p // GRID) * CELL + 3, (p % GRID + 1) * CELL - 3, (p // GRID + 1) * CELL - 3]
            _draw(ImageDraw.Draw(img), SHAPES[s], box, RGB[COLOURS[c]])
            feats[p, c] += 1.0
            feats[p, 3 + s] += 1.0
            objects.append({"box": box, "words": [COLOURS[c], SHAPES[s]], "colour": COLOURS[c], "shape": SHAPES[s],
                            "rank": len(objects)})
            words.append(f"a {COLOURS[c]} {SHAPES[s]}")
        img.save(root / "images" / f"{i:06d}.png")
        writer.add(str(i), feats)
        split = "train" if i <= n * 2 // 3 else "val" if i <= n * 5 // 6 else "test"
        text = " and ".join(words)
        splits[split][0].append({"id": i, "file_name": f"{i:06d}.png", "width": side, "height": side})
        splits[split][1].extend({"id": 10 * i + k, "image_id": i, "caption": cap}
                                for k, cap in enumerate([text, f"{text} .", f"there is {text}"]))
        grounding["items"][str(i)] = {"size": [side, side], "objects": objects}
    writer.close()
    for split, (images, anns) in splits.items():
        (root / "annotations" / f"captions_{split}.json").write_text(json.dumps({"images": images, "annotations": anns}))
    (root / "annotations" / "grounding.json").write_text(json.dumps(grounding))
    return root / "features"


def _draw(draw: ImageDraw.ImageDraw, shape: str, box: list[int], rgb: tuple[int, int, int]) -> None:
    if shape == "square":
        draw.rectangle(box, fill=rgb)
    elif shape == "circle":
        draw.ellipse(box, fill=rgb)
    else:
        draw.polygon([((box[0] + box[2]) / 2, box[1]), (box[2], box[3]), (box[0], box[3])], fill=rgb)


TRAIN = ["model=soft_attention", "model.position_code=learned", "model.embed_dim=32", "model.hidden_dim=64",
         "model.attention_dim=32", "model.doubly_stochastic=0.0", "optim.lr=0.01", "optim.warmup_steps=0",
         "logger=none", "callbacks.progress=null", "callbacks.early_stopping=null", "callbacks.attention_images=null",
         "trainer=cpu", "trainer.enable_progress_bar=false", "trainer.max_epochs=8", "data.num_workers=0",
         "data.batch_size=16"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory) -> dict:
    """Two checkpoints trained on the pointing data (seeds 0 and 1, one Hydra sweep); seed 1's test
    split evaluated in process, seed 0's by ``captioning-evaluate ... viewer=true viewer.compare=``."""
    from captioning.evaluation.job import EvaluateConfig, evaluate
    from captioning.models.search import DecodeConfig

    tmp = tmp_path_factory.mktemp("viewer_images")
    root = tmp / "pointing"
    store = make_pointing_dataset(root)
    data = ["data=shapes", "data.name=pointing", f"data.root={root}", "data.synthetic=null", f"features_dir={store}"]
    run_cli("train", "-m", *data, *TRAIN, "seed=0,1", f"hydra.sweep.dir={tmp}/sweep", "hydra.sweep.subdir=s${seed}")
    ckpt = {s: json.loads((tmp / "sweep" / f"s{s}" / "train_summary.json").read_text())["last_checkpoint"] for s in (0, 1)}
    other = tmp / "eval_seed1"
    evaluate(EvaluateConfig(ckpt_path=ckpt[1], split="test", output_dir=str(other), num_workers=0,
                            metrics=["bleu", "cider"], decode=DecodeConfig(beam_size=2)))
    out = tmp / "eval_seed0"
    proc = run_cli("evaluate", f"ckpt_path={ckpt[0]}", "split=test", "decode.beam_size=3", "decode.n_best=2",
                   "viewer=true", f"viewer.compare={other / 'predictions.json'}", "viewer.page_size=5", "num_workers=0",
                   "metrics=[bleu,cider]", f"output_dir={out}", f"hydra.run.dir={tmp}/hydra", "trainer.enable_progress_bar=false")
    return {"out": out, "other": other, "stdout": proc.stdout, "report": json.loads((out / "report.json").read_text()),
            "grounding": root / "annotations" / "grounding.json"}


def _cell_centre_alphas(page, selector: str) -> np.ndarray:
    """[3, 3] alpha of the overlay canvas's pixel at each cell centre (the heat there)."""
    return np.array(page.evaluate("""(sel) => {
        const c = document.querySelector(sel), ctx = c.getContext("2d"), g = 3, cell = c.width / g, out = [];
        for (let r = 0; r < g; r++) for (let k = 0; k < g; k++)
            out.push(ctx.getImageData(Math.floor((k + 0.5) * cell), Math.floor((r + 0.5) * cell), 1, 1).data[3]);
        return out; }""", selector)).reshape(GRID, GRID)


def _heat_alpha(row: np.ndarray) -> np.ndarray:
    """The overlay's alpha at the cell centres for weights ``row`` [9] (viewer.js ``paint``, heat style):
    255 (0.2 + 0.8 w / max w); bilinear upsampling leaves a cell's own weight at its centre."""
    return np.round(255 * (0.2 + 0.8 * row / row.max())).reshape(GRID, GRID)


def check_word(page, panel: int, t: int, row: np.ndarray) -> None:
    """Hover word t of a panel: the page reports the most attended cell of ``row`` and the canvas
    holds ``row``'s map (every cell centre)."""
    page.hover(f"#panel-{panel} .w[data-t='{t}']")
    want = divmod(int(np.argmax(row)), GRID)
    assert page.get_attribute(f"#panel-{panel}", "data-argmax") == f"{want[0]},{want[1]}"
    alphas = _cell_centre_alphas(page, f"#panel-{panel} canvas.overlay")
    np.testing.assert_allclose(alphas, _heat_alpha(row), atol=1, err_msg=f"word {t}: {row.round(3)}")


def test_hovering_a_word_shows_the_cell_the_attention_file_says(browser, evaluated):
    from captioning.predictions import read_predictions

    out = evaluated["out"]
    assert f"attention viewer: {out / 'viewer' / 'index.html'}" in evaluated["stdout"]
    objects = json.loads(evaluated["grounding"].read_text())["items"]
    elsewhere = named = 0
    for e in read_predictions(out / "predictions.json")[:4]:
        page = open_viewer(browser, out / "viewer" / "index.html", str(e["image_id"]))
        words = {w for o in objects[str(e["image_id"])]["objects"] for w in o["words"]}
        for t, word in enumerate(e["tokens"]):
            check_word(page, 0, t, e["attention"][t])
            cell = divmod(int(np.argmax(e["attention"][t])), GRID)
            assert f"row {cell[0] + 1}, column {cell[1] + 1} of 3x3" in page.inner_text("#info-0")
            named += word in words
            elsewhere += t > 0 and np.argmax(e["attention"][t]) != np.argmax(e["attention"][t - 1])
        assert page.errors == [] and set(page.requests) == {"file"}
        page.close()
    assert named  # words that name the objects were among those hovered
    assert elsewhere  # and some word looks elsewhere than the word before it: a map drawn for the wrong word shows


def test_the_named_object_is_outlined_and_its_pointing_matches_the_report(browser, evaluated, tmp_path):
    out, report = evaluated["out"], evaluated["report"]["grounding"]
    page = open_viewer(browser, out / "viewer" / "index.html")
    items = page.evaluate("Viewer.state.index.items")
    hits = sum(e["g"][0][0] for e in items if e["g"][0])
    evaluated_words = sum(sum(e["g"][0]) for e in items if e["g"][0])
    assert evaluated_words == report["words_evaluated"] and hits / evaluated_words == pytest.approx(report["pointing_accuracy"])
    page.close()
    page = open_viewer(browser, out / "viewer" / "index.html", next(e["k"] for e in items if e["g"][0]))
    g = page.evaluate("Viewer.state.item.r[0].g")[0]
    page.hover(f"#panel-0 .w[data-t='{g['t']}']")
    box = page.locator("#panel-0 .object")
    assert box.is_visible() and ("hit" if g["hit"] else "miss") in box.get_attribute("class")
    stage, drawn = page.locator("#panel-0 .stage").bounding_box(), box.bounding_box()
    assert drawn["x"] - stage["x"] == pytest.approx(g["box"][0] * stage["width"], abs=2)
    assert drawn["width"] == pytest.approx((g["box"][2] - g["box"][0]) * stage["width"], abs=3)
    key = page.evaluate("Viewer.state.item.k")
    page.close()
    shown = screenshot(browser, out / "viewer" / "index.html", tmp_path / "viewer.png", key)  # docs/img/viewer.jpg's way
    assert shown["t"] == g["t"] and f'"{shown["word"]}"' in shown["info"]
    assert (tmp_path / "viewer.png").stat().st_size > 10_000
    assert shown["sources"][0] == "../predictions.json"  # the run's file, relative to the viewer's folder
    assert not any(str(tmp_path) in s for s in shown["sources"])


def test_compare_view_shows_the_other_checkpoint(browser, evaluated, tmp_path):
    from captioning.predictions import read_predictions

    out = evaluated["out"]
    theirs = {str(e["image_id"]): e for e in read_predictions(evaluated["other"] / "predictions.json")}
    page = open_viewer(browser, out / "viewer" / "index.html")
    assert page.locator("#panel-1").is_visible()  # a viewer with viewer.compare opens side by side
    page.click("#compare")
    assert page.locator("#panel-1").count() == 0
    page.keyboard.press("c")
    assert page.locator("#panel-1").is_visible()
    key = page.evaluate("Viewer.state.item.k")
    assert page.eval_on_selector_all("#panel-1 .w", "ws => ws.map(w => w.firstChild.textContent)") == theirs[key]["tokens"]
    for t, word in enumerate(theirs[key]["tokens"]):  # the other checkpoint's own maps
        check_word(page, 1, t, theirs[key]["attention"][t])
        assert page.get_attribute("#panel-1", "data-word") == word
    page.keyboard.press("j")  # the next item, both runs
    page.wait_for_function(f"Viewer.state.item.k !== {json.dumps(key)}")
    assert page.locator("#panel-1").is_visible()
    page.screenshot(path=str(tmp_path / "compare.png"))
    assert page.errors == []


def test_search_filter_sort_and_keys(browser, evaluated):
    page = open_viewer(browser, evaluated["out"] / "viewer" / "index.html")
    items = page.evaluate("Viewer.state.index.items")
    word = items[0]["c"][0].split()[-1]
    page.fill("#search", word)
    rows = page.locator("#list .row")
    assert rows.count() == sum(any(c and word in c for c in e["c"]) or word in e["k"] for e in items)
    page.fill("#search", "")
    page.select_option("#sort", "CIDEr:-1")
    cider = [e["m"][0]["CIDEr"] for e in items]
    first = page.locator("#list .row .metric").first.inner_text()
    assert float(first) == pytest.approx(max(cider), abs=0.01)
    page.select_option("#pointing", "miss")
    assert rows.count() == sum(1 for e in items if e["g"][0] and e["g"][0][1] > 0)


# ------------------------------------------------------------------------------ video, regions, scale


@pytest.fixture(scope="module")
def video_viewer(tmp_path_factory) -> Path:
    """``captioning-caption``'s viewer of three moving-shapes videos (6 frames each; a tiny untrained decoder
    whose attention at decoding step s is made to peak at frame s mod 6, so that each word has a map of its own)."""
    from test_caption_cli import _extract, _vocab, save_checkpoint

    from captioning.caption.job import CaptionConfig, caption
    from captioning.data.synthetic import generate_moving_shapes
    from captioning.features.backbones import EncoderConfig
    from captioning.models.attention import AdditiveAttention
    from captioning.models.search import DecodeConfig

    tmp = tmp_path_factory.mktemp("viewer_videos")
    root = tmp / "moving_shapes"
    generate_moving_shapes(root, num_videos=3, seed=0, frames=16, size=64, workers=1)
    videos = sorted((root / "videos").glob("*.mp4"))
    meta = _extract([(v.stem, str(v)) for v in videos], "video", EncoderConfig(weights="none", frames=6, frame_size=64),
                    root / "features")
    info = json.loads((root / "annotations" / "videodatainfo.json").read_text())
    ckpt = save_checkpoint(tmp / "video.ckpt", meta, _vocab([s["caption"] for s in info["sentences"]]), {},
                           root / "features")
    steps = itertools.count()

    def scores(self, h, keys, w=None):  # decoding step s attends mostly to frame s mod 6: each word its own frame
        e = torch.zeros(h.shape[0], keys.shape[1], dtype=h.dtype)
        e[:, next(steps) % keys.shape[1]] = 3.0
        return e

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AdditiveAttention, "scores", scores)  # the step's scorer from h_{t-1} or from its query part
        mp.setattr(AdditiveAttention, "scores_from_query", scores)
        summary = caption(CaptionConfig(ckpt_path=str(ckpt), inputs=[str(root / "videos")], output_dir=str(tmp / "cap"),
                                        decode=DecodeConfig(beam_size=2, max_length=6, min_length=6), device="cpu",
                                        num_workers=0, progress=False, viewer=ViewerConfig(enabled=True)))
    assert summary.viewer == tmp / "cap" / "viewer" / "index.html"
    return summary.viewer


def test_video_scrubbing_moves_the_large_frame(browser, video_viewer, tmp_path):
    from captioning.predictions import read_predictions

    entries = read_predictions(video_viewer.parent.parent / "captions.json")
    page = open_viewer(browser, video_viewer, entries[0]["input"])
    att = np.asarray(entries[0]["attention"])
    assert len({int(np.argmax(row)) for row in att}) > 1  # the words look at different frames
    for t in range(len(entries[0]["tokens"])):
        page.hover(f"#panel-0 .w[data-t='{t}']")
        top = int(np.argmax(att[t]))
        assert page.get_attribute("#panel-0", "data-argmax") == str(top)
        assert page.get_attribute("#panel-0", "data-frame") == str(top)  # the word's most attended frame, large
        heights = page.eval_on_selector_all("#panel-0 .bars .bar", "bars => bars.map(b => parseFloat(b.style.height))")
        assert heights == pytest.approx(list(100 * att[t] / att[t].max()), abs=0.1)
    frames = entries[0]["frame_indices"]
    for k in (len(frames) - 1, 0, 2):  # scrub: the frame under the cursor is shown large
        page.hover(f"#panel-0 .frames .thumb[data-k='{k}']")
        assert page.get_attribute("#panel-0", "data-frame") == str(k)
        assert page.inner_text("#panel-0 .frame-label").startswith(f"frame {frames[k]} ({k + 1} of {len(frames)})")
        pos = page.eval_on_selector("#panel-0 .stage", "s => s.style.backgroundPosition")
        assert float(pos.split("%")[0]) == pytest.approx(100 * k / (len(frames) - 1), abs=1e-3)
    page.keyboard.press("]")
    assert page.get_attribute("#panel-0", "data-frame") == "3"
    page.screenshot(path=str(tmp_path / "video.png"))
    assert page.errors == []


def test_region_boxes_are_shaded_and_the_most_attended_one_marked(browser, tmp_path):
    boxes = np.array([[0, 0, 50, 40], [50, 40, 100, 80], [10, 50, 40, 80]], dtype=np.float64)
    att = np.array([[0.2, 0.7, 0.1], [0.6, 0.1, 0.3]])
    writer = ViewerWriter(tmp_path, ViewerConfig(enabled=True), [RunInfo("regions", "-", Layout("regions"))],
                          kind="image", title="regions")
    run = ViewerRun(["red", "square"], att, log_probs=[-0.1, -2.0], nbest=[("red square", -2.1), ("red circle", -3.5)])
    writer.add(ViewerItem("1", [run], pixels=np.full((80, 100, 3), 200, np.uint8), boxes=boxes, image_size=(100, 80)))
    page = open_viewer(browser, writer.close())
    # each word's probability as its underline's width, the n best captions with their scores
    widths = page.eval_on_selector_all("#panel-0 .w .lp", "ls => ls.map(l => l.style.width)")
    assert widths == [f"{100 * np.exp(-0.1):.0f}%", f"{100 * np.exp(-2.0):.0f}%"]
    assert page.inner_text("#panel-0 .nbest").split("\n") == ["-2.100 red square", "-3.500 red circle"]
    for t in (0, 1):
        page.hover(f"#panel-0 .w[data-t='{t}']")
        a = int(np.argmax(att[t]))
        assert page.get_attribute("#panel-0", "data-argmax") == str(a)
        stage, marker = page.locator("#panel-0 .stage").bounding_box(), page.locator("#panel-0 .marker").bounding_box()
        assert marker["x"] - stage["x"] == pytest.approx(boxes[a, 0] / 100 * stage["width"], abs=1.5)
        assert marker["y"] - stage["y"] == pytest.approx(boxes[a, 1] / 80 * stage["height"], abs=1.5)


def test_grid_video_features_show_each_frames_cells(browser, tmp_path):
    """Video features with a grid per frame (frame-major K*h*w positions, 3-D encoders): the bars are the
    frames' summed weights, the large frame carries its own cells."""
    rng = np.random.default_rng(1)
    att = rng.dirichlet(np.full(3 * 4, 0.3), size=2)  # 2 words over 3 frames x 2x2 cells
    writer = ViewerWriter(tmp_path, ViewerConfig(enabled=True), [RunInfo("3d", "-", Layout("frames", (2, 2), 3, 4))],
                          kind="video", title="grid video")
    writer.add(ViewerItem("v", [ViewerRun(["red", "ball"], att)], pixels=np.full((3, 32, 32, 3), 90, np.uint8),
                          frame_indices=[0, 8, 16]))
    page = open_viewer(browser, writer.close())
    for t in (0, 1):
        page.click(f"#panel-0 .w[data-t='{t}']")  # pinned: it stays while the frames are scrubbed
        frames = att[t].reshape(3, 4).sum(1)
        top = int(np.argmax(frames))
        assert page.get_attribute("#panel-0", "data-argmax") == str(top)
        heights = page.eval_on_selector_all("#panel-0 .bars .bar", "bars => bars.map(b => parseFloat(b.style.height))")
        assert heights == pytest.approx(list(100 * frames / frames.max()), abs=0.1)
        for k in range(3):
            page.hover(f"#panel-0 .frames .thumb[data-k='{k}']")
            cell = int(np.argmax(att[t].reshape(3, 4)[k]))
            stage, marker = page.locator("#panel-0 .stage").bounding_box(), page.locator("#panel-0 .marker").bounding_box()
            assert (marker["x"] - stage["x"], marker["y"] - stage["y"]) == pytest.approx(
                ((cell % 2) * stage["width"] / 2, (cell // 2) * stage["height"] / 2), abs=1.5)


def test_a_5000_item_viewer_is_ready_in_under_3_s(browser, tmp_path):
    """5,000 items of 12 words over a 14x14 grid (the size of a COCO test split at the demo's
    grid): written without a model, opened from disk, the first item shown."""
    rng = np.random.default_rng(0)
    words = ["a", "red", "green", "blue", "circle", "square", "and", "star", "cross", "white", "on", "left"]
    pixels = rng.integers(0, 255, (224, 224, 3), dtype=np.uint8)
    writer = ViewerWriter(tmp_path, ViewerConfig(enabled=True), [RunInfo("big", "-", Layout("grid", (14, 14)))],
                          kind="image", title="5000 items")
    for i in range(5000):
        tokens = list(rng.choice(words, size=12))
        writer.add(ViewerItem(str(i), [ViewerRun(tokens, rng.dirichlet(np.ones(196), size=12), metrics={"CIDEr": float(i % 7)})],
                              pixels=pixels if i < 100 else None, references=[" ".join(tokens)]))
    index = writer.close()
    size = sum(p.stat().st_size for p in index.parent.rglob("*")) / 2**20
    start = time.perf_counter()
    page = open_viewer(browser, index)
    seconds = time.perf_counter() - start
    print(f"5,000-item viewer ({size:.0f} MiB): ready in {seconds:.2f} s (page's own clock: "
          f"{page.evaluate('window.viewerReadyMs') / 1000:.2f} s)")
    assert seconds < 3.0
    assert page.locator("#count").inner_text() == "5000 of 5000 items"
    page.keyboard.press("j")  # the next item, same page: no new script
    page.fill("#search", "4999")
    page.wait_for_function("Viewer.state.item && Viewer.state.item.k === '4999'")
    assert page.errors == []


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as profile:
        pw, ctx = open_browser(profile)
        try:
            print(screenshot(ctx, Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:4]))
        finally:
            ctx.close()
            pw.stop()
