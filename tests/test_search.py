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
    DecodeConfig,
    beam_search,
    decode_batch,
    greedy_decode,
    grouped_beam_search,
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
    cfg = DecodeConfig(
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
    beam = beam_search(dec, feats, mask, DecodeConfig(beam_size=1, max_length=8), BOS, EOS, UNK)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b[0].tokens
        assert g.score == pytest.approx(b[0].score, abs=1e-5)
        torch.testing.assert_close(g.attention, b[0].attention)
    via = decode_batch(dec, feats, mask, DecodeConfig(beam_size=1, max_length=8), BOS, EOS, UNK)
    assert [h[0].tokens for h in via] == [g.tokens for g in greedy]


@pytest.mark.parametrize("penalty", ["none", "gnmt"])
def test_batched_equals_per_item(penalty: str) -> None:
    dec = _model(vocab=10, seed=2, scale=1.5)
    feats, mask = _feats(5, seed=2)
    mask[3, 1:] = False
    cfg = DecodeConfig(beam_size=3, max_length=7, length_penalty=penalty, n_best=3)
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
    cfg = DecodeConfig(beam_size=3, max_length=12, length_penalty=penalty, n_best=2)
    fast = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    full = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK, early_exit=False)
    for a, b in zip(fast, full, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_nbest_distinct_sorted_and_attention_rows() -> None:
    dec = _model(vocab=10, seed=3, scale=1.0)
    feats, mask = _feats(3, seed=3)
    res = beam_search(
        dec, feats, mask, DecodeConfig(beam_size=4, max_length=6, n_best=4), BOS, EOS, UNK
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
    cfg = DecodeConfig(beam_size=3, max_length=8, min_length=4, n_best=2)
    for hyps in beam_search(dec, feats, mask, cfg, BOS, EOS, UNK):
        for h in hyps:
            assert len(h.tokens) >= 4 and UNK not in h.tokens
    for h in greedy_decode(dec, feats, mask, 8, BOS, EOS, unk=UNK, min_length=4):
        assert len(h.tokens) == 4 and UNK not in h.tokens
    cfg_unk = DecodeConfig(beam_size=3, max_length=8, min_length=2, block_unk=False)
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
    plain = DecodeConfig(beam_size=3, max_length=8)
    blocked = DecodeConfig(beam_size=3, max_length=8, block_trigrams=True, n_best=3)
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
    for hyps in beam_search(dec, feats, mask, DecodeConfig(beam_size=3, max_length=2), BOS, EOS, UNK):
        assert 1 <= len(hyps[0].tokens) <= 2 and hyps[0].finished
    # <eos> impossible: best unfinished hypotheses are returned, never nothing
    cfg = DecodeConfig(beam_size=3, max_length=3, min_length=5, n_best=2)
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
    res = decode_batch(dec, feats, mask, DecodeConfig(beam_size=2, max_length=5), BOS, EOS, UNK)
    assert all(h[0].attention is None and len(h[0].tokens) >= 1 for h in res)
    with pytest.raises(ConfigError, match="n_best"):
        beam_search(dec, feats, mask, DecodeConfig(beam_size=2, n_best=3), BOS, EOS, UNK)
    with pytest.raises(ConfigError, match="length_penalty"):
        beam_search(dec, feats, mask, DecodeConfig(length_penalty="wu"), BOS, EOS, UNK)


def test_hard_attention_decoding_uses_argmax_location() -> None:
    dec = _model(vocab=8, seed=9, variant="hard_attention")
    feats, mask = _feats(2, seed=9)
    res = beam_search(dec, feats, mask, DecodeConfig(beam_size=2, max_length=4), BOS, EOS, UNK)
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
            cfg = DecodeConfig(beam_size=width, max_length=5, min_length=min_length, length_penalty=penalty,
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


# --------------------------------------------------------------------------- diverse beam search
#
# Vijayakumar et al. 2018, as a textbook: the beam of K is G groups of K/G beams, processed one
# group after the other at each step; group g ranks its candidates by its running score plus
# log p(w) - strength * (how many times the groups before g chose w at this step: their
# continuing beams and their finished <eos>).  Conventions otherwise those of the oracle above;
# a finished hypothesis keeps (ranking score / lp, summed log-prob / lp, summed log-prob, words).


def textbook_diverse_beam_search(item: int, k: int, groups: int, strength: float, max_length: int,
                                 min_length: int, penalty: str, alpha: float = 0.6) -> list[list[tuple]]:
    """Per group, every hypothesis that finishes, best first by the group's ranking score."""

    def lp_divisor(length: int) -> float:
        return {"none": 1.0, "gnmt": ((5.0 + length) / 6.0) ** alpha, "avg": float(length)}[penalty]

    kg = k // groups
    beams: list[list[tuple[float, float, list[int]]]] = [[(0.0, 0.0, [])] for _ in range(groups)]
    finished: list[list[tuple]] = [[] for _ in range(groups)]
    for t in range(max_length + 1):
        chosen = [0] * TOY_V
        for g in range(groups):
            candidates = []
            for rank, raw, words in beams[g]:
                lp = toy_log_probs(item, words)
                allowed = [EOS] if t == max_length else [*TOY_WORDS, *([EOS] if t >= min_length else [])]
                candidates += [(rank + lp[v] - strength * chosen[v], raw + lp[v], words, v) for v in allowed]
            candidates.sort(key=lambda c: -c[0])
            for rank, raw, words, v in candidates[:kg]:
                if v == EOS:
                    div = lp_divisor(len(words) + 1)
                    finished[g].append((rank / div, raw / div, raw, words))
                    chosen[EOS] += 1
            beams[g] = [(rank, raw, [*words, v]) for rank, raw, words, v in candidates if v != EOS][:kg]
            for _, _, words in beams[g]:
                chosen[words[-1]] += 1
    return [sorted(f, key=lambda x: -x[0]) for f in finished]


@pytest.mark.parametrize("penalty", ["none", "gnmt"])
@pytest.mark.parametrize(("width", "groups", "strength"), [(4, 2, 0.7), (6, 3, 0.4), (3, 3, 2.0)])
def test_diverse_beam_search_equals_a_textbook_diverse_beam_search(width: int, groups: int, strength: float,
                                                                   penalty: str) -> None:
    """Each group's hypotheses (words, score, log-prob) == the textbook's, 5 items in one batch."""
    items = [0, 1, 2, 3, 4]
    features = torch.tensor(items, dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 3).contiguous()
    kg = width // groups
    cfg = DecodeConfig(beam_size=width, groups=groups, diversity_strength=strength, max_length=5,
                     length_penalty=penalty, n_best=kg)
    got = grouped_beam_search(ToyDecoder(), features, None, cfg, BOS, EOS, UNK)
    merged = beam_search(ToyDecoder(), features, None, cfg, BOS, EOS, UNK)
    differ = 0
    for item, per_group, best in zip(items, got, merged, strict=True):
        want = textbook_diverse_beam_search(item, width, groups, strength, 5, 1, penalty)
        assert len(per_group) == groups
        for g, (hyps, w) in enumerate(zip(per_group, want, strict=True)):
            assert [h.tokens for h in hyps] == [x[3] for x in w[:kg]], (item, g)
            assert [h.score for h in hyps] == pytest.approx([x[1] for x in w[:kg]], abs=1e-5)
            assert [h.log_prob for h in hyps] == pytest.approx([x[2] for x in w[:kg]], abs=1e-5)
            assert all(h.group == g and h.finished for h in hyps)
        pool = sorted({tuple(x[3]): x[1] for w in want for x in w[:kg]}.items(), key=lambda x: -x[1])
        assert [h.tokens for h in best] == [list(t) for t, _ in pool[:kg]]  # merged: best score first
        differ += len({tuple(hyps[0].tokens) for hyps in per_group}) > 1
    assert differ > 0  # the groups' best captions are not all the same


def test_one_group_is_plain_beam_search() -> None:
    """groups=1 (any strength) gives exactly plain beam search: words, scores, attention."""
    dec = _model(vocab=10, seed=11, scale=1.5)
    feats, mask = _feats(5, seed=11)
    plain = beam_search(dec, feats, mask, DecodeConfig(beam_size=4, max_length=7, n_best=4), BOS, EOS, UNK)
    one = beam_search(dec, feats, mask, DecodeConfig(beam_size=4, max_length=7, n_best=4, groups=1,
                                                   diversity_strength=3.0), BOS, EOS, UNK)
    for a, b in zip(plain, one, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == [h.score for h in b]
        assert [h.log_prob for h in a] == [h.log_prob for h in b]
        for ha, hb in zip(a, b, strict=True):
            assert torch.equal(ha.attention, hb.attention)


def test_zero_strength_groups_are_independent_beam_searches() -> None:
    """diversity_strength=0: G groups of K/G beams == G beam searches of width K/G, each alone."""
    dec = _model(vocab=10, seed=12, scale=1.5)
    feats, mask = _feats(4, seed=12)
    grouped = grouped_beam_search(dec, feats, mask, DecodeConfig(beam_size=6, groups=3, diversity_strength=0.0,
                                                               max_length=7, n_best=2), BOS, EOS, UNK)
    alone = beam_search(dec, feats, mask, DecodeConfig(beam_size=2, max_length=7, n_best=2), BOS, EOS, UNK)
    for per_group, want in zip(grouped, alone, strict=True):
        for hyps in per_group:
            assert [h.tokens for h in hyps] == [h.tokens for h in want]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-5)
            for h, w in zip(hyps, want, strict=True):
                torch.testing.assert_close(h.attention, w.attention, atol=1e-5, rtol=1e-4)


class TableDecoder(ToyDecoder):
    """p(next word | prefix) from a table (the default row for prefixes not in it); no attention."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], default: dict[int, float]) -> None:
        self.table, self.default = table, default

    def step(self, prev: torch.Tensor, state: ToyState):
        prefixes = [p if t == BOS else [*p, t] for p, t in zip(state.prefixes, prev.tolist(), strict=True)]
        lp = torch.full((len(prefixes), TOY_V), -30.0)
        for r, p in enumerate(prefixes):
            for w, prob in self.table.get(tuple(p), self.default).items():
                lp[r, w] = math.log(prob)
        return lp, None, ToyState(state.items, prefixes, state.group)


def test_groups_differ_where_beam_search_repeats_itself() -> None:
    """Word 4 is likely first: beam search's 3 best all start with it; 3 diverse groups start with
    4, 5 and 6 (group 1: log .9 - 5 < log .06; group 2: log .9 - 10 and log .06 - 5 < log .04)."""
    dec = TableDecoder({(): {4: 0.9, 5: 0.06, 6: 0.04}, (4,): {EOS: 0.5, 4: 0.22, 5: 0.18, 6: 0.1}}, {EOS: 0.97})
    features = torch.zeros(2, 1, 1)
    plain = beam_search(dec, features, None, DecodeConfig(beam_size=3, max_length=4, n_best=3), BOS, EOS, UNK)
    assert [h.tokens for h in plain[0]] == [[4], [4, 4], [4, 5]]  # near-duplicates
    cfg = DecodeConfig(beam_size=3, groups=3, diversity_strength=5.0, max_length=4, n_best=3)
    for per_group in grouped_beam_search(dec, features, None, cfg, BOS, EOS, UNK):
        assert [hyps[0].tokens for hyps in per_group] == [[4], [5], [6]]
    for hyps in beam_search(dec, features, None, cfg, BOS, EOS, UNK):
        assert [h.tokens for h in hyps] == [[4], [5], [6]]  # by log-prob: .45 > .0582 > .0388
        assert [h.group for h in hyps] == [0, 1, 2]
        assert hyps[0].log_prob == pytest.approx(math.log(0.9 * 0.5), abs=1e-6)
    weak = DecodeConfig(beam_size=3, groups=3, diversity_strength=2.0, max_length=4, n_best=3)
    assert [h[0].tokens[0] for h in grouped_beam_search(dec, features, None, weak, BOS, EOS, UNK)[0]] == [4, 4, 5]


@pytest.mark.parametrize("penalty", ["none", "gnmt"])
def test_diverse_early_exit_does_not_change_results(penalty: str) -> None:
    dec = _model(vocab=10, seed=13, scale=2.0)
    with torch.no_grad():
        dec.out_vocab.bias[EOS] = 0.5
    feats, mask = _feats(6, seed=13)
    cfg = DecodeConfig(beam_size=4, groups=2, diversity_strength=0.8, max_length=12, length_penalty=penalty,
                     n_best=4)
    fast = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    full = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK, early_exit=False)
    for a, b in zip(fast, full, strict=True):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_diverse_beam_search_config_errors() -> None:
    with pytest.raises(ConfigError, match="not a multiple of decode.groups"):
        DecodeConfig(beam_size=5, groups=2).validate()
    with pytest.raises(ConfigError, match="diversity_strength"):
        DecodeConfig(beam_size=4, groups=2, diversity_strength=-1.0).validate()
    with pytest.raises(ConfigError, match="strategy=beam"):
        DecodeConfig(strategy="sample", beam_size=2, groups=2).validate()
    DecodeConfig(beam_size=6, groups=3, n_best=6).validate()


# ------------------------------------------------------------------------- per-word log-probs


def _toy_word_log_probs(item: int, h, allowed: list[int] | None = None) -> list[float]:
    """log p of each word of ``h`` then of its <eos> (when finished), by hand from ``toy_log_probs``;
    ``allowed``: renormalised over those tokens (the distribution sampling draws from)."""
    words = h.tokens + ([EOS] if h.finished else [])
    out = []
    for t, w in enumerate(words):
        lp = toy_log_probs(item, h.tokens[:t])
        if allowed is not None:
            ok = [EOS] if t == 5 else [v for v in allowed if v != EOS or t >= 1]
            out.append(lp[w] - math.log(sum(math.exp(lp[v]) for v in ok)))
        else:
            out.append(lp[w])
    return out


@pytest.mark.parametrize("groups", [1, 2])
def test_beam_search_token_log_probs_are_each_words_log_prob(groups: int) -> None:
    """One per word, then <eos>'s; the model's log-probs, diversity penalties left out; summing to log_prob."""
    items = [0, 3, 4]
    features = torch.tensor(items, dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 3).contiguous()
    cfg = DecodeConfig(beam_size=4, groups=groups, diversity_strength=0.8, max_length=5, length_penalty="gnmt",
                       n_best=2)
    got = grouped_beam_search(ToyDecoder(), features, None, cfg, BOS, EOS, UNK)
    for item, per_group in zip(items, got, strict=True):
        for h in (h for hyps in per_group for h in hyps):  # every group's, penalised ones included
            assert len(h.token_log_probs) == len(h.tokens) + h.finished
            assert h.token_log_probs == pytest.approx(_toy_word_log_probs(item, h), abs=1e-6)
            assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-5)
    # an unfinished hypothesis (no <eos> allowed): its words only
    (h,) = beam_search(ToyDecoder(), features[:1], None, DecodeConfig(beam_size=2, max_length=3, min_length=4),
                       BOS, EOS, UNK)[0]
    assert not h.finished and h.token_log_probs == pytest.approx(_toy_word_log_probs(0, h), abs=1e-6)


def test_greedy_and_sampled_token_log_probs() -> None:
    items = [1, 2, 4]
    features = torch.tensor(items, dtype=torch.float32).view(-1, 1, 1).expand(-1, 2, 3).contiguous()
    for item, h in zip(items, greedy_decode(ToyDecoder(), features, None, 5, BOS, EOS, unk=UNK, min_length=1),
                       strict=True):
        assert len(h.token_log_probs) == len(h.tokens) + h.finished
        assert h.token_log_probs == pytest.approx(_toy_word_log_probs(item, h), abs=1e-6)
    cfg = DecodeConfig(strategy="sample", num_samples=3, max_length=5, seed=1)
    for item, hyps in zip(items, decode_batch(ToyDecoder(), features, None, cfg, BOS, EOS, UNK), strict=True):
        for h in hyps:  # the distribution drawn from: <bos>, <pad>, <unk> banned, renormalised
            assert h.token_log_probs == pytest.approx(_toy_word_log_probs(item, h, allowed=[EOS, *TOY_WORDS]),
                                                      abs=1e-5)
            assert sum(h.token_log_probs) == pytest.approx(h.log_prob, abs=1e-5)
