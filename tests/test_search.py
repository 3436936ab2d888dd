"""Greedy and beam search: exhaustive equivalence, batching, constraints, attention rows."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from conftest import run_bench

from captioning.errors import ConfigError
from captioning.models.decoders import build_decoder
from captioning.models.search import (
    BeamConfig,
    beam_search,
    decode_batch,
    greedy_decode,
    length_penalty,
)

PAD, BOS, EOS, UNK = 0, 1, 2, 3
C, N = 5, 4


def _model(vocab: int = 7, seed: int = 0, variant: str = "soft_attention", scale: float = 3.0):
    torch.manual_seed(seed)
    cfg = dict(variant=variant, embed_dim=8, hidden_dim=16, attention_dim=8, dropout=0.0)
    dec = build_decoder(cfg, vocab, C).eval()
    with torch.no_grad():  # peakier distributions than the default init
        dec.out_vocab.weight.mul_(scale)
    return dec


def _feats(b: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(b, N, C, generator=g)
    mask = torch.ones(b, N, dtype=torch.bool)
    if b > 1:
        mask[1, 2:] = False
    return feats, mask


def _sequence_logprob(dec, feats, mask, words, max_length, min_length=1) -> float:
    """log p(words + <eos>) step by step with the search's constraints (no renormalisation)."""
    with torch.no_grad():  # not set_grad_enabled(False/True): a failing assert would leave grad off
        state = dec.init_state(feats, mask)
        prev = torch.tensor([BOS])
        total = 0.0
        for t, w in enumerate([*words, EOS]):
            lp, _, state = dec.step(prev, state)
            assert not (w == EOS and t < min_length)
            total += float(lp[0, w])
            prev = torch.tensor([w])
    return total


@pytest.mark.parametrize("penalty", ["none", "gnmt", "avg"])
def test_beam_equals_exhaustive_search(penalty: str) -> None:
    dec = _model()
    feats, mask = _feats(1)
    max_len, words = 3, [4, 5, 6]  # <unk> (3) blocked
    scored = []
    for n in range(1, max_len + 1):
        for seq in itertools.product(words, repeat=n):
            raw = _sequence_logprob(dec, feats, mask, list(seq), max_len)
            scored.append((raw / length_penalty(n + 1, penalty, 0.6), list(seq)))
    scored.sort(key=lambda x: -x[0])
    # 39 sequences; a beam wider than all candidates is exact
    cfg = BeamConfig(
        beam_size=40, max_length=max_len, min_length=1, length_penalty=penalty, n_best=5
    )
    hyps = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)[0]
    assert [h.tokens for h in hyps] == [s for _, s in scored[:5]]
    for h, (score, _) in zip(hyps, scored[:5], strict=True):
        assert h.score == pytest.approx(score, abs=1e-4)
        assert h.finished


def test_beam_one_equals_greedy() -> None:
    dec = _model(vocab=9, seed=1)
    feats, mask = _feats(4, seed=1)
    greedy = greedy_decode(dec, feats, mask, 8, BOS, EOS, unk=UNK, min_length=1)
    beam = beam_search(dec, feats, mask, BeamConfig(beam_size=1, max_length=8), BOS, EOS, UNK)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b[0].tokens
        assert g.score == pytest.approx(b[0].score, abs=1e-5)
        torch.testing.assert_close(g.attention, b[0].attention)
    via = decode_batch(dec, feats, mask, BeamConfig(beam_size=1, max_length=8), BOS, EOS, UNK)
    assert [h[0].tokens for h in via] == [g.tokens for g in greedy]


@pytest.mark.parametrize("penalty", ["none", "gnmt"])
def test_batched_equals_per_item(penalty: str) -> None:
    dec = _model(vocab=10, seed=2, scale=1.5)
    feats, mask = _feats(5, seed=2)
    mask[3, 1:] = False
    cfg = BeamConfig(beam_size=3, max_length=7, length_penalty=penalty, n_best=3)
    batched = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    for i in range(5):
        single = beam_search(dec, feats[i : i + 1], mask[i : i + 1], cfg, BOS, EOS, UNK)[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in single]
        for hb, hs in zip(batched[i], single, strict=True):
            assert hb.score == pytest.approx(hs.score, abs=1e-4)
            torch.testing.assert_close(hb.attention, hs.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("penalty", ["none", "gnmt", "avg"])
def test_early_exit_does_not_change_results(penalty: str) -> None:
    dec = _model(vocab=10, seed=8, scale=2.0)
    with torch.no_grad():
        dec.out_vocab.bias[EOS] = 0.5  # finish early and at different steps
    feats, mask = _feats(6, seed=8)
    cfg = BeamConfig(beam_size=3, max_length=12, length_penalty=penalty, n_best=2)
    fast = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    full = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK, early_exit=False)
    for a, b in zip(fast, full, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_nbest_distinct_sorted_and_attention_rows() -> None:
    dec = _model(vocab=10, seed=3, scale=1.0)
    feats, mask = _feats(3, seed=3)
    res = beam_search(
        dec, feats, mask, BeamConfig(beam_size=4, max_length=6, n_best=4), BOS, EOS, UNK
    )
    for i, hyps in enumerate(res):
        assert len(hyps) == 4
        assert len({tuple(h.tokens) for h in hyps}) == 4
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.attention.shape == (len(h.tokens), N)
            assert torch.all(h.attention[:, ~mask[i]] == 0)
            torch.testing.assert_close(h.attention.sum(-1), torch.ones(len(h.tokens)))
            assert BOS not in h.tokens and EOS not in h.tokens and PAD not in h.tokens


def test_min_length_and_unk_blocking() -> None:
    dec = _model(vocab=8, seed=4)
    with torch.no_grad():
        dec.out_vocab.bias[EOS] = 20.0  # the model wants to stop at once
        dec.out_vocab.bias[UNK] = 10.0  # and otherwise say <unk>
    feats, mask = _feats(2, seed=4)
    cfg = BeamConfig(beam_size=3, max_length=8, min_length=4, n_best=2)
    for hyps in beam_search(dec, feats, mask, cfg, BOS, EOS, UNK):
        for h in hyps:
            assert len(h.tokens) >= 4 and UNK not in h.tokens
    for h in greedy_decode(dec, feats, mask, 8, BOS, EOS, unk=UNK, min_length=4):
        assert len(h.tokens) == 4 and UNK not in h.tokens
    cfg_unk = BeamConfig(beam_size=3, max_length=8, min_length=2, block_unk=False)
    assert all(
        hyps[0].tokens == [UNK, UNK]
        for hyps in beam_search(dec, feats, mask, cfg_unk, BOS, EOS, UNK)
    )


def _has_repeated_trigram(tokens: list[int]) -> bool:
    tri = [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]
    return len(tri) != len(set(tri))


def test_trigram_blocking() -> None:
    dec = _model(vocab=8, seed=5)
    with torch.no_grad():
        dec.out_vocab.bias[5] = 15.0  # "5 5 5 5 ..."
        dec.out_vocab.bias[EOS] = -15.0
    feats, mask = _feats(2, seed=5)
    plain = BeamConfig(beam_size=3, max_length=8)
    blocked = BeamConfig(beam_size=3, max_length=8, block_trigrams=True, n_best=3)
    assert all(
        _has_repeated_trigram(h[0].tokens)
        for h in beam_search(dec, feats, mask, plain, BOS, EOS, UNK)
    )
    for hyps in beam_search(dec, feats, mask, blocked, BOS, EOS, UNK):
        for h in hyps:
            assert not _has_repeated_trigram(h.tokens) and len(h.tokens) == 8
    for h in greedy_decode(dec, feats, mask, 8, BOS, EOS, unk=UNK, block_trigrams=True):
        assert not _has_repeated_trigram(h.tokens)


def test_max_length_and_unfinished_fallback() -> None:
    dec = _model(vocab=8, seed=6)
    feats, mask = _feats(2, seed=6)
    for hyps in beam_search(dec, feats, mask, BeamConfig(beam_size=3, max_length=2), BOS, EOS, UNK):
        assert 1 <= len(hyps[0].tokens) <= 2 and hyps[0].finished
    # <eos> impossible: best unfinished hypotheses are returned, never nothing
    cfg = BeamConfig(beam_size=3, max_length=3, min_length=5, n_best=2)
    for hyps in beam_search(dec, feats, mask, cfg, BOS, EOS, UNK):
        assert len(hyps) == 2
        assert all(len(h.tokens) == 3 and not h.finished for h in hyps)
        assert hyps[0].tokens != hyps[1].tokens
        assert hyps[0].attention.shape == (3, N)
    g = greedy_decode(dec, feats, mask, 3, BOS, EOS, min_length=5)
    assert all(len(h.tokens) == 3 and not h.finished for h in g)


def test_models_without_attention_and_config_errors() -> None:
    dec = _model(vocab=8, seed=7, variant="show_tell")
    feats, mask = _feats(2, seed=7)
    res = decode_batch(dec, feats, mask, BeamConfig(beam_size=2, max_length=5), BOS, EOS, UNK)
    assert all(h[0].attention is None and len(h[0].tokens) >= 1 for h in res)
    with pytest.raises(ConfigError, match="n_best"):
        beam_search(dec, feats, mask, BeamConfig(beam_size=2, n_best=3), BOS, EOS, UNK)
    with pytest.raises(ConfigError, match="length_penalty"):
        beam_search(dec, feats, mask, BeamConfig(length_penalty="wu"), BOS, EOS, UNK)


def test_hard_attention_decoding_uses_argmax_location() -> None:
    dec = _model(vocab=8, seed=9, variant="hard_attention")
    feats, mask = _feats(2, seed=9)
    res = beam_search(dec, feats, mask, BeamConfig(beam_size=2, max_length=4), BOS, EOS, UNK)
    for i, hyps in enumerate(res):
        assert hyps[0].attention.shape == (len(hyps[0].tokens), N)
        assert torch.all(hyps[0].attention[:, ~mask[i]] == 0)


def test_beam_benchmark_smoke() -> None:
    results = run_bench(
        "beam",
        "--batch-size 3 --beam 2 --regions 5 --feature-dim 8 --hidden 8 --attention-dim 4 "
        "--embed 8 --vocab 20 --length 4 --single-items 2",
    )
    assert [r["name"] for r in results] == ["beam/batched", "beam/one_at_a_time", "beam/speedup"]
    assert results[1]["same_captions_as_batched"] == "2/2"


# ------------------------------------------------------------ an independent beam search oracle
#
# A textbook beam search, one item at a time, on plain Python lists, with no batching and no early
# exit, over a toy decoder whose next-token distribution depends on the whole prefix (so greedy,
# beam and exhaustive search disagree).  Conventions of captioning.models.search: at most
# max_length words, then only <eos>; <eos> only after min_length words; <bos>, <pad> and <unk>
# never generated; of the candidates (beam, token) sorted by summed log-prob, <eos> candidates
# among the first K finish, and the K best other candidates go on; a finished hypothesis with n
# words is ranked by raw / lp(n + 1) (the <eos> token counts), lp = 1 | ((5 + L) / 6) ** alpha | L.

TOY_WORDS = (4, 5, 6)
TOY_V = 7


def toy_log_probs(item: int, prefix: list[int]) -> list[float]:
    """log p(. | item, prefix) over TOY_V tokens: a fixed pseudo-random function of the prefix,
    rounded to float32 as a real decoder's output is."""
    h = item * 7919
    for w in prefix:
        h = (h * 131 + w + 1) % 1_000_003
    logits = [2.5 * math.sin(0.91 * v + 0.0137 * h + 1.3 * item) for v in range(TOY_V)]
    logits[EOS] += 0.4 * len(prefix) - 0.8  # stopping gets likelier with length
    m = max(logits)
    log_z = m + math.log(sum(math.exp(x - m) for x in logits))
    return [float(torch.tensor(x - log_z, dtype=torch.float32)) for x in logits]


class ToyState:
    """Rows: item code and the prefix of each row; ``group`` rows per item (the beams)."""

    def __init__(self, items: list[int], prefixes: list[list[int]], group: int = 1) -> None:
        self.items, self.prefixes, self.group = items, prefixes, group

    def repeat_interleave(self, k: int) -> ToyState:
        return ToyState([i for i in self.items for _ in range(k)], [list(p) for p in self.prefixes for _ in range(k)],
                        self.group * k)

    def index_select(self, idx: torch.Tensor, within_groups: bool = False) -> ToyState:
        rows = idx.tolist()
        assert not within_groups or all(r // self.group == j // self.group for j, r in enumerate(rows))
        return ToyState([self.items[r] for r in rows], [list(self.prefixes[r]) for r in rows],
                        self.group if within_groups else 1)

    def select_groups(self, groups: torch.Tensor) -> ToyState:
        rows = [g * self.group + j for g in groups.tolist() for j in range(self.group)]
        return ToyState([self.items[r] for r in rows], [self.prefixes[r] for r in rows], self.group)


class ToyDecoder:
    """The decoder protocol of captioning.models.search over ``toy_log_probs``; ``features[b, 0, 0]``
    is item b's code.  No attention."""

    vocab_size, pad_id = TOY_V, PAD

    def init_state(self, features: torch.Tensor, mask: torch.Tensor | None) -> ToyState:
        return ToyState([int(c) for c in features[:, 0, 0].tolist()], [[] for _ in range(features.shape[0])])

    def step(self, prev: torch.Tensor, state: ToyState):
        prefixes = [p if t == BOS else [*p, t] for p, t in zip(state.prefixes, prev.tolist(), strict=True)]
        lp = torch.tensor([toy_log_probs(i, p) for i, p in zip(state.items, prefixes, strict=True)],
                          dtype=torch.float32)
        return lp, None, ToyState(state.items, prefixes, state.group)


def textbook_beam_search(item: int, k: int, max_length: int, min_length: int, penalty: str,
                         alpha: float = 0.6) -> list[tuple[float, float, list[int]]]:
    """Every hypothesis that finishes, as (ranking score, summed log-prob, words), best first."""

    def lp_divisor(length: int) -> float:
        return {"none": 1.0, "gnmt": ((5.0 + length) / 6.0) ** alpha, "avg": float(length)}[penalty]

    beams: list[tuple[float, list[int]]] = [(0.0, [])]
    finished = []
    for t in range(max_length + 1):
        candidates = []
        for score, words in beams:
            lp = toy_log_probs(item, words)
            allowed = [EOS] if t == max_length else [*TOY_WORDS, *([EOS] if t >= min_length else [])]
            candidates += [(score + lp[v], words, v) for v in allowed]
        candidates.sort(key=lambda c: -c[0])
        for score, words, v in candidates[:k]:
            if v == EOS:
                finished.append((score / lp_divisor(len(words) + 1), score, words))
        beams = [(score, [*words, v]) for score, words, v in candidates if v != EOS][:k]
    return sorted(finished, key=lambda f: -f[0])


@pytest.mark.parametrize("penalty", ["none", "gnmt", "avg"])
@pytest.mark.parametrize("width", [2, 3])
def test_beam_search_equals_a_textbook_beam_search(width: int, penalty: str) -> None:
    """Batched beam search (with its early exit) == the per-item textbook search, hypotheses and
    scores, for 5 items in one batch, at two minimum lengths, best hypothesis and the n-best list."""
    items = [0, 1, 2, 3, 4]
    features = torch.tensor(items, dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 3).contiguous()
    differs = 0
    for min_length in (1, 2):
        for n_best in (1, width):
            cfg = BeamConfig(beam_size=width, max_length=5, min_length=min_length, length_penalty=penalty,
                             n_best=n_best)
            got = beam_search(ToyDecoder(), features, None, cfg, BOS, EOS, UNK)
            for item, hyps in zip(items, got, strict=True):
                want = textbook_beam_search(item, width, 5, min_length, penalty)[:n_best]
                assert [h.tokens for h in hyps] == [w[2] for w in want], (item, min_length, n_best)
                assert [h.score for h in hyps] == pytest.approx([w[0] for w in want], abs=1e-5)
                assert [h.log_prob for h in hyps] == pytest.approx([w[1] for w in want], abs=1e-5)
                assert all(h.finished for h in hyps)
                greedy = textbook_beam_search(item, 1, 5, min_length, penalty)[0][2]
                differs += greedy != hyps[0].tokens
    assert differs > 0  # the toy problem is one where the beam finds more than greedy search
