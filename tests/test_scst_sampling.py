"""The one sampler (``captioning.models.sampling.sample``) at a fixed length, the way a compiled SCST
step runs it, against its early-stopping run: the same sampling distribution and log-probabilities,
the same greedy captions, one graph under torch.compile for every compilable decoder."""

from __future__ import annotations

import functools

import pytest
import torch
from test_compile import GraphCounter
from test_decoders import CASES, IDS, _batch, _decoder
from test_scst import BOS, EOS, PAD, UNK, V, _feats
from test_scst import _decoder as _scst_decoder

from captioning.models.sampling import gumbel_argmax
from captioning.models.search import greedy_decode, sample
from captioning.train.scst import ScstConfig

BANNED = [PAD, BOS, UNK]


def test_gumbel_argmax_draws_from_the_softmax() -> None:
    """Hand-made distribution (one token never allowed): frequencies of 40,000 draws within 0.01."""
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    draws = gumbel_argmax(torch.log(p).expand(40_000, 5))
    freq = torch.bincount(draws, minlength=5).float() / 40_000
    assert freq[4] == 0
    torch.testing.assert_close(freq, p, atol=0.01, rtol=0)


def test_fixed_samples_follow_search_samples_distribution() -> None:
    """First words of 6,000 samples of one item: both samplers within 0.03 (total variation) of
    the model's constrained distribution."""
    dec = _scst_decoder()
    feats = _feats(1)
    with torch.no_grad():
        lp, _, _ = dec.step(torch.tensor([BOS]), dec.init_state(feats, None))
        lp[0, BANNED + [EOS]] = float("-inf")  # min_length 1: no <eos> first
        p = torch.softmax(lp[0], -1)
        torch.manual_seed(1)
        ours = sample(dec, feats, None, n=6000, max_length=3, bos=BOS, eos=EOS, banned=BANNED,
                      fixed_length=True).tokens[:, 0]
        theirs = sample(dec, feats, None, n=6000, max_length=3, bos=BOS, eos=EOS, banned=BANNED).tokens[:, 0]
    for draws in (ours, theirs):
        freq = torch.bincount(draws, minlength=V).float() / draws.numel()
        assert 0.5 * float((freq - p).abs().sum()) < 0.03


def test_fixed_samples_log_probs_are_the_models_and_respect_the_constraints() -> None:
    dec = _scst_decoder()
    feats = _feats()
    torch.manual_seed(2)
    drawn = sample(dec, feats, None, n=4, max_length=5, bos=BOS, eos=EOS, banned=BANNED, min_length=2, entropy=True,
                   fixed_length=True)
    assert drawn.tokens.shape == (12, 6) and bool(drawn.finished.all())
    words = drawn.words(EOS)
    assert all(2 <= len(w) <= 5 for w in words) and not any(t in (*BANNED, EOS) for w in words for t in w)
    assert torch.equal(drawn.mask.sum(1), torch.tensor([len(w) + 1 for w in words]))
    assert bool((drawn.log_probs[~drawn.mask] == 0).all()) and bool((drawn.entropy[~drawn.mask] == 0).all())
    with torch.no_grad():  # each row's log-prob, step by step under the same constraints
        for r in range(12):
            state = dec.init_state(feats[r // 4: r // 4 + 1], None)
            prev, total = torch.tensor([BOS]), 0.0
            for t, tok in enumerate([*words[r], EOS]):
                lp, _, state = dec.step(prev, state)
                allowed = torch.ones(V, dtype=torch.bool)
                allowed[BANNED] = False
                allowed[EOS] = t >= 2
                if t >= 5:  # after max_length words: only <eos>
                    allowed[:] = False
                    allowed[EOS] = True
                total += float(lp[0, tok] - torch.logsumexp(lp[0][allowed], 0))
                prev = torch.tensor([tok])
            assert float(drawn.log_probs[r].sum()) == pytest.approx(total, abs=1e-5)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_fixed_greedy_equals_greedy_decode(name: str, i: int) -> None:
    dec = _decoder(name, i, seed=2).eval()
    with torch.no_grad():
        for p in dec.parameters():
            p.mul_(2.0)
    feats, mask, _ = _batch(2)
    with torch.no_grad():
        ours = sample(dec, feats, mask, max_length=6, bos=BOS, eos=EOS, banned=BANNED, greedy=True, min_length=0,
                      fixed_length=True).words(EOS)
        theirs = greedy_decode(dec, feats, mask, 6, BOS, EOS, unk=UNK)
    assert ours == [h.tokens for h in theirs]


@pytest.mark.parametrize("name,i", [("lstm", 2), ("transformer", 0)], ids=["lstm-2", "transformer-0"])
def test_scst_decoding_compiles_as_one_graph_each(name: str, i: int) -> None:
    """Sampling with grad and greedy decoding, each one graph (no graph break, no host read); one
    example per decoder (the step's variants are traced by test_compile's static losses)."""
    dec = _decoder(name, i).train()
    feats, mask, _ = _batch()
    torch._dynamo.reset()
    counter = GraphCounter()
    draw = torch.compile(functools.partial(sample, dec, n=2, max_length=3, bos=BOS, eos=EOS, banned=BANNED,
                                           entropy=True, fixed_length=True), backend=counter, fullgraph=True,
                         dynamic=False)
    out = draw(feats, mask)
    out.log_probs.sum().backward()
    assert counter.graphs == 1 and out.tokens.shape == (10, 4)
    greedy = torch.compile(functools.partial(sample, dec.eval(), max_length=3, bos=BOS, eos=EOS, banned=BANNED,
                                             greedy=True, fixed_length=True), backend=counter, fullgraph=True,
                           dynamic=False)
    with torch.no_grad():
        assert greedy(feats, mask).tokens.shape == (5, 4)
    assert counter.graphs == 2


def test_a_compiled_scst_step_is_two_graphs_for_every_batch_and_leaves_padding_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """compile=true on a CPU (the path compile=auto takes on a GPU): the greedy baseline and the
    sampling + cross-entropy each compile once, for a full batch and a smaller one of other caption
    lengths; the rewards are asked for the real items' captions only (5 items x 2 samples)."""
    from test_compile import _module, counting_compile

    from captioning.data.datamodule import Batch
    from captioning.train.scst import SelfCritical

    module = _module("true")
    module.scst = SelfCritical(ScstConfig(samples=2, max_length=4, xe_weight=0.5, entropy_weight=0.01), module.vocab)
    asked: list[int] = []

    def reward(texts, items):
        asked.append(len(texts))
        return [float(len(t)) / 10 for t in texts]

    module.scst.reward = reward
    counter = counting_compile(monkeypatch)
    g = torch.Generator().manual_seed(0)
    for rows, length in ((8, 8), (5, 6)):
        tokens = torch.randint(4, 12, (rows, length), generator=g)
        tokens[:, 0], tokens[:, -1] = BOS, EOS
        batch = Batch(torch.randn(rows, 4, 6, generator=g).half(), torch.ones(rows, 4, dtype=torch.bool), tokens,
                      torch.arange(rows))
        out = module.scst.loss(module, batch)
        out["loss"].backward()
        assert torch.isfinite(out["loss"]) and {"reward", "baseline_reward", "entropy", "xe"} <= set(out)
    assert counter.graphs == 2
    assert asked == [8, 16, 5, 10]  # greedy then samples, per batch
