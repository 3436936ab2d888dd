"""The decoder protocol, for EVERY registered decoder and each of its example configs.

What beam search, sampling, the LightningModule and the caption job rely on: a finite loss that
training lowers, teacher forcing == the step path, greedy == beam of width 1, batched beam ==
beam per item, attention rows that sum to 1 over the real positions, the static schedule == the
packed one, and a checkpoint round trip through ``load_captioner``.
"""

from __future__ import annotations

import functools

import pytest
import torch

from captioning.models.decoders import build_decoder, decoder_class, decoder_names
from captioning.models.search import DecodeConfig, beam_search, greedy_decode

PAD, BOS, EOS, UNK = 0, 1, 2, 3
V, C, LAYOUT = 12, 6, (2, 2)
N = 4

CASES = [(name, i) for name in decoder_names() for i in range(len(decoder_class(name).examples()))]
IDS = [f"{name}-{i}" for name, i in CASES]


def _decoder(name: str, i: int, seed: int = 0):
    torch.manual_seed(seed)
    return build_decoder(decoder_class(name).examples()[i], V, C, layout=LAYOUT)


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(5, N, C, generator=g)
    mask = torch.ones(5, N, dtype=torch.bool)
    mask[1, 2:] = False
    mask[3, 3:] = False
    tokens = torch.tensor([[1, 4, 5, 6, 2, 0], [1, 7, 8, 2, 0, 0], [1, 9, 10, 11, 4, 2],
                           [1, 5, 5, 2, 0, 0], [1, 6, 2, 0, 0, 0]])
    return feats, mask, tokens


def test_registry_lists_the_lstm_family() -> None:
    assert "lstm" in decoder_names()
    assert {c["variant"] for c in decoder_class("lstm").examples()} >= {
        "show_tell", "mean_pool", "soft_attention", "hard_attention"}


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_loss_is_finite_and_training_lowers_it(name: str, i: int) -> None:
    dec = _decoder(name, i).train()
    feats, mask, tokens = _batch()
    opt = torch.optim.Adam(dec.parameters(), lr=2e-2)
    xes = []
    for _ in range(30):
        out = dec.compute_loss(feats, mask, tokens)
        assert torch.isfinite(out["loss"]) and {"loss", "xe"} <= set(out)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        xes.append(float(out["xe"].detach()))
    assert xes[-1] < 0.5 * xes[0], xes


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_teacher_forcing_equals_the_step_path_and_attention_rows_sum_to_one(name: str, i: int) -> None:
    dec = _decoder(name, i, seed=1).eval()
    feats, mask, tokens = _batch(1)
    with torch.no_grad():
        xe = float(dec.compute_loss(feats, mask, tokens)["xe"])
        state = dec.init_state(feats, mask)
        total, count = 0.0, 0
        for t in range(tokens.shape[1] - 1):
            lp, alpha, state = dec.step(tokens[:, t], state)
            assert lp.dtype == torch.float32 and lp.shape == (5, V)
            tgt = tokens[:, t + 1]
            real = tgt != PAD
            total -= float(lp[real].gather(1, tgt[real].unsqueeze(1)).sum())
            count += int(real.sum())
            assert (alpha is not None) == dec.has_attention
            if alpha is not None:
                assert alpha.shape == (5, N)
                assert torch.all(alpha[~mask] == 0)
                torch.testing.assert_close(alpha.sum(-1), torch.ones(5))
    assert xe == pytest.approx(total / count, rel=1e-5)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_greedy_equals_beam_of_width_one(name: str, i: int) -> None:
    dec = _decoder(name, i, seed=2).eval()
    feats, mask, _ = _batch(2)
    greedy = greedy_decode(dec, feats, mask, 7, BOS, EOS, unk=UNK, min_length=1)
    beam = beam_search(dec, feats, mask, DecodeConfig(beam_size=1, max_length=7), BOS, EOS, UNK)
    for g, b in zip(greedy, beam, strict=True):
        assert g.tokens == b[0].tokens
        assert g.score == pytest.approx(b[0].score, abs=1e-5)
        if dec.has_attention:
            torch.testing.assert_close(g.attention, b[0].attention)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_batched_beam_equals_beam_per_item(name: str, i: int) -> None:
    dec = _decoder(name, i, seed=3).eval()
    with torch.no_grad():  # a less flat output so beams differ
        for p in dec.parameters():
            p.mul_(2.0)
    feats, mask, _ = _batch(3)
    cfg = DecodeConfig(beam_size=3, max_length=6, length_penalty="gnmt", n_best=2)
    batched = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    for k in range(feats.shape[0]):
        single = beam_search(dec, feats[k: k + 1], mask[k: k + 1], cfg, BOS, EOS, UNK)[0]
        assert [h.tokens for h in batched[k]] == [h.tokens for h in single]
        for hb, hs in zip(batched[k], single, strict=True):
            assert hb.score == pytest.approx(hs.score, abs=1e-4)
            if dec.has_attention:
                torch.testing.assert_close(hb.attention, hs.attention, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_static_schedule_equals_the_packed_one(name: str, i: int) -> None:
    dec = _decoder(name, i, seed=4).eval()
    if not dec.compilable:
        pytest.skip(f"{name} example {i} is not compilable (hard attention samples on the host)")
    feats, mask, tokens = _batch(4)
    packed = dec.compute_loss(feats, mask, tokens)
    static = functools.partial(dec.compute_loss, static=True)(feats, mask, tokens)
    for key in ("loss", "xe"):
        torch.testing.assert_close(static[key], packed[key], msg=key)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_checkpoint_round_trip(name: str, i: int, tmp_path) -> None:
    from captioning.train.checkpoint import load_captioner
    from captioning.train.module import CaptioningModule

    torch.manual_seed(5)
    vocab = {"itos": ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{k}" for k in range(V - 4)]}
    meta = {"kind": "image", "positions": N, "dim": C, "grid": list(LAYOUT), "dtype": "float16",
            "settings": {"backbone": "toy"}}
    config = {"model": decoder_class(name).examples()[i], "decode": {"beam_size": 2, "max_length": 5}}
    model = CaptioningModule.from_hparams(config, vocab, meta).eval()
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, path)
    loaded = load_captioner(path)
    assert type(loaded.decoder) is type(model.decoder)
    feats, mask, tokens = _batch(5)
    a = model.decode(feats, mask, model.settings.decode)
    b = loaded.decode(feats, mask, loaded.settings.decode)
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]
    torch.testing.assert_close(loaded.decoder.compute_loss(feats, mask, tokens)["loss"],
                               model.decoder.compute_loss(feats, mask, tokens)["loss"])


@pytest.mark.parametrize("static", [False, True], ids=["packed", "static"])
@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_a_per_image_batch_equals_the_per_caption_batch_of_the_same_captions(name: str, i: int, static: bool) -> None:
    """Three items with two captions each: ``features [3,N,C]`` with ``tokens [6,T]`` grouped item by
    item (each item encoded once) gives the loss, every parameter's gradient and the features'
    gradient of ``features [6,N,C]``, each item repeated for its captions (one caption per row);
    with the host's ``lengths`` too (nothing read back)."""
    dec = _decoder(name, i, seed=4).eval()
    if static and not dec.compilable:
        pytest.skip("no static schedule")
    feats, mask, _ = _batch(4)
    feats, mask = feats[:3], mask[:3]
    tokens = torch.tensor([[1, 4, 5, 6, 2, 0], [1, 7, 2, 0, 0, 0], [1, 9, 10, 11, 4, 2],
                           [1, 5, 5, 2, 0, 0], [1, 6, 2, 0, 0, 0], [1, 8, 9, 10, 2, 0]])
    runs = []
    for grouped, lengths in ((True, None), (True, [4, 2, 5, 3, 2, 4]), (False, None)):
        x = feats.clone().requires_grad_(True)
        rows = x if grouped else x.repeat_interleave(2, 0)
        m = mask if grouped else mask.repeat_interleave(2, 0)
        dec.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        out = dec.compute_loss(rows, m, tokens, static=static, lengths=lengths)
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
        runs.append((out, grads, x.grad.clone()))
    (want, g_want, x_want) = runs[-1]
    for out, grads, x_grad in runs[:-1]:
        for key in ("loss", "xe"):
            torch.testing.assert_close(out[key], want[key], rtol=1e-5, atol=1e-6)
        assert grads.keys() == g_want.keys() and grads
        for n in grads:
            torch.testing.assert_close(grads[n], g_want[n], rtol=1e-4, atol=1e-6, msg=n)
        torch.testing.assert_close(x_grad, x_want, rtol=1e-4, atol=1e-6)
