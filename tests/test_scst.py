"""Sampling decoders and self-critical sequence training: hand-made cases and the reward."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import make_tiny_image_dataset, run_cli

from captioning.errors import ConfigError
from captioning.metrics.cider import CiderD
from captioning.models.decoders import build_decoder
from captioning.models.search import (
    DecodeConfig,
    decode_batch,
    filter_log_probs,
    greedy_decode,
    sample,
)
from captioning.train.scst import ScstConfig, leave_one_out_baseline, scst_surrogate

PAD, BOS, EOS, UNK = 0, 1, 2, 3
V, C = 9, 5


def _decoder(seed: int = 0):
    torch.manual_seed(seed)
    dec = build_decoder({"embed_dim": 8, "hidden_dim": 16, "attention_dim": 8, "dropout": 0.0}, V, C).eval()
    with torch.no_grad():
        dec.out_vocab.weight.mul_(3.0)
    return dec


def _feats(b: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, 4, C, generator=torch.Generator().manual_seed(seed))


def test_filter_log_probs_hand_computed() -> None:
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = filter_log_probs(lp, top_k=2).exp()
    torch.testing.assert_close(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    nucleus = filter_log_probs(lp, top_p=0.8).exp()  # 0.5 + 0.3 reaches 0.8: two tokens
    torch.testing.assert_close(nucleus, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    nucleus = filter_log_probs(lp, top_p=0.81).exp()  # needs the third token too
    torch.testing.assert_close(nucleus, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    hot = filter_log_probs(lp, temperature=0.5).exp()  # p^2 renormalised
    p2 = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    torch.testing.assert_close(hot, (p2 / p2.sum()).unsqueeze(0))


def test_samples_respect_the_constraints_and_their_log_probs() -> None:
    dec = _decoder()
    feats = _feats()
    g = torch.Generator().manual_seed(0)
    drawn = sample(dec, feats, None, n=4, max_length=5, bos=BOS, eos=EOS, banned=[PAD, BOS, UNK],
                   min_length=2, generator=g)
    assert drawn.tokens.shape[0] == 12 and drawn.finished.all()
    words = drawn.words(EOS)
    assert all(2 <= len(w) <= 5 for w in words)
    assert not any(t in (PAD, BOS, UNK, EOS) for w in words for t in w)
    # each row's log-prob = the step-by-step log-prob of its tokens under the model, renormalised
    # over the tokens it was allowed to draw
    with torch.no_grad():
        for r in (0, 5, 11):
            state = dec.init_state(feats[r // 4: r // 4 + 1], None)
            prev, total = torch.tensor([BOS]), 0.0
            for t, tok in enumerate([*words[r], EOS]):
                lp, _, state = dec.step(prev, state)
                allowed = torch.ones(V, dtype=torch.bool)
                allowed[[PAD, BOS, UNK]] = False
                if t < 2:
                    allowed[EOS] = False
                if t >= 5:
                    allowed[:] = False
                    allowed[EOS] = True
                total += float(lp[0, tok] - torch.logsumexp(lp[0][allowed], 0))
                prev = torch.tensor([tok])
            assert float(drawn.log_probs[r].sum()) == pytest.approx(total, abs=1e-5)


def test_sampling_is_seeded_top_k_one_is_greedy_and_hypotheses_are_sorted() -> None:
    dec = _decoder(1)
    feats = _feats(3, 1)
    cfg = DecodeConfig(strategy="sample", num_samples=5, max_length=6, seed=7)
    a = decode_batch(dec, feats, None, cfg, BOS, EOS, UNK)
    b = decode_batch(dec, feats, None, cfg, BOS, EOS, UNK)
    assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
    assert all(len(x) == 5 and [h.score for h in x] == sorted((h.score for h in x), reverse=True) for x in a)
    other = decode_batch(dec, feats, None, DecodeConfig(strategy="sample", num_samples=5, max_length=6, seed=8),
                         BOS, EOS, UNK)
    assert [[h.tokens for h in x] for x in a] != [[h.tokens for h in x] for x in other]
    greedy = greedy_decode(dec, feats, None, 6, BOS, EOS, unk=UNK)
    top1 = decode_batch(dec, feats, None, DecodeConfig(strategy="sample", top_k=1, num_samples=2, max_length=6),
                        BOS, EOS, UNK)
    for g, hyps in zip(greedy, top1, strict=True):
        assert all(h.tokens == g.tokens for h in hyps)
        assert hyps[0].attention.shape == (len(g.tokens), 4)
    with pytest.raises(ConfigError, match="top_p"):
        DecodeConfig(strategy="sample", top_p=0.0).validate()


def test_leave_one_out_baseline_hand_computed() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    torch.testing.assert_close(leave_one_out_baseline(rewards), torch.tensor([[2.5, 2.0, 1.5], [3.0, 3.0, 0.0]]))
    with pytest.raises(ConfigError, match="samples"):
        ScstConfig(baseline="mean", samples=1).validate()


def test_surrogate_value_and_gradient_sign() -> None:
    """A caption better than its baseline gets its log-probability raised, a worse one lowered."""
    lp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([2.0, -1.0])
    loss = scst_surrogate(lp, mask, adv)
    # -(2 * (-3) + (-1) * (-1.5)) / 5 = (6 - 1.5) / 5
    assert float(loss.detach()) == pytest.approx(0.9)
    loss.backward()
    assert torch.all(lp.grad[0, :2] < 0) and lp.grad[0, 2] == 0  # descent raises row 0's log-probs
    assert torch.all(lp.grad[1] > 0)  # and lowers row 1's


def _caption_log_prob(dec, feats, tokens: list[int], max_length: int = 8) -> float:
    """log p(tokens) step by step, renormalised over the tokens sampling may draw."""
    with torch.no_grad():
        state = dec.init_state(feats, None)
        prev, total = torch.tensor([BOS]), 0.0
        for t, tok in enumerate(tokens):
            lp, _, state = dec.step(prev, state)
            allowed = lp[0].clone()
            allowed[[PAD, BOS, UNK]] = -math.inf
            if t < 1:
                allowed[EOS] = -math.inf
            if t >= max_length:  # only <eos> may follow the last word: probability 1
                allowed[:EOS] = -math.inf
                allowed[EOS + 1:] = -math.inf
            total += float(allowed[tok] - torch.logsumexp(allowed, 0))
            prev = torch.tensor([tok])
    return total


@pytest.mark.parametrize("advantage,direction", [(1.0, 1), (-1.0, -1)])
def test_one_scst_step_moves_the_sampled_caption_probability(advantage: float, direction: int) -> None:
    dec = _decoder(2).train()
    feats = _feats(1, 2)
    g = torch.Generator().manual_seed(3)
    drawn = sample(dec, feats, None, n=1, max_length=8, bos=BOS, eos=EOS, banned=[PAD, BOS, UNK], generator=g)
    tokens = drawn.tokens[0][drawn.mask[0]].tolist()
    before = _caption_log_prob(dec, feats, tokens)
    assert float(drawn.log_probs.sum().detach()) == pytest.approx(before, abs=1e-5)
    opt = torch.optim.SGD(dec.parameters(), lr=1e-3)
    scst_surrogate(drawn.log_probs, drawn.mask, torch.tensor([advantage])).backward()
    opt.step()
    after = _caption_log_prob(dec, feats, tokens)
    assert direction * (after - before) > 1e-5, (before, after)


def test_reward_equals_captioning_score_cider_d_per_item(tmp_path) -> None:
    """CiderD over the training references (df of the training set) == what captioning-score
    reports per item when it scores every training item (the toolkit's df: the same references)."""
    from captioning.data.tokenizer import tokenize

    data = make_tiny_image_dataset(tmp_path / "tiny", n=30)
    ann = json.loads((tmp_path / "tiny" / "annotations" / "captions_train.json").read_text())
    refs: dict[int, list[str]] = {}
    for a in ann["annotations"]:
        refs.setdefault(a["image_id"], []).append(a["caption"])
    ids = sorted(refs)
    words = ["a", "red", "green", "blue", "circle", "square", "there", "is"]
    hyps = {i: " ".join(words[(i * k) % len(words)] for k in range(1, 2 + i % 5)) for i in ids}
    hyps[ids[0]] = refs[ids[0]][1]  # one exact reference
    scorer = CiderD([[tokenize(c) for c in refs[i]] for i in ids])
    rewards = scorer([tokenize(hyps[i]) for i in ids], range(len(ids)))
    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": i, "caption": hyps[i]} for i in ids]))
    out = tmp_path / "scores.json"
    run_cli("score", f"results={results}", f"annotations={tmp_path / 'tiny' / 'annotations' / 'captions_train.json'}",
            "metrics=[cider]", "per_item=true", f"output={out}")
    per_item = json.loads(out.read_text())["per_item"]
    cider = {int(k): v["CIDEr"] for k, v in per_item.items()} if isinstance(per_item, dict) else None
    assert cider is not None and len(cider) == len(ids), per_item
    for i, r in zip(ids, rewards, strict=True):
        assert r == pytest.approx(cider[i], abs=1e-9), i
    assert data["splits"]["train"]


def test_the_reference_draw_is_seeded_by_seed_epoch_and_item_not_the_process_stream(tiny_images) -> None:
    """``CaptionsPerItemDataset`` with one caption per item: item i's reference in epoch e is the same whoever reads it (a loader
    worker or the main process) and whatever was drawn before; torch's random stream is untouched."""
    from captioning.data.caption_table import CaptionTable
    from captioning.data.datamodule import CaptionsPerItemDataset, FeatureItems
    from captioning.store.feature_store import FeatureStore

    table = CaptionTable.from_records(_tiny_records(tiny_images))
    items = FeatureItems(table, FeatureStore.open(tiny_images["features_dir"]), "train")
    vocab = table.vocabulary(min_count=1)
    ds = CaptionsPerItemDataset(items, vocab, max_length=10, k=1, seed=7)
    rows = list(range(len(items)))

    def draws(epoch: int) -> list[list[int]]:
        ds.set_epoch(epoch)
        return [ds.captions(i)[0].tolist() for i in rows]

    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = draws(0)
    assert torch.equal(torch.get_rng_state(), state)  # no draw from the process's stream
    torch.rand(100)  # whatever the process drew meanwhile
    assert draws(0) == first and draws(1) != first  # per epoch, reproducible
    assert [ds.captions(i)[0].tolist() for i in reversed(rows)][::-1] == draws(1)  # per item, in any order
    refs = {i: {tuple(table.encode(k, ds.encoder, 10).tolist())
                for k in range(int(items.first_caption[i]), int(items.first_caption[i] + items.n_captions[i]))}
            for i in rows}
    assert all(tuple(d) in refs[i] for i, d in zip(rows, first, strict=True))  # one of the item's own
    assert len({tuple(draws(e)[0]) for e in range(6)}) > 1  # over the epochs, several of them


def _tiny_records(data: dict):
    from captioning.config import DataConfig
    from captioning.data.annotations import read_dataset

    root = data["root"]
    cfg = DataConfig(name="tiny", kind="image", format="coco", root=str(root), media_dir=str(root / "images"),
                     annotations={s: str(root / "annotations" / f"captions_{s}.json") for s in ("train", "val", "test")})
    return read_dataset(cfg).records
