"""Test-time ensembles: the mean of the members' word distributions inside the same batched
(diverse) beam search; loading and refusing members; ``captioning-evaluate ckpt_path=[...]`` and
``Captioner.from_checkpoint([...])``."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from conftest import make_tiny_image_dataset, run_cli
from test_caption_cli import save_checkpoint

from captioning.config import DataConfig, TrainerConfig
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError
from captioning.evaluation.job import EvaluateConfig, evaluate
from captioning.models.decoders import build_decoder
from captioning.models.ensemble import EnsembleDecoder
from captioning.models.search import DecodeConfig, beam_search, decode_batch
from captioning.predictions import read_predictions
from captioning.store.feature_store import FeatureStore
from captioning.train.checkpoint import load_captioner, load_ensemble

PAD, BOS, EOS, UNK = 0, 1, 2, 3
C, N, V = 5, 4, 11


def _decoder(seed: int, variant: str = "soft_attention", scale: float = 2.0):
    torch.manual_seed(seed)
    dec = build_decoder(dict(variant=variant, embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0), V, C)
    with torch.no_grad():
        dec.out_vocab.weight.mul_(scale)
    return dec.eval()


def _feats(b: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, N, dtype=torch.bool)
    mask[1, 2:] = False
    return torch.randn(b, N, C, generator=g), mask


@pytest.mark.parametrize("cfg", [DecodeConfig(beam_size=3, max_length=7, n_best=3),
                                 DecodeConfig(beam_size=1, max_length=7),
                                 DecodeConfig(beam_size=4, groups=2, diversity_strength=0.7, max_length=7, n_best=4,
                                            length_penalty="gnmt")])
def test_ensemble_of_one_is_that_decoder_exactly(cfg: DecodeConfig) -> None:
    """logsumexp of one log-prob is that log-prob and log 1 = 0: the same words, the same scores
    and the same attention, bit for bit (beam search, greedy, diverse beam search)."""
    dec = _decoder(0)
    feats, mask = _feats()
    alone = decode_batch(dec, feats, mask, cfg, BOS, EOS, UNK)
    ensembled = decode_batch(EnsembleDecoder([dec]), feats, mask, cfg, BOS, EOS, UNK)
    for a, b in zip(alone, ensembled, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == [h.score for h in b]
        assert [h.log_prob for h in a] == [h.log_prob for h in b]
        for ha, hb in zip(a, b, strict=True):
            assert torch.equal(ha.attention, hb.attention)


def test_ensemble_step_is_the_mean_distribution_and_mean_attention() -> None:
    """One step of 3 members by hand (float64): p = (p1 + p2 + p3) / 3, alpha = the mean alpha;
    a member without attention (show_tell) leaves the mean to those with attention."""
    members = [_decoder(1), _decoder(2, variant="hard_attention"), _decoder(3, variant="show_tell")]
    feats, mask = _feats(2, seed=1)
    prev = torch.tensor([BOS, BOS])
    outs = [m.step(prev, m.init_state(feats, mask)) for m in members]
    ens = EnsembleDecoder(members)
    lp, alpha, _ = ens.step(prev, ens.init_state(feats, mask))
    want = torch.log(sum(o[0].double().exp() for o in outs) / 3)
    torch.testing.assert_close(lp.double(), want, atol=1e-6, rtol=0)
    torch.testing.assert_close(alpha, (outs[0][1] + outs[1][1]) / 2)
    assert outs[2][1] is None
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(2))  # still a distribution
    assert not ens.hard_attention and EnsembleDecoder([members[1]]).hard_attention


def test_ensemble_beam_search_reindexes_every_member() -> None:
    """Batched == item by item over an ensemble of two different decoders: the members' states are
    reordered, pruned and shared together."""
    ens = EnsembleDecoder([_decoder(4, scale=1.5), _decoder(5, scale=1.5)])
    feats, mask = _feats(5, seed=2)
    mask[3, 1:] = False
    cfg = DecodeConfig(beam_size=3, max_length=8, n_best=2, length_penalty="gnmt")
    batched = beam_search(ens, feats, mask, cfg, BOS, EOS, UNK)
    for i in range(5):
        single = beam_search(ens, feats[i:i + 1], mask[i:i + 1], cfg, BOS, EOS, UNK)[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in single]
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in single], abs=1e-4)


def test_ensemble_of_two_copies_is_the_decoder() -> None:
    dec = _decoder(6)
    feats, mask = _feats(seed=3)
    cfg = DecodeConfig(beam_size=3, max_length=7)
    one = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    two = beam_search(EnsembleDecoder([dec, dec]), feats, mask, cfg, BOS, EOS, UNK)
    assert [h[0].tokens for h in one] == [h[0].tokens for h in two]
    assert [h[0].score for h in one] == pytest.approx([h[0].score for h in two], abs=1e-5)  # log((p+p)/2)


# ------------------------------------------------------------------ checkpoints and the jobs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """The conftest's tiny dataset (its test split named as COCO val2014 images) and 3 untrained
    checkpoints (seeds 0, 1, 2) over its FeatureStore, plus one with another vocabulary."""
    tmp = tmp_path_factory.mktemp("ensemble")
    d = make_tiny_image_dataset(tmp / "tiny")
    root = d["root"]
    ann = root / "annotations" / "captions_test.json"
    test = json.loads(ann.read_text())
    for im in test["images"]:
        im["file_name"] = f"COCO_val2014_{im['id']:012d}.jpg"
    ann.write_text(json.dumps(test))
    data = asdict(DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                             annotations={s: str(root / "annotations" / f"captions_{s}.json")
                                          for s in ("train", "val", "test")}, num_workers=0))
    meta = dict(FeatureStore.open(d["features_dir"]).meta)
    words = ["a", "red", "green", "blue", "circle", "square", "triangle", "there", "is", "."]
    vocab = Vocabulary.build([words], min_count=1).to_dict()
    ckpts = []
    for seed in range(3):  # <run>/checkpoints/best.ckpt, as captioning-train writes them
        (tmp / f"run{seed}" / "checkpoints").mkdir(parents=True)
        ckpts.append(save_checkpoint(tmp / f"run{seed}" / "checkpoints" / "best.ckpt", meta, vocab, data,
                                     d["features_dir"], seed=seed))
    other = save_checkpoint(tmp / "other.ckpt", meta, Vocabulary.build([words[:6]], min_count=1).to_dict(), data,
                            d["features_dir"])
    return {**d, "tmp": tmp, "ckpts": ckpts, "other": other, "meta": meta}


def _evaluate(ckpt, out: Path, **kw) -> dict:
    cfg = EvaluateConfig(ckpt_path=ckpt, split="test", decode=DecodeConfig(beam_size=3, max_length=6),
                         trainer=TrainerConfig(accelerator="cpu", enable_progress_bar=False),
                         output_dir=None if out is None else str(out),
                         metrics=["bleu", "cider"], num_workers=0, **kw)
    return evaluate(cfg)


def test_evaluate_an_ensemble_of_one_equals_the_checkpoint(tiny) -> None:
    a = _evaluate(str(tiny["ckpts"][0]), tiny["tmp"] / "one")
    b = _evaluate([str(tiny["ckpts"][0])], tiny["tmp"] / "one_list")
    read = lambda s: json.loads(Path(s["output_dir"], "predictions.json").read_text())  # noqa: E731
    assert read(a) == read(b)
    assert a["metrics"] == b["metrics"]


def test_evaluate_three_checkpoints_writes_the_ensemble_beside_the_first_run(tiny) -> None:
    summary = _evaluate(list(map(str, tiny["ckpts"])), None)
    out = Path(summary["output_dir"])
    assert out == tiny["ckpts"][0].resolve().parent.parent / "eval" / "ensemble3-test-beam3"
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["checkpoint"] == list(map(str, tiny["ckpts"]))
    preds = read_predictions(out / "predictions.json")
    assert len(preds) == len(tiny["splits"]["test"])
    for p in preds:  # the members' mean attention: still a distribution over the 4 regions
        assert all(abs(sum(row) - 1) < 1e-3 for row in p["attention"])


def test_ensemble_members_must_share_vocabulary_and_features(tiny, tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"ensemble: .*other\.ckpt has a different vocabulary .* than .*best\.ckpt"):
        load_ensemble([tiny["ckpts"][0], tiny["other"]])
    meta = {**tiny["meta"], "settings": {**tiny["meta"]["settings"], "backbone": "another"}}
    model = load_captioner(tiny["ckpts"][1])
    moved = save_checkpoint(tmp_path / "moved.ckpt", meta, dict(model.hparams["vocab"]), {}, tiny["features_dir"])
    with pytest.raises(ConfigError, match=r"moved\.ckpt reads other features than .*best\.ckpt"):
        load_ensemble([tiny["ckpts"][0], moved])
    with pytest.raises(ConfigError, match="ckpt_path"):
        _evaluate([], tmp_path / "none")


def test_captioner_from_several_checkpoints(tiny) -> None:
    from captioning import Captioner

    feats = torch.randn(3, 4, 16)
    one = Captioner.from_checkpoint(tiny["ckpts"][0], device="cpu").caption_features(feats, beam_size=3)
    listed = Captioner.from_checkpoint([tiny["ckpts"][0]], device="cpu").caption_features(feats, beam_size=3)
    assert [r.caption for r in one] == [r.caption for r in listed]
    assert [r.score for r in one] == [r.score for r in listed]
    three = Captioner.from_checkpoint(tiny["ckpts"], device="cpu")
    results = three.caption_features(feats, decode=replace(DecodeConfig(), beam_size=4, groups=2, n_best=4))
    for r in results:
        assert r.ok and abs(r.attention.sum(-1) - 1).max() < 1e-5
        assert len(r.nbest) >= 2 and r.nbest[0] == (r.caption, r.score)
        assert len({c for c, _ in r.nbest}) == len(r.nbest)


@pytest.mark.slow
def test_cli_ensemble_and_server_file(tiny, tmp_path) -> None:
    """``captioning-evaluate ckpt_path=[a,b,c] server=coco``: Hydra's list, the ensemble's folder,
    the server file of the val2014-named test split."""
    paths = ",".join(map(str, tiny["ckpts"]))
    run_cli("evaluate", f"ckpt_path=[{paths}]", "split=test", "decode.beam_size=2", "server=coco",
            f"output_dir={tmp_path}/ens", "metrics=[bleu,cider]", "num_workers=0", f"hydra.run.dir={tmp_path}/h",
            "trainer.enable_progress_bar=false")
    server_file = tmp_path / "ens" / "captions_val2014_run0-ensemble3_results.json"
    entries = json.loads(server_file.read_text())
    assert sorted(e["image_id"] for e in entries) == sorted(tiny["splits"]["test"])  # every val2014 image of the data


def test_evaluation_reads_each_checkpoint_once_and_records_every_members_run(tiny, monkeypatch) -> None:
    from captioning.train.checkpoint import checkpoint_run

    reads: list[str] = []
    load = torch.load

    def counting_load(f, *args, **kwargs):
        reads.append(str(f))
        return load(f, *args, **kwargs)

    expected = [checkpoint_run(p) for p in tiny["ckpts"]]
    monkeypatch.setattr(torch, "load", counting_load)
    summary = _evaluate(list(map(str, tiny["ckpts"])), tiny["tmp"] / "once")
    assert sorted(reads) == sorted(map(str, tiny["ckpts"]))  # one read per member
    provenance = json.loads((Path(summary["output_dir"]) / "provenance.json").read_text())
    assert provenance["checkpoints"] == expected and "run" not in provenance  # an ensemble is no one run
    assert [r["checkpoint"] for r in provenance["checkpoints"]] == list(map(str, tiny["ckpts"]))
