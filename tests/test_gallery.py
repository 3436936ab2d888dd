"""captions.json schema/validation and the offline HTML gallery."""

from __future__ import annotations

import copy
import html
import json
import re

import numpy as np
import pytest

from captioning.errors import DataError
from captioning.predictions import ATTENTION_FILE
from captioning.viz.gallery import (
    CAPTIONS_SCHEMA,
    captions_errors,
    error_entry,
    figure_name,
    make_entry,
    read_captions,
    validate_captions,
    write_captions_json,
    write_index_html,
)

jsonschema = pytest.importorskip("jsonschema")


def image_entry(**over):
    rng = np.random.default_rng(0)
    att = rng.dirichlet(np.ones(49), size=3).reshape(3, 7, 7)
    e = make_entry(
        "photos/cat.jpg", ["a", "cat", "sits"], att, kind="image", figure="figures/0000_cat.png"
    )
    e.update(over)
    return e


def video_entry(**over):
    att = np.full((2, 4), 0.25)
    e = make_entry(
        "clips/v1.mp4",
        ["dog", "runs"],
        att,
        kind="video",
        frame_indices=[0, 8, 16, 24],
        figure="figures/0001_v1.png",
        score=-1.25,
    )
    e.update(over)
    return e


def test_make_entry_shapes():
    e = image_entry()
    assert (
        e["attention_shape"] == [7, 7] and len(e["attention"]) == 3 and len(e["attention"][0]) == 49
    )
    assert e["caption"] == "a cat sits" and e["kind"] == "image"
    assert abs(sum(e["attention"][0]) - 1.0) < 1e-4
    assert isinstance(e["attention"], np.ndarray) and e["attention"].dtype == np.float32  # no per-float lists
    v = video_entry()
    assert (
        v["attention_shape"] == [4] and v["frame_indices"] == [0, 8, 16, 24] and v["score"] == -1.25
    )
    with pytest.raises(ValueError, match="attention_shape"):
        make_entry("x.jpg", ["a"], np.ones((1, 49)), kind="image", figure="f.png")
    flat = make_entry(
        "x.jpg", ["a"], np.ones((1, 6)) / 6, kind="image", figure="f.png", attention_shape=(2, 3)
    )
    assert flat["attention_shape"] == [2, 3]


def _listed(e):
    """The entry with its attention rows as lists (as older files held them inline)."""
    return {**e, "attention": np.asarray(e["attention"]).tolist()} if "attention" in e else dict(e)


def test_schema_is_valid_draft_2020_12(tmp_path):
    jsonschema.Draft202012Validator.check_schema(CAPTIONS_SCHEMA)
    data = [
        image_entry(),
        video_entry(),
        error_entry("broken.jpg", "image", OSError("cannot identify image")),
    ]
    jsonschema.Draft202012Validator(CAPTIONS_SCHEMA).validate([_listed(e) for e in data])  # rows inline
    out = write_captions_json(data, tmp_path / "captions.json")
    jsonschema.Draft202012Validator(CAPTIONS_SCHEMA).validate(json.loads(out.read_text()))  # row spans


@pytest.mark.parametrize("use_jsonschema", [True, False])
def test_valid_entries_pass_and_roundtrip(tmp_path, use_jsonschema):
    data = [image_entry(), video_entry(), error_entry("gone.mp4", "video", "video has no frames")]
    assert captions_errors(data, use_jsonschema=use_jsonschema) == []
    out = write_captions_json(data, tmp_path / "out" / "captions.json")
    stored = json.loads(out.read_text(encoding="utf-8"))
    assert [e.get("attention") for e in stored] == [[0, 3], [3, 5], None]  # rows of attention.npy, no floats
    assert [e.get("attention_width") for e in stored] == [49, 4, None]  # items of several widths
    assert (tmp_path / "out" / ATTENTION_FILE).stat().st_mode & 0o777 == 0o644 == out.stat().st_mode & 0o777
    jsonschema.Draft202012Validator(CAPTIONS_SCHEMA).validate(stored)
    validate_captions(stored, use_jsonschema=use_jsonschema)
    back = read_captions(out)
    for e, got in zip(data, back, strict=True):
        assert {k: v for k, v in got.items() if k not in ("attention", "attention_width")} == {
            k: v for k, v in e.items() if k != "attention"}
        if "error" not in e:  # float16 in the file: relative error <= 2^-11
            np.testing.assert_allclose(got["attention"], e["attention"], rtol=2.0**-11, atol=1e-7)
    validate_captions(back, use_jsonschema=use_jsonschema)
    assert captions_errors([{**stored[0], "attention": [0, 2]}], use_jsonschema=use_jsonschema)  # 3 tokens


def _drop(key):
    def f(e):
        del e[key]

    return f


INVALID = {
    "token/attention count": lambda e: e["tokens"].append("extra"),
    "row length": lambda e: e["attention"][1].pop(),
    "missing tokens": _drop("tokens"),
    "missing attention": _drop("attention"),
    "missing input": _drop("input"),
    "missing figure": _drop("figure"),
    "missing kind": _drop("kind"),
    "bad kind": lambda e: e.update(kind="audio"),
    "string weight": lambda e: e["attention"][0].__setitem__(0, "0.5"),
    "negative weight": lambda e: e["attention"][0].__setitem__(0, -0.1),
    "bool weight": lambda e: e["attention"][0].__setitem__(0, True),
    "nan weight": lambda e: e["attention"][0].__setitem__(0, float("nan")),
    "inf weight": lambda e: e["attention"][0].__setitem__(0, float("inf")),
    "3-d image shape": lambda e: e.update(attention_shape=[7, 7, 1]),  # 1-d: image regions, valid
    "fractional shape": lambda e: e.update(attention_shape=[7.5, 7]),
    "frame_indices on image": lambda e: e.update(frame_indices=[1, 2]),
    "absolute figure": lambda e: e.update(figure="/etc/passwd"),
    "escaping figure": lambda e: e.update(figure="../x.png"),
    "scheme figure": lambda e: e.update(figure="javascript:alert(1)"),
    "tokens not strings": lambda e: e.update(tokens=[1, 2, 3]),
}


@pytest.mark.parametrize("use_jsonschema", [True, False])
@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_image_entries_fail(tmp_path, name, use_jsonschema):
    e = copy.deepcopy(_listed(image_entry()))
    INVALID[name](e)
    data = [video_entry(), e]
    errs = captions_errors(data, use_jsonschema=use_jsonschema)
    assert errs and all(m.startswith("entry 1") for m in errs), errs
    with pytest.raises(DataError, match="entry 1"):
        validate_captions(data, use_jsonschema=use_jsonschema)
    if name not in ("nan weight", "inf weight"):
        with pytest.raises(DataError):
            write_captions_json(data, tmp_path / "captions.json")
        assert not (tmp_path / "captions.json").exists()


VIDEO_INVALID = {
    "missing frame_indices": _drop("frame_indices"),
    "frame count mismatch": lambda e: e.update(frame_indices=[0, 8, 16]),
    "2-d video shape": lambda e: e.update(attention_shape=[2, 2]),
    "negative frame": lambda e: e.update(frame_indices=[-1, 8, 16, 24]),
}


ARRAY_INVALID = {
    "row count": lambda a: a[:2],
    "row width": lambda a: a[:, :48],
    "negative weight": lambda a: a - 1.0,
    "nan weight": lambda a: np.where(a > 0.05, np.nan, a),
}


@pytest.mark.parametrize("use_jsonschema", [True, False])
@pytest.mark.parametrize("name", sorted(ARRAY_INVALID))
def test_invalid_attention_arrays_fail(name, use_jsonschema):
    """Rows held as an array (what make_entry and read_captions give) are checked as lists are."""
    e = image_entry()
    e["attention"] = ARRAY_INVALID[name](e["attention"])
    assert captions_errors([e], use_jsonschema=use_jsonschema)


@pytest.mark.parametrize("use_jsonschema", [True, False])
@pytest.mark.parametrize("name", sorted(VIDEO_INVALID))
def test_invalid_video_entries_fail(name, use_jsonschema):
    e = copy.deepcopy(video_entry())
    VIDEO_INVALID[name](e)
    assert captions_errors([e], use_jsonschema=use_jsonschema)


@pytest.mark.parametrize("use_jsonschema", [True, False])
def test_error_entries_need_only_input_kind_error(use_jsonschema):
    assert (
        captions_errors(
            [{"input": "a.jpg", "kind": "image", "error": "unreadable"}],
            use_jsonschema=use_jsonschema,
        )
        == []
    )
    assert captions_errors([{"input": "a.jpg", "kind": "image"}], use_jsonschema=use_jsonschema)
    assert captions_errors(
        [{"input": "a.jpg", "kind": "image", "error": ""}], use_jsonschema=use_jsonschema
    )
    assert captions_errors({"input": "a.jpg"}, use_jsonschema=use_jsonschema)  # not a list
    assert captions_errors(["nope"], use_jsonschema=use_jsonschema)


def test_error_entry_is_one_line():
    e = error_entry("x.jpg", "image", ValueError("bad\n  thing"))
    assert e["error"] == "bad thing"
    assert error_entry("x.jpg", "image", KeyError())["error"] == "KeyError"


def test_numpy_values_are_converted(tmp_path):
    e = image_entry()
    e["attention"] = e["attention"].tolist()  # lists are rows too
    e["attention_shape"] = np.array([7, 7])
    e["score"] = np.float32(-0.5)
    out = write_captions_json([e], tmp_path / "c.json")
    loaded = json.loads(out.read_text())
    assert loaded[0]["attention_shape"] == [7, 7] and loaded[0]["score"] == -0.5
    with pytest.raises(DataError, match="NaN or infinity"):  # strict JSON: nothing written
        write_captions_json([{**e, "score": float("-inf")}], tmp_path / "inf.json")
    assert not (tmp_path / "inf.json").exists()


def test_figure_name_is_safe():
    assert figure_name("photos/My Cat <1>.jpg", 7) == "0007_My_Cat_1.png"
    assert figure_name('a"b<c.mp4', 12) == "0012_a_b_c.png"
    assert figure_name("///", 0) == "0000_input.png"
    assert figure_name("C:\\data\\img.PNG", 3) == "0003_img.png"


def test_index_html_escapes_and_links_figures(tmp_path):
    evil_caption = "a <script>alert(1)</script> & co"
    evil_input = 'dir/we"ird<name>.jpg'
    fig_rel = 'figures/0000_we"ird<name>.png'
    (tmp_path / "figures").mkdir()
    (tmp_path / fig_rel).write_bytes(b"\x89PNG fake")
    ok = image_entry(input=evil_input, caption=evil_caption, figure=fig_rel)
    missing = video_entry(figure="figures/not_there.png")
    bad = error_entry('<img src=x onerror="alert(2)">.jpg', "image", "cannot decode <b>file</b>")
    data = [ok, missing, bad]
    validate_captions(data)
    out = write_index_html(data, tmp_path, title='Run <1> & "friends"')
    assert out == tmp_path / "index.html"
    text = out.read_text(encoding="utf-8")
    assert "<script>" not in text and "alert(1)</script>" not in text
    assert html.escape(evil_caption) in text
    assert html.escape(evil_input) in text
    assert "<img src=x" not in text and "<b>file</b>" not in text
    assert html.escape("cannot decode <b>file</b>") in text
    assert "Run &lt;1&gt; &amp; &quot;friends&quot;" in text
    # the figure is linked with a quoted, relative src that resolves to the file
    assert 'src="figures/0000_we%22ird%3Cname%3E.png"' in text
    assert "figure not found" in text and "Failed inputs" in text
    # offline: no external resources or scripts
    assert "http://" not in text and "https://" not in text and "<script" not in text.lower()
    assert text.count('class="card"') == 2
    # every img tag's src attribute is properly quoted (no raw quote breaks out of the attribute)
    for m in re.finditer(r"<img ([^>]*)>", text):
        attrs = m.group(1)
        assert attrs.count('"') % 2 == 0 and "onerror" not in attrs


def test_index_html_refuses_unsafe_figure_paths(tmp_path):
    e = image_entry(figure="../../etc/passwd")
    text = write_index_html([e], tmp_path).read_text()
    assert "passwd" not in text and "no figure" in text


def test_end_to_end_with_real_figure(tmp_path):
    from captioning.viz.image_grid import image_attention_figure

    e = image_entry()
    img = np.full((64, 64, 3), 128, np.uint8)
    image_attention_figure(
        img, e["tokens"], np.asarray(e["attention"]), (7, 7), tmp_path / e["figure"]
    )
    write_captions_json([e], tmp_path / "captions.json")
    text = write_index_html([e], tmp_path).read_text()
    assert 'src="figures/0000_cat.png"' in text and "figure not found" not in text


def test_writing_a_thousand_captions_is_cheap(tmp_path):
    """1,000 captions of 18 words over a 14x14 grid: the weights go to attention.npy as one array,
    not through per-float rounding and JSON (34.7 s of CPU per 1,000 entries before, 0.6 s after)."""
    import time

    rng = np.random.default_rng(0)
    maps = [rng.dirichlet(np.ones(196), size=18).astype(np.float32) for _ in range(1000)]
    t0 = time.perf_counter()
    entries = [make_entry(f"img{i}.jpg", ["w"] * 18, a, kind="image", figure=f"figures/{i:04d}.png",
                          attention_shape=[14, 14]) for i, a in enumerate(maps)]
    out = write_captions_json(entries, tmp_path / "captions.json")
    assert time.perf_counter() - t0 < 10.0
    assert out.stat().st_size < 500_000 and (tmp_path / ATTENTION_FILE).stat().st_size < 1000 * 18 * 196 * 2 + 1024
