"""The attention viewer's files, without a browser (tests/test_viewer_browser.py opens them in one):
the attention bytes, the command line, the layouts, the pages, per-word grounding against hand
computed values, and a page that names no external resource."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir

from captioning.config import CONF_DIR, to_config
from captioning.errors import ConfigError
from captioning.viz.viewer import (
    Layout,
    RunInfo,
    ViewerConfig,
    ViewerItem,
    ViewerRun,
    ViewerWriter,
    encode_attention,
    infer_layout,
    layout_of_meta,
    read_compare,
    switch_overrides,
)


def _load_js(path: Path) -> list:
    """The arguments of a data file's ``Viewer.index(...)`` / ``Viewer.page(n, ...)`` call."""
    text = path.read_text(encoding="utf-8")
    m = re.fullmatch(r"Viewer\.(index|page)\((.*)\);\n", text, flags=re.S)
    assert m, text[:80]
    return json.loads(f"[{m.group(2)}]")


def test_attention_is_the_float16_bytes_of_the_file():
    # 0.5 = 0x3800, 0.25 = 0x3400, 1.0 = 0x3C00 in binary16, little-endian
    assert base64.b64decode(encode_attention(np.array([[0.5, 0.25], [1.0, 0.0]]))) == bytes(
        [0x00, 0x38, 0x00, 0x34, 0x00, 0x3C, 0x00, 0x00])
    rows = np.random.default_rng(0).dirichlet(np.ones(196), size=5).astype(np.float16)
    back = np.frombuffer(base64.b64decode(encode_attention(rows)), dtype="<f2").reshape(5, 196)
    assert np.array_equal(back, rows)


def test_viewer_true_on_the_command_line():
    assert switch_overrides(["ckpt_path=x", "viewer=true", "viewer.compare=a/p.json"]) == [
        "ckpt_path=x", "viewer='true'", "viewer.compare=a/p.json"]
    assert switch_overrides(["viewer=True,false", "viewers=true", "+viewer=x"]) == [
        "viewer='true','false'", "viewers=true", "+viewer=x"]
    from captioning.cli.caption import CaptionConfig
    from captioning.cli.evaluate import EvaluateConfig  # registers the evaluate schema

    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        for name, schema in (("evaluate", EvaluateConfig), ("caption", CaptionConfig)):
            cfg = to_config(compose(name, switch_overrides(["ckpt_path=x", "viewer=true", "viewer.compare=b.json"])), schema)
            assert cfg.viewer == ViewerConfig(enabled=True, compare="b.json") and cfg.viewer.wanted
            off = to_config(compose(name, ["ckpt_path=x"]), schema).viewer
            assert off == ViewerConfig() and not off.wanted
            assert to_config(compose(name, ["ckpt_path=x", "viewer.compare=b.json"]), schema).viewer.wanted
            with pytest.raises(Exception, match="page_size"):  # typed: at composition, or when made a config
                to_config(compose(name, ["ckpt_path=x", "viewer.page_size=many"]), schema)


def test_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="viewer.page_size=0"):
        ViewerConfig(enabled=True, page_size=0).validate()
    with pytest.raises(ConfigError, match=r"viewer.compare=.*nope.json: no such file"):
        ViewerConfig(compare=str(tmp_path / "nope.json")).validate()


def test_layouts():
    assert layout_of_meta({"kind": "image", "positions": 196, "grid": [14, 14]}) == Layout("grid", (14, 14))
    assert layout_of_meta({"kind": "image", "positions": 36, "regions": True, "grid": None}) == Layout("regions")
    assert layout_of_meta({"kind": "video", "positions": 28, "frames": 28}) == Layout("frames", None, 28, 1)
    assert layout_of_meta({"kind": "video", "positions": 8 * 49, "frames": 8, "grid": [7, 7]}) == Layout("frames", (7, 7), 8, 49)
    grid = Layout("grid", (14, 14))
    assert infer_layout(196, grid) == grid
    assert infer_layout(49, grid) == Layout("grid", (7, 7))
    assert infer_layout(50, grid) == Layout("positions")
    frames = Layout("frames", None, 8, 1)
    assert infer_layout(8, frames) == frames
    assert infer_layout(8 * 16, frames) == Layout("frames", (4, 4), 8, 16)
    assert infer_layout(12, frames) == Layout("positions")
    from captioning.viz.viewer.results import stream_names

    assert stream_names({"streams": [{"encoder": {"name": "resnet50"}}, {"settings": {"backbone": "r3d_18"}}]}) == [
        "resnet50", "r3d_18"]
    assert stream_names({"kind": "video"}) is None


def _write(out: Path, n: int, page_size: int, **kw) -> Path:
    writer = ViewerWriter(out, ViewerConfig(enabled=True, page_size=page_size, **kw),
                          [RunInfo("run", "p.json", Layout("grid", (2, 2)))], kind="image", title="t")
    for i in range(n):
        att = np.full((2, 4), 0.25)
        writer.add(ViewerItem(str(i), [ViewerRun(["a", f"w{i}"], att, score=-1.5, log_probs=[-0.1, float("-inf")],
                                                 metrics={"CIDEr": i / 10})],
                              pixels=np.zeros((40, 30, 3), np.uint8), references=["a w"]))
    return writer.close()


def test_pages_index_and_images(tmp_path):
    index = _write(tmp_path, 7, page_size=3)
    assert index == tmp_path / "viewer" / "index.html"
    root = index.parent
    assert sorted(p.name for p in (root / "data").iterdir()) == ["index.js", "page-0000.js", "page-0001.js", "page-0002.js"]
    (ix,) = _load_js(root / "data" / "index.js")
    assert (ix["count"], ix["pages"], ix["page_size"], ix["metrics"]) == (7, 3, 3, ["CIDEr"])
    assert [e["c"][0] for e in ix["items"]] == [f"a w{i}" for i in range(7)]
    n, items = _load_js(root / "data" / "page-0002.js")
    assert n == 2 and [it["k"] for it in items] == ["6"]
    run = items[0]["r"][0]
    assert run["lp"] == [-0.1, None] and run["n"] == 4 and run["sc"] == -1.5  # -inf: no number for the page
    assert items[0]["wh"] == [30, 40] and (root / items[0]["img"]).is_file()
    # a second, smaller viewer replaces the first whole: no page of the old one is left behind
    _write(tmp_path, 2, page_size=3)
    assert sorted(p.name for p in (root / "data").iterdir()) == ["index.js", "page-0000.js"]
    assert not (tmp_path / "viewer.partial").exists() and not (tmp_path / "viewer.old").exists()
    _write(tmp_path, 5, page_size=2, max_items=3)
    assert _load_js(root / "data" / "index.js")[0]["count"] == 3


def test_the_page_names_no_external_resource(tmp_path):
    """Opened from disk with the network off: no http(s):// or protocol-relative URL, no fetch()
    (Chromium refuses it for files beside a file:// page), no @import, in any file of a viewer."""
    root = _write(tmp_path, 3, page_size=2).parent
    texts = {p: p.read_text(encoding="utf-8") for p in root.rglob("*") if p.suffix in (".html", ".js", ".css")}
    assert {p.name for p in texts} >= {"index.html", "viewer.js", "viewer.css", "index.js", "page-0000.js"}
    external = re.compile(r"(?i)(https?:|\bwss?:|[\"'(=]\s*//[a-z0-9])")
    for path, text in texts.items():
        assert not external.search(text), (path, external.search(text).group(0))
        assert "fetch(" not in text and "XMLHttpRequest" not in text and "@import" not in text, path
    html = texts[root / "index.html"]
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == ["viewer.css", "viewer.js", "data/index.js"]


def test_the_page_names_the_runs_files_relative_to_its_folder(tmp_path):
    """No path of the machine a viewer was written on reaches its files (docs/img/viewer.jpg once
    showed one): the runs' files are named relative to viewer/, so a copied folder still names them."""
    out = tmp_path / "run" / "eval" / "test"
    writer = ViewerWriter(out, ViewerConfig(enabled=True), [
        RunInfo("mine", str(out / "predictions.json"), Layout("grid", (2, 2))),
        RunInfo("other", str(tmp_path / "other" / "eval" / "predictions.json"), Layout("grid", (2, 2)))],
        kind="image", title="t")
    writer.add(ViewerItem("7", [ViewerRun(["a"], np.full((1, 4), 0.25)), None], pixels=np.zeros((8, 8, 3), np.uint8)))
    root = writer.close().parent
    (ix,) = _load_js(root / "data" / "index.js")
    assert [r["source"] for r in ix["runs"]] == ["../predictions.json", "../../../../other/eval/predictions.json"]
    written = "".join(p.read_text(encoding="utf-8") for p in root.rglob("*") if p.suffix in (".html", ".js"))
    assert str(tmp_path) not in written and "/tmp" not in written


def test_the_static_files_are_package_data():
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"captioning\.viz\.viewer"\s*=\s*\[\s*"static/\*"\s*\]', pyproject)


def test_read_compare_matches_items_and_reads_nbest(tmp_path):
    from captioning.predictions import write_predictions

    write_predictions(tmp_path, [{"image_id": 3, "caption": "a b", "tokens": ["a", "b"], "score": -1.0,
                                  "token_log_probs": [-0.5, -0.25]},
                                 {"image_id": 4, "caption": "c", "tokens": ["c"], "score": -2.0}],
                      [np.eye(2, 4), np.ones((1, 4)) / 4])
    (tmp_path / "nbest.json").write_text(json.dumps([{"image_id": 3, "captions": [{"caption": "a b", "score": -1.0},
                                                                                  {"caption": "a c", "score": -3.0}]}]))
    path, runs = read_compare(tmp_path)  # the folder: its predictions.json
    assert path == tmp_path / "predictions.json" and sorted(runs) == ["3", "4"]
    assert runs["3"].tokens == ["a", "b"] and runs["3"].log_probs == [-0.5, -0.25]
    assert runs["3"].nbest == [("a b", -1.0), ("a c", -3.0)] and runs["4"].nbest == []
    np.testing.assert_allclose(runs["3"].attention, np.eye(2, 4))


def test_word_grounding_by_hand():
    from captioning.evaluation.viewer import WordGrounding

    grounding = {"kind": "image", "word_classes": {"colour": ["red"], "shape": ["square"]},
                 "items": {"1": {"size": [64, 64], "objects": [{"box": [0, 0, 32, 32], "words": ["red", "square"]}]}}}
    ground = WordGrounding(grounding, "image", {"kind": "image", "grid": [2, 2]})
    alpha = np.array([[0.25] * 4, [0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1]])
    item = SimpleNamespace(valid=4, frame_indices=None, boxes=None, image_size=None)
    got = ground("1", ["a", "red", "square"], alpha, Layout("grid", (2, 2)), item)
    # "red": all of cell 0 is in the box (0.7 of the mass) and it is the argmax; "square": argmax cell 1 is outside
    assert got == [{"t": 1, "hit": True, "mass": 0.7, "box": [0.0, 0.0, 0.5, 0.5]},
                   {"t": 2, "hit": False, "mass": 0.1, "box": [0.0, 0.0, 0.5, 0.5]}]
    assert ground("2", ["red"], alpha[1:2], Layout("grid", (2, 2)), item) == []  # not in the file
    video = {"kind": "video", "word_classes": {"colour": ["red"]},
             "items": {"v": {"events": [{"span": [4, 10], "words": ["red"]}]}}}
    ground = WordGrounding(video, "video", {"kind": "video", "positions": 5, "frames": 5})
    item = SimpleNamespace(valid=5, frame_indices=(0, 3, 6, 9, 12), boxes=None, image_size=None)
    got = ground("v", ["red"], np.array([[0.1, 0.1, 0.5, 0.2, 0.1]]), Layout("frames", None, 5, 1), item)
    assert got == [{"t": 0, "hit": True, "mass": 0.7, "frames": [2, 3]}]  # frames 6 and 9 lie in [4, 10)


def test_make_demo_prints_where_its_viewer_is(tmp_path, capsys):
    from captioning import demo
    from captioning.utils.io import atomic_write_json

    for split in ("val", "test"):
        atomic_write_json(tmp_path / "eval" / split / "metrics.json", {"Bleu_4": 0.9, "CIDEr": 7.5})
        atomic_write_json(tmp_path / "eval" / split / "report.json", {})
    demo.print_summary(tmp_path, "run", "run/best.ckpt", 60.0)
    assert f"attention viewer: {tmp_path}/eval/test/viewer/index.html" in capsys.readouterr().out


def test_caption_results_with_another_run_to_compare(tmp_path):
    """captioning-caption's viewer: each result an item, the other run's captions.json matched by input."""
    from captioning.caption.api import CaptionResult
    from captioning.predictions import write_predictions
    from captioning.viz.viewer.results import ResultsViewer

    other = tmp_path / "other"
    other.mkdir()
    write_predictions(other, [{"input": "b.jpg", "caption": "x", "tokens": ["x"]}], [np.full((1, 4), 0.25)],
                      name="captions.json")
    captioner = SimpleNamespace(kind="image", regions=False, grid=(2, 2), hard_attention=False, source="run/best.ckpt",
                                feature_meta={"kind": "image", "grid": [2, 2]})
    viewer = ResultsViewer(tmp_path, ViewerConfig(compare=str(other / "captions.json")), captioner, "caps")
    results = [CaptionResult("a.jpg", "image", error="unreadable"),
               CaptionResult("b.jpg", "image", caption="y z", tokens=["y", "z"], attention=np.eye(2, 4),
                             attention_shape=[2, 2], image=np.zeros((8, 8, 3), np.uint8), score=-1.0)]
    assert list(viewer.tap(results)) == results  # passed on unchanged
    root = viewer.close().parent
    (ix,) = _load_js(root / "data" / "index.js")
    assert [r["name"] for r in ix["runs"]] == ["best.ckpt", "other"]
    assert ix["runs"][0]["layout"] == {"type": "grid", "grid": [2, 2], "frames": None, "cells": 1}
    assert [e["c"] for e in ix["items"]] == [["y z", "x"]]  # the failed input is left out
    _, (item,) = _load_js(root / "data" / "page-0000.js")
    assert [r["tok"] for r in item["r"]] == [["y", "z"], ["x"]] and item["img"] == "images/000000.jpg"
