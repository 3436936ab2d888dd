"""Attention grounding: hand-computed overlaps, mass, pointing, chance levels, word matching (in context)
and word classes read from the grounding file."""

from __future__ import annotations

import numpy as np
import pytest

from captioning.errors import ConfigError, DataError
from captioning.evaluation.grounding import (
    evaluate_grounding,
    owners_in_context,
    word_classes_of,
)
from captioning.evaluation.object_regions import Geometry, Region, cell_box_overlap, frames_in_span


def mass(alpha, region: Region) -> float:
    return region.score(np.asarray(alpha, dtype=np.float64))[0]


def hit(alpha, region: Region) -> bool:
    return region.score(np.asarray(alpha, dtype=np.float64))[1]

GRID = (2, 2)
SIZE = (4, 4)
TOP_LEFT = [0, 0, 2, 2]


# ----------------------------------------------------------------------------------- image


def test_box_covering_exactly_one_cell():
    overlap = cell_box_overlap(GRID, SIZE, TOP_LEFT)
    np.testing.assert_allclose(overlap, [1, 0, 0, 0])
    onehot = np.array([1.0, 0, 0, 0])
    region = Region.of_box(GRID, SIZE, TOP_LEFT)
    assert mass(onehot, region) == pytest.approx(1.0) and hit(onehot, region)
    assert mass(np.full(4, 0.25), region) == pytest.approx(0.25)
    assert not hit([0, 0, 0, 1.0], region)
    assert (region.chance_mass, region.chance_hit) == (0.25, 0.25)


def test_half_cell_and_straddling_boxes():
    np.testing.assert_allclose(cell_box_overlap(GRID, SIZE, [0, 0, 1, 2]), [0.5, 0, 0, 0])
    # a 2x2 box centred on the image covers a quarter of each cell
    np.testing.assert_allclose(cell_box_overlap(GRID, SIZE, [1, 1, 3, 3]), [0.25] * 4)
    # row-major: the box in the bottom-left quadrant is cell 2
    np.testing.assert_allclose(cell_box_overlap(GRID, SIZE, [0, 2, 2, 4]), [0, 0, 1, 0])
    # a box beyond the image is clipped
    np.testing.assert_allclose(cell_box_overlap(GRID, SIZE, [3, 3, 9, 9]), [0, 0, 0, 0.25])
    # half a cell: its centre (1, 1) is not inside [0, 1) x [0, 2)
    assert not hit([1.0, 0, 0, 0], Region.of_box(GRID, SIZE, [0, 0, 1, 2]))
    # renormalised: attention that does not sum to 1
    assert mass([2.0, 2, 0, 0], Region.of_box(GRID, SIZE, TOP_LEFT)) == pytest.approx(0.5)


def test_non_square_grid_and_image():
    # 1x4 grid over an 8x2 image: cells are 2 px wide
    np.testing.assert_allclose(cell_box_overlap((1, 4), (8, 2), [3, 0, 8, 1]), [0, 0.25, 0.5, 0.5])


def test_centre_crop_geometry_shifts_cells():
    # 8x4 image, network input 4x4: the shorter side already is 4, the crop keeps x in [2, 6)
    geom = Geometry(size=4)
    np.testing.assert_allclose(cell_box_overlap(GRID, (8, 4), [2, 0, 4, 2], geom), [1, 0, 0, 0])
    np.testing.assert_allclose(cell_box_overlap(GRID, (8, 4), [4, 2, 6, 4], geom), [0, 0, 0, 1])
    # cropped away entirely
    np.testing.assert_allclose(cell_box_overlap(GRID, (8, 4), [0, 0, 2, 4], geom), [0, 0, 0, 0])
    # without the geometry the same box would be read against the whole image
    np.testing.assert_allclose(cell_box_overlap(GRID, (8, 4), [2, 0, 4, 2]), [0.5, 0, 0, 0])
    # resize the shorter side 8 -> 4 (scale 0.5: 16x8 -> 8x4), then crop x in [2, 6)
    geom = Geometry(size=4, resize=4)
    np.testing.assert_allclose(cell_box_overlap(GRID, (16, 8), [4, 0, 8, 4], geom), [1, 0, 0, 0])
    assert hit([1.0, 0, 0, 0], Region.of_box(GRID, (16, 8), [4, 0, 8, 4], geom))
    # portrait image: the crop removes rows instead
    np.testing.assert_allclose(cell_box_overlap(GRID, (4, 8), [0, 2, 2, 4], Geometry(size=4)), [1, 0, 0, 0])
    # squash: 8x4 -> 4x4, x scaled by 0.5
    geom = Geometry(size=4, crop="none")
    np.testing.assert_allclose(cell_box_overlap(GRID, (8, 4), [0, 0, 4, 2], geom), [1, 0, 0, 0])


def test_geometry_from_store_meta_and_errors():
    meta = {"settings": {"preprocessing": {"size": 224, "resize": 256, "crop": "center"}}}
    assert Geometry.from_store_meta(meta) == Geometry(size=224, resize=256, crop="center")
    assert Geometry.from_store_meta({}) == Geometry()
    with pytest.raises(ConfigError, match="crop"):
        Geometry(size=4, crop="random")


def test_geometry_matches_the_feature_preprocessing():
    """The mapping agrees with the Preprocessing that feature extraction applies (torchvision)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from captioning.features.backbones import Preprocessing

    w, h = 300, 200
    box = [150, 100, 190, 140]  # a white square, 40 px
    img = torch.zeros(3, h, w, dtype=torch.uint8)
    img[:, box[1]:box[3], box[0]:box[2]] = 255
    pre = Preprocessing(size=224, resize=256, crop="center", mean=(0, 0, 0), std=(1, 1, 1))
    out = pre(img)[0].numpy()
    ys, xs = np.nonzero(out > 127)
    geom = Geometry.from_preprocessing(pre.to_dict())
    # the box on a 224x224 grid of 1-pixel cells is exactly the pixels it covers
    overlap = cell_box_overlap((224, 224), (w, h), box, geom).reshape(224, 224)
    ys2, xs2 = np.nonzero(overlap > 0.5)
    assert abs(xs.min() - xs2.min()) <= 1 and abs(xs.max() - xs2.max()) <= 1
    assert abs(ys.min() - ys2.min()) <= 1 and abs(ys.max() - ys2.max()) <= 1


# ----------------------------------------------------------------------------------- video


def test_frames_in_span_half_open():
    np.testing.assert_array_equal(frames_in_span([0, 4, 8, 12], [4, 12]), [False, True, True, False])


def test_video_mass_and_pointing_ignore_padded_frames():
    frames = [0, 10, 20, 20]  # the last one is padding (valid = 3)
    alpha = np.array([0.1, 0.2, 0.3, 0.4])
    # valid frames renormalised: [1/6, 2/6, 3/6]; only frame 20 is in [20, 30)
    assert mass(alpha, Region.of_span(frames, [20, 30], valid_frames=3)) == pytest.approx(0.5)
    assert hit(alpha, Region.of_span(frames, [20, 30], valid_frames=3))
    assert not hit(alpha, Region.of_span(frames, [0, 20], valid_frames=3))
    # counting the padded frame would double the mass in the span
    assert mass(alpha, Region.of_span(frames, [20, 30])) == pytest.approx(0.7)
    # grid features: K=2 frames x 2 cells, frame-major -> per-frame sums [0.3, 0.7]
    assert mass([0.1, 0.2, 0.3, 0.4], Region.of_span([0, 10], [10, 11])) == pytest.approx(0.7)


# ----------------------------------------------------------------------------- aggregation


IMAGE_CLASSES = {"colour": ["red", "blue", "green"], "shape": ["circle", "square", "star"], "size": ["small", "large"]}
VIDEO_CLASSES = {"colour": ["red", "blue", "green"], "shape": ["circle", "square"],
                 "verb": ["appears", "disappears", "turns"]}


def _image_grounding() -> dict:
    return {"kind": "image", "word_classes": IMAGE_CLASSES, "items": {"7": {"size": [4, 4], "objects": [
        {"box": [0, 0, 2, 2], "words": ["small", "red", "circle"]},
        {"box": [2, 2, 4, 4], "words": ["large", "blue", "square"]},
        {"box": [2, 0, 4, 2], "words": ["small", "red", "star"]},
    ]}}}


def test_owners_in_context_resolves_shared_words():
    # objects: 0 red circle, 1 red square, 2 blue square; "red" and "square" each name two
    words = [{"red", "circle"}, {"red", "square"}, {"blue", "square"}]
    tokens = ["a", "red", "square", "and", "a", "blue", "square", "and", "red"]
    owners = [{i for i, w in enumerate(words) if t in w} for t in tokens]
    # the last "red" has no class word next to it: it stays ambiguous
    assert owners_in_context(tokens, owners) == [set(), {1}, {1}, set(), set(), {2}, {2}, set(), {0, 1}]


def test_evaluate_grounding_image_hand_computed():
    tokens = ["a", "small", "red", "circle", "and", "a", "blue", "square", "green"]
    att = np.full((len(tokens) + 1, 4), 0.25)  # one extra row (<eos>) is allowed
    att[2] = [0, 1, 0, 0]  # red: "red circle" -> the circle (cell 0), but it looks at the red star (cell 1)
    att[3] = [1, 0, 0, 0]  # circle: on its object
    # blue (row 6): uniform -> mass 0.25, argmax = cell 0 (first on ties) -> miss
    att[7] = [0, 0, 0, 1]  # square: on its object
    preds = {7: (tokens, att), 99: (["red"], np.full((1, 4), 0.25))}  # 99 is not in the file
    g = evaluate_grounding(preds, _image_grounding(), kind="image", grid=(2, 2),
                           geometry={"size": 4, "resize": 4, "crop": "center"})
    assert g["words_evaluated"] == 4  # red (by its neighbour "circle"), circle, blue, square
    assert g["words_ambiguous"] == 1  # small: the circle and the star, and so is its neighbour "red"
    assert g["words_not_in_item"] == 1  # green
    assert g["items"] == 1 and g["items_missing"] == 1
    assert g["attention_in_object"] == pytest.approx((0 + 1 + 0.25 + 1) / 4)
    assert g["pointing_accuracy"] == pytest.approx(2 / 4)
    assert g["chance_attention_in_object"] == pytest.approx(0.25)
    assert g["chance_pointing_accuracy"] == pytest.approx(0.25)
    shape, colour, size = g["by_class"]["shape"], g["by_class"]["colour"], g["by_class"]["size"]
    assert shape["words_evaluated"] == 2 and shape["attention_in_object"] == pytest.approx(1.0)
    assert colour["words_evaluated"] == 2 and colour["pointing_accuracy"] == 0.0
    assert colour["attention_in_object"] == pytest.approx(0.125)
    assert colour["words_ambiguous"] == 0 and colour["words_not_in_item"] == 1
    assert size["words_evaluated"] == 0 and size["words_ambiguous"] == 1 and size["attention_in_object"] is None
    assert g["by_word"]["circle"]["words_evaluated"] == 1 and g["by_word"]["red"]["words_evaluated"] == 1
    assert "a" not in g["by_word"]


def test_evaluate_grounding_custom_word_classes_and_empty():
    tokens = ["red", "circle", "blue"]
    att = np.eye(4)[[0, 0, 3]]
    g = evaluate_grounding({"7": (tokens, att)}, _image_grounding(), kind="image", grid=(2, 2),
                           word_classes={"colour": ["blue"]})
    assert g["words_evaluated"] == 1 and g["attention_in_object"] == pytest.approx(1.0)
    assert set(g["by_class"]) == {"colour"}
    empty = evaluate_grounding({}, _image_grounding(), kind="image", grid=(2, 2))
    assert empty["words_evaluated"] == 0 and empty["attention_in_object"] is None


def test_word_classes_come_from_the_grounding_file():
    tokens = ["red", "circle", "blue"]
    att = np.eye(4)[[0, 0, 3]]
    only_shapes = {**_image_grounding(), "word_classes": {"shape": ["circle"]}}
    g = evaluate_grounding({"7": (tokens, att)}, only_shapes, kind="image", grid=(2, 2))
    assert g["words_evaluated"] == 1 and set(g["by_class"]) == {"shape"}
    assert word_classes_of(_image_grounding()) == IMAGE_CLASSES
    old = {k: v for k, v in _image_grounding().items() if k != "word_classes"}
    with pytest.raises(DataError, match="word_classes.*regenerate"):
        evaluate_grounding({"7": (tokens, att)}, old, kind="image", grid=(2, 2))


def test_grounding_on_generated_images_with_shared_colours():
    """On real generated layouts (colours and shapes shared across objects), attention on each
    named object's cell scores pointing 1; the colour/shape words are resolved by their neighbours."""
    from captioning.data.synthetic.shapes import WORD_CLASSES, render_image

    items, preds = {}, {}
    for i in range(6):
        _, objects, captions = render_image(i, seed=1)
        items[str(i)] = {"size": [224, 224], "objects": objects}
        tokens = captions[0].replace(",", " ").replace(":", " ").split()
        att = np.full((len(tokens), 49), 1e-3)
        by_pair = {(o["colour"], o["shape"]): o for o in objects}
        for t in range(len(tokens) - 1):  # "colour shape": both words look at the object's centre cell
            o = by_pair.get((tokens[t], tokens[t + 1]))
            if o is not None:
                cx, cy = o["center"]
                att[t:t + 2, int(cy // 32) * 7 + int(cx // 32)] = 1.0
        preds[str(i)] = (tokens, att)
    g = evaluate_grounding(preds, {"kind": "image", "word_classes": WORD_CLASSES, "items": items},
                           kind="image", grid=(7, 7))
    named = sum(2 * len(items[k]["objects"]) for k in items)
    assert g["words_evaluated"] == named and g["words_ambiguous"] == 0
    assert g["pointing_accuracy"] == 1.0
    assert 0.03 < g["chance_pointing_accuracy"] < 0.08


def test_evaluate_grounding_unobservable_when_cropped_away():
    grounding = {"kind": "image", "word_classes": IMAGE_CLASSES, "items": {"1": {"size": [8, 4], "objects": [
        {"box": [0, 0, 2, 4], "words": ["red", "circle"]}]}}}
    g = evaluate_grounding({1: (["red"], np.full((1, 4), 0.25))}, grounding, kind="image", grid=(2, 2),
                           geometry=Geometry(size=4))
    assert g["words_evaluated"] == 0 and g["words_unobservable"] == 1


def _video_grounding() -> dict:
    return {"kind": "video", "word_classes": VIDEO_CLASSES, "items": {"3": {"num_frames": 30, "events": [
        {"span": [0, 10], "words": ["red", "circle", "appears"]},
        {"span": [15, 25], "words": ["blue", "square", "turns", "green"]},
    ]}}}


def test_evaluate_grounding_video_with_padding():
    tokens = ["a", "red", "circle", "appears", "and", "then", "a", "blue", "square", "turns", "green"]
    frames = [2, 8, 17, 23, 29, 29]  # 5 real frames + 1 padded
    att = np.zeros((len(tokens), 6))
    att[:, 1] = 1.0  # every word looks at frame 8 (event 0)
    att[2] = [0.05, 0.1, 0, 0, 0, 0.85]  # circle: most mass on the padded frame, which is ignored
    g = evaluate_grounding({3: (tokens, att)}, _video_grounding(), kind="video",
                           frame_indices={3: frames}, valid={3: 5})
    assert g["words_evaluated"] == 7
    assert g["attention_in_object"] == pytest.approx(3 / 7)
    assert g["pointing_accuracy"] == pytest.approx(3 / 7)
    # 2 of the 5 valid sampled frames fall in either span
    assert g["chance_attention_in_object"] == pytest.approx(0.4)
    assert g["chance_pointing_accuracy"] == pytest.approx(0.4)
    assert g["by_class"]["verb"]["words_evaluated"] == 2
    assert g["by_class"]["verb"]["pointing_accuracy"] == pytest.approx(0.5)
    # without `valid`, the padded frame counts: circle's argmax is frame 29 -> a miss
    g2 = evaluate_grounding({3: (tokens, att)}, _video_grounding(), kind="video", frame_indices={3: frames})
    assert g2["pointing_accuracy"] == pytest.approx(2 / 7)
    assert g2["chance_attention_in_object"] == pytest.approx(2 / 6)


def test_evaluate_grounding_video_grid_features():
    frames = [5, 20]
    att = np.array([[0.1, 0.1, 0.4, 0.4]])  # K=2 frames x 2 cells, frame-major -> [0.2, 0.8]
    g = evaluate_grounding({"3": (["turns"], att)}, _video_grounding(), kind="video", grid=(1, 2),
                           frame_indices={"3": frames}, valid={"3": 4})
    assert g["attention_in_object"] == pytest.approx(0.8)
    assert g["pointing_accuracy"] == 1.0
    assert g["chance_attention_in_object"] == pytest.approx(0.5)


def test_evaluate_grounding_errors():
    with pytest.raises(ConfigError, match="grid"):
        evaluate_grounding({}, _image_grounding(), kind="image")
    with pytest.raises(ConfigError, match="frame_indices"):
        evaluate_grounding({}, _video_grounding(), kind="video")
    with pytest.raises(DataError, match="kind"):
        evaluate_grounding({}, _video_grounding(), kind="image", grid=(2, 2))
    with pytest.raises(DataError, match="positions"):
        evaluate_grounding({7: (["red"], np.ones((1, 9)))}, _image_grounding(), kind="image", grid=(2, 2))
