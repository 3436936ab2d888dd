"""Forced-choice probes: perturbations hand-checked on fixed captions, chance exactly where the
model cannot see the difference, the teacher-forced scorer against the decoders' own numbers,
and a COCO-format split with free-form captions through ``captioning-score``."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import run_cli

from captioning.data.tokenizer import tokenize
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError
from captioning.evaluation.probes import PROBES, ProbeItem, Question
from captioning.evaluation.probes.binding import binding, colour_swaps
from captioning.evaluation.probes.job import check_names
from captioning.evaluation.probes.order import order
from captioning.evaluation.probes.rules import attribute_swaps, relation_swaps
from captioning.evaluation.probes.run import credit, run_probes
from captioning.evaluation.probes.shuffle import KINDS, perturbations, shuffle
from captioning.models.decoders import DECODERS, CaptionDecoder, DecoderState, build_decoder
from captioning.models.ensemble import EnsembleDecoder
from captioning.models.likelihood import Candidate, caption_log_likelihoods
from captioning.models.search import greedy_decode

T = lambda s: tuple(s.split())  # noqa: E731


def obj(colour: str, shape: str) -> dict:
    return {"colour": colour, "shape": shape, "words": [colour, shape]}


def event(colour: str, shape: str) -> dict:
    return {"colour": colour, "shape": shape, "words": [colour, shape, "appears"]}


def shapes_item(caption: str, *objects: dict) -> ProbeItem:
    return ProbeItem("1", (T(caption),), {"objects": list(objects)}, {"colour": [], "shape": []})


# ------------------------------------------------------------------ perturbations, by hand


def test_binding_swaps_colours_between_two_objects():
    item = shapes_item("a red circle and a blue square", obj("red", "circle"), obj("blue", "square"))
    [q] = binding(item)
    assert q.perturbations == (T("a blue circle and a red square"),)
    # every swap would name a pair that is in the image (or one pair twice): nothing is asked
    three = shapes_item("a red circle , a blue square and a red square",
                        obj("red", "circle"), obj("blue", "square"), obj("red", "square"))
    assert colour_swaps(three) == [] and binding(three) == []
    four = shapes_item("a red circle a blue square a green star and a green circle", obj("red", "circle"),
                       obj("blue", "square"), obj("green", "star"), obj("green", "circle"))
    # (0, 2) would name the green circle that is there; (2, 3): same colour; (0, 3): same shape
    assert colour_swaps(four) == [(0, 1), (1, 2), (1, 3)]
    assert binding(four)[1].perturbations == (T("a red circle a green square a blue star and a green circle"),)


def test_binding_on_events_leaves_out_swaps_onto_a_distractor():
    g = {"events": [event("red", "circle"), event("blue", "square")], "distractors": []}
    item = ProbeItem("1", (T("a red circle appears and then a blue square appears"),), g)
    assert binding(item)[0].perturbations == (T("a blue circle appears and then a red square appears"),)
    g["distractors"] = [{"colour": "blue", "shape": "circle"}]
    assert binding(ProbeItem("1", item.references, g)) == []


def test_order_swaps_the_events_and_the_objects():
    g = {"events": [event("red", "circle"), event("blue", "square")]}
    refs = (T("a red circle appears and then a blue square appears"), T("a blue square appears after a red circle appears"))
    qs = order(ProbeItem("7", refs, g))
    assert [q.perturbations for q in qs] == [(T("a blue square appears and then a red circle appears"),),
                                             (T("a red circle appears after a blue square appears"),)]
    item = shapes_item("a red circle , a blue square and a green star",
                       obj("red", "circle"), obj("blue", "square"), obj("green", "star"))
    assert [" ".join(q.perturbations[0]) for q in order(item)] == [
        "a blue square , a red circle and a green star",
        "a green star , a blue square and a red circle",
        "a red circle , a green star and a blue square"]


def test_a_reference_that_does_not_name_an_entity_asks_nothing_about_it():
    item = ProbeItem("1", (T("a red circle appears"),), {"events": [event("red", "circle"), event("blue", "square")]})
    assert order(item) == [] and binding(item) == []


def test_shuffles_are_aro_perturbations_drawn_the_same_every_time():
    ref = T("there is a red circle a blue square and a green star")  # four trigrams
    item = ProbeItem("42", (ref,), {"objects": []}, {"colour": ["red", "blue", "green"],
                                                    "shape": ["circle", "square", "star"]})
    p = perturbations(item, 0)
    assert len(p) == 4 and ref not in p and p == perturbations(item, 0)
    content = {k for k, w in enumerate(ref) if w in {"red", "blue", "green", "circle", "square", "star"}}
    by_kind = dict(zip(KINDS, p, strict=True))
    moved = {k for k in range(len(ref)) if by_kind[KINDS[0]][k] != ref[k]}
    assert moved <= content and Counter(by_kind[KINDS[0]]) == Counter(ref)  # content words among themselves
    assert all(by_kind[KINDS[1]][k] == ref[k] for k in content)  # the other words among themselves
    grams = [ref[k: k + 3] for k in range(0, len(ref), 3)]
    out = by_kind[KINDS[2]]
    assert sorted(out[k: k + 3] for k in range(0, len(out), 3)) == sorted(grams)  # whole trigrams moved
    inside = by_kind[KINDS[3]]
    assert [Counter(inside[k: k + 3]) for k in range(0, len(ref), 3)] == [Counter(g) for g in grams]
    assert len(shuffle(ProbeItem("1", (T("a red circle"),), None, {"colour": ["red"], "shape": ["circle"]}))[0]
               .perturbations) == 2  # one other word and one trigram: those shuffles cannot change it


def test_free_form_rules_by_hand():
    assert attribute_swaps(T("a white dog chasing a brown cat")) == [T("a brown dog chasing a white cat")]
    assert attribute_swaps(T("a white dog next to a white cat")) == []  # the same attribute
    assert relation_swaps(T("a man riding a horse on the beach")) == [
        T("a horse riding a man on the beach"), T("a man riding the beach on a horse")]
    assert relation_swaps(T("a cat is sitting on a red couch")) == [T("a red couch is sitting on a cat")]
    assert relation_swaps(T("people walking down a street")) == []
    item = ProbeItem("1", (T("a white dog chasing a brown cat"),))
    assert binding(item)[0].kind == "attribute swap (rules)"
    assert order(item)[0].perturbations == (T("a brown cat chasing a white dog"),)


def test_ties_are_split():
    assert credit([-1.0, -2.0, -3.0]) == 1.0 and credit([-2.0, -1.0]) == 0.0
    assert credit([-1.0, -1.0, -1.0, -2.0]) == pytest.approx(1 / 3)


# ------------------------------------------------------------------ chance, exactly


class Uniform(CaptionDecoder):
    """Ignores the image and the words: every word has probability 1/V."""

    def init_state(self, features, mask):
        return DecoderState({"h": torch.zeros(features.shape[0], 1)}, {})

    def step(self, prev_tokens, state):
        return torch.log_softmax(torch.zeros(len(prev_tokens), self.vocab_size), -1), None, state


ITEMS = [
    ProbeItem("1", (T("a red circle and a blue square"), T("a blue square to the right of a red circle")),
              {"objects": [obj("red", "circle"), obj("blue", "square")]}, {"colour": ["red", "blue"], "shape": ["circle", "square"]}),
    ProbeItem("2", (T("a green star , a red square and a blue circle"),),
              {"objects": [obj("green", "star"), obj("red", "square"), obj("blue", "circle")]},
              {"colour": ["red", "blue", "green"], "shape": ["circle", "square", "star"]}),
]


def _vocab(items) -> Vocabulary:
    return Vocabulary.build([list(r) for it in items for r in it.references], min_count=1)


def test_a_model_that_ignores_the_image_and_the_words_scores_chance_exactly():
    vocab = _vocab(ITEMS)
    feats = torch.zeros(len(ITEMS), 3, 4)
    results = run_probes(["binding", "order", "shuffle"], Uniform(None, len(vocab), 4), vocab, ITEMS,
                         lambda rows: (feats[rows], torch.ones(len(rows), 3, dtype=torch.bool)))
    for name in ("binding", "order", "shuffle"):
        s = results[name].summary()
        assert s["accuracy"] == s["chance"] and s["items"] >= 1, name
    assert results["order"].summary()["chance"] == 0.5 and results["shuffle"].summary()["chance"] == 0.2


def test_mean_pooling_over_time_reversed_frames_is_at_chance_exactly_on_order():
    """Videos 2k and 2k+1 of moving_shapes show the same frames in reverse order; mean pooling sees
    the same vector, so whichever order it prefers is right for one video and wrong for the other."""
    a, b = event("red", "circle"), event("blue", "square")
    items = [ProbeItem("0", (T("a red circle appears and then a blue square appears"),), {"events": [a, b]}),
             ProbeItem("1", (T("a blue square appears and then a red circle appears"),), {"events": [b, a]})]
    vocab = _vocab(items)
    torch.manual_seed(0)
    decoder = build_decoder({"name": "lstm", "variant": "mean_pool", "hidden_dim": 16, "embed_dim": 8},
                            len(vocab), 6, (8,))
    frames = torch.randn(8, 6)
    feats = torch.stack([frames, frames.flip(0)])
    result = run_probes(["order"], decoder, vocab, items, lambda rows: (feats[rows], torch.ones(len(rows), 8, dtype=torch.bool)))
    s = result["order"].summary()
    assert s["accuracy"] == 0.5 and s["chance"] == 0.5 and s["per_item"]["0"][1] + s["per_item"]["1"][1] == 1.0


# ------------------------------------------------------------------ the scorer


def _decoders():
    out = []
    for entry in DECODERS:
        for cfg in entry.obj.examples():
            torch.manual_seed(0)
            out.append(pytest.param(cfg, id=f"{cfg['name']}-{cfg.get('variant', '')}"))
    return out


@pytest.mark.parametrize("cfg", _decoders())
def test_teacher_forced_scores_equal_the_decoders_teacher_forced_loss(cfg):
    torch.manual_seed(0)
    dec = build_decoder(cfg, 11, 8, (2, 3)).eval()
    feats, mask = torch.randn(3, 6, 8), torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    caps = [(0, (4, 5, 6)), (1, (7, 4)), (2, (8, 9, 10, 4, 5)), (0, (6,))]
    scored = caption_log_likelihoods(dec, feats, mask, [Candidate(i, c) for i, c in caps], bos=1, eos=2, max_rows=3)
    for (i, ids), (total, n) in zip(caps, scored, strict=True):
        tokens = torch.tensor([[1, *ids, 2]])
        with torch.no_grad():
            xe = dec.compute_loss(feats[i: i + 1], mask[i: i + 1], tokens)["xe"]
        assert n == len(ids) + 1 and total == pytest.approx(-float(xe) * n, abs=1e-4)


def _favour_eos(decoder, eos: int) -> None:
    """Raise the <eos> logit so that a random decoder ends its greedy captions."""
    with torch.no_grad():
        for m in decoder.modules():
            if isinstance(m, torch.nn.Linear) and m.out_features == decoder.vocab_size and m.bias is not None:
                m.bias[eos] += 2.5


@pytest.mark.parametrize("kind", ["soft_attention", "transformer", "ensemble"])
def test_teacher_forced_scores_equal_greedy_search_log_probs_of_its_own_captions(kind):
    torch.manual_seed(1)

    def make():
        cfg = {"name": "transformer", "d_model": 16, "num_heads": 2, "num_layers": 1, "ff_dim": 32} \
            if kind == "transformer" else {"name": "lstm", "variant": "soft_attention", "hidden_dim": 16,
                                            "embed_dim": 8, "attention_dim": 8}
        d = build_decoder(cfg, 12, 8, (2, 3)).eval()
        _favour_eos(d, 2)
        return d

    dec = EnsembleDecoder([make(), make()]).eval() if kind == "ensemble" else make()
    feats = torch.randn(5, 6, 8)
    hyps = greedy_decode(dec, feats, None, max_length=25, bos=1, eos=2)
    done = [(i, h) for i, h in enumerate(hyps) if h.finished]
    assert done
    scored = caption_log_likelihoods(dec, feats, None, [Candidate(i, tuple(h.tokens)) for i, h in done], 1, 2)
    for (_, h), (total, n) in zip(done, scored, strict=True):
        assert n == len(h.tokens) + 1 and total == pytest.approx(h.log_prob, abs=1e-5)


# ------------------------------------------------------------------ free-form captions through the CLI

FREE_FORM = ["a white dog chasing a brown cat on the grass", "a man riding a horse on the beach",
             "a red bus parked next to a white car", "people walking down a busy street",
             "a cat is sitting on a red couch", "a small boy holding a large kite"]


def test_captioning_score_probes_a_coco_format_split_with_free_form_captions(tmp_path):
    from dataclasses import asdict

    from test_caption_cli import save_checkpoint

    from captioning.config import DataConfig
    from captioning.store.writer import FeatureStoreWriter

    rng = np.random.default_rng(0)
    meta = {"settings": {"backbone": "synthetic", "weights": "none"}, "kind": "image", "positions": 4, "dim": 8,
            "grid": [2, 2], "dtype": "float16"}
    writer = FeatureStoreWriter(tmp_path / "features", meta, shard_size=8)
    anns = []
    for i, caption in enumerate(FREE_FORM, start=1):
        writer.add(str(i), rng.normal(size=(4, 8)).astype(np.float32))
        anns.append({"id": i, "image_id": i, "caption": caption})
    writer.close()
    ann = tmp_path / "captions_test.json"
    ann.write_text(json.dumps({"images": [{"id": i} for i in range(1, 7)], "annotations": anns}))
    vocab = Vocabulary.build([tokenize(c) for c in FREE_FORM], min_count=1).to_dict()
    ckpt = save_checkpoint(tmp_path / "m.ckpt", meta, vocab, asdict(DataConfig()), tmp_path / "features")
    out = tmp_path / "probes.json"
    proc = run_cli("score", f"ckpt_path={ckpt}", f"annotations={ann}", "probes=[binding,order,shuffle]",
                   f"output={out}")
    assert "probe binding: accuracy" in proc.stdout and "of 6 items perturbed" in proc.stdout
    probes = json.loads(out.read_text())["probes"]
    assert {n: (p["items"], p["items_total"]) for n, p in probes.items()} == {
        "binding": (3, 6), "order": (5, 6), "shuffle": (6, 6)}  # dog/cat, bus/car, boy/kite; all but "people walking"
    asked = {tuple(q["candidates"]) for q in probes["binding"]["questions_asked"]}
    assert ("a white dog chasing a brown cat on the grass", "a brown dog chasing a white cat on the grass") in asked
    assert all(0 <= p["accuracy"] <= 1 for p in probes.values())
    with pytest.raises(ConfigError, match="probes='colour' is not a registered probe; use one of binding, order"):
        check_names(["binding", "colour"])


def test_every_registered_probe_returns_questions():
    for name in PROBES.names():
        qs = PROBES.get(name)(ITEMS[1])
        assert qs and all(isinstance(q, Question) and q.reference not in q.perturbations for q in qs), name
