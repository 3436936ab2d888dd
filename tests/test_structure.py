"""Structured accuracy (binding, left-to-right order, event order) on hand-made captions with
hand-computed values and chance levels, and on the generators' own references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from captioning.errors import DataError
from captioning.evaluation.structure import (
    binding_chance,
    evaluate_structure,
    named_pairs,
    permanent,
    relations_chance,
)

COLOURS = ["red", "blue", "green"]
SHAPES = ["circle", "square", "star"]


def _image_file(objects: list[tuple[str, str]], n_items: int = 1) -> dict:
    """One image per key "0".."n-1", objects given left to right."""
    objs = [{"colour": c, "shape": s, "rank": r, "words": [c, s], "box": [0, 0, 1, 1]}
            for r, (c, s) in enumerate(objects)]
    return {"kind": "image", "word_classes": {"colour": COLOURS, "shape": SHAPES},
            "items": {str(k): {"size": [4, 4], "objects": objs} for k in range(n_items)}}


# left to right: a red circle, a blue square, a red square
SCENE = [("red", "circle"), ("blue", "square"), ("red", "square")]
CASES = [  # caption, binding, binding chance, order (None: not scored), order chance, recall, exact
    ("a red circle, a blue square and a red square", 1, 2 / 3, 1, 1 / 6, 1, 1),
    ("a blue circle and a red square", 0, 1 / 2, None, None, 1 / 3, 0),  # swapped binding
    ("a red square, a blue square and a red circle", 1, 2 / 3, 0, 1 / 6, 1, 0),  # reversed order
    ("a red circle, a green star and a blue square", 0, 0, 1, 1 / 2, 2 / 3, 0),  # hallucinated object
    ("", 0, 0, None, None, 0, 0),  # empty caption
    ("a red circle and a red circle", 1, 1, 0, 0, 1 / 3, 0),  # the same object twice
]


def test_permanent_and_chance_hand_computed():
    assert permanent(np.array([[1, 2], [3, 4]])) == pytest.approx(10)
    assert permanent(np.ones((3, 3))) == pytest.approx(6)
    assert permanent(np.eye(3)) == pytest.approx(1)
    assert permanent(np.zeros((0, 0))) == 1
    existing = set(SCENE)
    # colours [red, blue, red] x shapes [circle, square, square]: blue must take a square (2 ways),
    # the reds take the rest in either order (2 ways): 4 of 3! = 6 permutations
    assert binding_chance(SCENE, existing) == pytest.approx(4 / 6)
    assert binding_chance([], existing) == 0
    # three events / relations up, down: 132 and 231 of 3! orders
    assert relations_chance([0, 1, 2], [True, False]) == pytest.approx(2 / 6)
    assert relations_chance([0, 1, 2], [True, True]) == pytest.approx(1 / 6)
    assert relations_chance([5, 2], [False]) == 0.5


def test_named_pairs_need_adjacent_colour_and_shape():
    tokens = "a red circle , the blue big square and green".split()
    assert named_pairs(tokens, COLOURS, SHAPES) == [("red", "circle")]


@pytest.mark.parametrize("case", CASES, ids=["correct", "swapped", "reversed", "hallucinated", "empty", "repeated"])
def test_image_caption_hand_computed(case):
    caption, binding, b_chance, order, o_chance, recall, exact = case
    r = evaluate_structure({0: caption}, _image_file(SCENE))
    assert r["captions"] == 1 and r["items"] == 1 and r["items_missing"] == 0
    assert r["binding_accuracy"] == binding
    assert r["chance_binding_accuracy"] == pytest.approx(b_chance)
    if order is None:
        assert r["captions_ordered"] == 0 and r["order_accuracy"] is None and r["chance_order_accuracy"] is None
    else:
        assert r["captions_ordered"] == 1 and r["order_accuracy"] == order
        assert r["chance_order_accuracy"] == pytest.approx(o_chance)
    assert r["object_recall"] == pytest.approx(recall)
    assert r["exact_accuracy"] == exact


def test_image_aggregate_hand_computed():
    preds = {k: c[0] for k, c in enumerate(CASES)}
    preds[4] = []  # the empty caption as an empty token list
    preds[99] = "a red circle"  # not in the file
    r = evaluate_structure(preds, _image_file(SCENE, n_items=len(CASES)))
    assert r["items"] == 6 and r["items_missing"] == 1
    assert r["binding_accuracy"] == pytest.approx(3 / 6)
    assert r["chance_binding_accuracy"] == pytest.approx((2 / 3 + 1 / 2 + 2 / 3 + 0 + 0 + 1) / 6)
    assert r["captions_ordered"] == 4  # correct, reversed, hallucinated, repeated
    assert r["order_accuracy"] == pytest.approx(2 / 4)
    assert r["chance_order_accuracy"] == pytest.approx((1 / 6 + 1 / 6 + 1 / 2 + 0) / 4)
    assert r["object_recall"] == pytest.approx((1 + 1 / 3 + 1 + 2 / 3 + 0 + 1 / 3) / 6)
    assert r["pairs_named"] == 13 and r["pair_precision"] == pytest.approx(11 / 13)
    assert r["exact_accuracy"] == pytest.approx(1 / 6)
    assert set(r["by_count"]) == {"3"} and r["by_count"]["3"]["binding_accuracy"] == pytest.approx(0.5)


def test_two_object_relation_and_by_count():
    two = _image_file([("green", "star"), ("green", "circle")])
    three = _image_file(SCENE)
    grounding = {**two, "items": {"a": two["items"]["0"], "b": three["items"]["0"]}}
    r = evaluate_structure({"a": "a green star to the left of a green circle",
                            "b": "a red square and a blue square"}, grounding)
    assert r["by_count"]["2"]["order_accuracy"] == 1 and r["by_count"]["2"]["exact_accuracy"] == 1
    assert r["by_count"]["2"]["chance_binding_accuracy"] == 1  # both green: any re-pairing exists
    assert r["by_count"]["3"]["order_accuracy"] == 0 and r["by_count"]["3"]["object_recall"] == pytest.approx(2 / 3)
    assert r["order_accuracy"] == pytest.approx(0.5) and r["chance_order_accuracy"] == pytest.approx(0.5)


def _video_file() -> dict:
    events = [{"words": ["red", "circle", "appears"], "rank": 0, "span": [2, 8]},
              {"words": ["blue", "square", "turns", "green"], "rank": 1, "span": [12, 18]}]
    return {"kind": "video", "word_classes": {"colour": COLOURS, "shape": SHAPES, "verb": ["appears", "turns"]},
            "reverse_order_words": ["after"], "items": {f"video{k}": {"num_frames": 20, "events": events}
                                                        for k in range(9)}}


VIDEO_CASES = [  # caption, order correct, chance, recall
    ("a red circle appears and then the blue square turns green", 1, 0.5, 1),
    ("the blue square turns green after a red circle appears", 1, 0.5, 1),
    ("after a red circle appears, the blue square turns green", 1, 0.5, 1),
    ("the blue square turns green and then a red circle appears", 0, 0.5, 1),  # reversed
    ("a red circle appears after the blue square turns green", 0, 0.5, 1),  # "after" reverses: wrong
    ("a red circle appears", 0, 0, 0.5),  # one event missing
    ("a red circle appears and then a red circle appears", 0, 0, 0.5),  # the same event twice
    ("a red circle appears and then the blue square turns red", 0, 0, 0.5),  # wrong colour: no match
    ("", 0, 0, 0),
]


def test_video_event_order_hand_computed():
    preds = {f"video{k}": c[0] for k, c in enumerate(VIDEO_CASES)}
    r = evaluate_structure(preds, _video_file())
    assert r["kind"] == "video" and r["items"] == 9 and r["captions_ordered"] == 9
    assert r["event_order_accuracy"] == pytest.approx(3 / 9)
    assert r["chance_event_order_accuracy"] == pytest.approx(5 * 0.5 / 9)
    assert r["captions_all_named"] == 5
    assert r["order_accuracy_all_named"] == pytest.approx(3 / 5)
    assert r["chance_order_accuracy_all_named"] == pytest.approx(0.5)
    assert r["event_recall"] == pytest.approx(sum(c[3] for c in VIDEO_CASES) / 9)
    for k, (caption, order, chance, recall) in enumerate(VIDEO_CASES):
        one = evaluate_structure({f"video{k}": caption}, _video_file())
        assert (one["event_order_accuracy"], one["chance_event_order_accuracy"], one["event_recall"]) == (
            order, chance, recall), caption


def test_missing_metadata_is_a_clear_error():
    old = {k: v for k, v in _image_file(SCENE).items() if k != "word_classes"}
    with pytest.raises(DataError, match="word_classes.colour.*regenerate"):
        evaluate_structure({0: "a red circle"}, old)
    old_video = {k: v for k, v in _video_file().items() if k != "reverse_order_words"}
    with pytest.raises(DataError, match="reverse_order_words"):
        evaluate_structure({"video0": "a red circle appears"}, old_video)
    broken = _image_file(SCENE)
    del broken["items"]["0"]["objects"][0]["rank"]
    with pytest.raises(DataError, match="item 0 lacks 'rank'"):
        evaluate_structure({0: "a red circle"}, broken)


def test_generated_references_score_perfectly_and_partners_fail():
    """The generators' own captions are correct by every metric; a video's caption on its
    time-reversed partner gets every order wrong (same events, opposite order)."""
    from captioning.data.synthetic.moving_shapes import REVERSE_ORDER_WORDS, render_video
    from captioning.data.synthetic.moving_shapes import WORD_CLASSES as VIDEO_CLASSES
    from captioning.data.synthetic.shapes import WORD_CLASSES, render_image

    items, captions = {}, {}
    for i in range(12):
        _, objects, caps = render_image(i, seed=5)
        items[str(i)], captions[str(i)] = {"objects": objects}, caps
    grounding = {"kind": "image", "word_classes": WORD_CLASSES, "items": items}
    for j in range(5):
        r = evaluate_structure({k: c[j] for k, c in captions.items()}, grounding)
        assert r["binding_accuracy"] == r["order_accuracy"] == r["object_recall"] == r["exact_accuracy"] == 1.0
        assert r["pair_precision"] == 1.0 and r["captions_ordered"] == 12
        assert 0 < r["chance_binding_accuracy"] < 1 and 0 < r["chance_order_accuracy"] <= 0.5

    items, captions = {}, {}
    for i in range(8):
        _, entry, caps = render_video(i, seed=5, frames=16, size=32)
        items[f"v{i}"], captions[f"v{i}"] = entry, caps
    grounding = {"kind": "video", "word_classes": VIDEO_CLASSES, "reverse_order_words": list(REVERSE_ORDER_WORDS),
                 "items": items}
    for j in range(5):
        own = evaluate_structure({k: c[j] for k, c in captions.items()}, grounding)
        assert own["event_order_accuracy"] == own["event_recall"] == 1.0
        assert own["chance_event_order_accuracy"] == 0.5
        partner = evaluate_structure({f"v{i ^ 1}": captions[f"v{i}"][j] for i in range(8)}, grounding)
        assert partner["event_order_accuracy"] == 0.0 and partner["event_recall"] == 1.0
    assert math.isclose(own["by_count"]["2"]["event_order_accuracy"], 1.0)
