"""Every registered decoder runs on any device: no tensor of theirs is made on the default device.

A factory call without ``device=`` (``torch.arange(n)``, ``torch.zeros(...)``) makes its tensor on
the DEFAULT device, which on a GPU machine is still the CPU: the Transformer once failed on CUDA
that way (``positions.sinusoid`` built its frequencies on the CPU) while every CPU test passed.
Here the weights and the data stay on the CPU and the default device is ``meta``
(``torch.device("meta")`` as a context, PyTorch's DeviceContext): such a tensor lands on ``meta``
and the first operation that mixes it with the data fails ("Tensor on device meta is not on the
expected device cpu"), so the class of bug fails on a machine without a GPU.  Host-side work that
is meant to be on the CPU names ``device="cpu"``.

Covered for every example config of every registered decoder: the training loss (packed and
static) and its backward, greedy decoding, batched beam search with n-best lists, sampling, an
ensemble of two members, and a self-critical (SCST) training step.
"""

from __future__ import annotations

import pytest
import torch
from test_decoders import CASES, IDS, LAYOUT, C, N, V, _batch, _decoder

from captioning.metrics.cider import CiderD
from captioning.models.decoders import decoder_class
from captioning.models.ensemble import EnsembleDecoder
from captioning.models.positions import sinusoid
from captioning.models.search import DecodeConfig, beam_search, decode_batch, greedy_decode, sample

BOS, EOS, UNK = 1, 2, 3


def _on_cpu(*values) -> None:
    for v in values:
        assert v.device.type == "cpu", (tuple(v.shape), v.device)


def test_the_default_device_check_catches_a_tensor_made_without_device() -> None:
    """The check itself: the sinusoid of a position code, built as it once was (frequencies on the
    default device), fails under it; built on the positions' device it passes."""
    positions = torch.arange(5)

    def on_default_device(p: torch.Tensor) -> torch.Tensor:
        freq = torch.exp(-torch.arange(4, dtype=torch.float32))  # no device=: the default one
        return p.float().unsqueeze(1) * freq

    with torch.device("meta"), pytest.raises(RuntimeError, match="meta"):
        on_default_device(positions)
    with torch.device("meta"):
        _on_cpu(sinusoid(positions, 8))


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_training_losses_make_no_tensor_on_the_default_device(name: str, i: int) -> None:
    dec = _decoder(name, i).train()
    feats, mask, tokens = _batch()
    with torch.device("meta"):
        for static in (False, True) if dec.compilable else (False,):
            out = dec.compute_loss(feats, mask, tokens, label_smoothing=0.1, static=static)
            out["loss"].backward()
            _on_cpu(*out.values())
            _on_cpu(*(p.grad for p in dec.parameters() if p.grad is not None))


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_decoding_makes_no_tensor_on_the_default_device(name: str, i: int) -> None:
    dec = _decoder(name, i).eval()
    feats, mask, _ = _batch()
    members = EnsembleDecoder([dec, _decoder(name, i, seed=1).eval()])
    cfg = DecodeConfig(beam_size=3, max_length=5, length_penalty="gnmt", n_best=2)
    sampling = DecodeConfig(strategy="sample", num_samples=2, max_length=5, seed=3, top_k=5)
    with torch.device("meta"):
        for model in (dec, members):
            for hyp in greedy_decode(model, feats, mask, 5, BOS, EOS, unk=UNK):
                assert hyp.tokens is not None and (hyp.attention is None or hyp.attention.device.type == "cpu")
            assert all(len(hyps) == 2 for hyps in beam_search(model, feats, mask, cfg, BOS, EOS, UNK))
            assert all(len(hyps) == 2 for hyps in decode_batch(model, feats, mask, sampling, BOS, EOS, UNK))


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_a_self_critical_step_makes_no_tensor_on_the_default_device(name: str, i: int) -> None:
    from captioning.train.module import CaptioningModule

    torch.manual_seed(0)
    vocab = {"itos": ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{k}" for k in range(V - 4)]}
    meta = {"kind": "image", "positions": N, "dim": C, "grid": list(LAYOUT), "dtype": "float16",
            "settings": {"backbone": "toy"}}
    config = {"model": decoder_class(name).examples()[i], "stage": "scst",
              "scst": {"samples": 2, "max_length": 4, "xe_weight": 0.5, "entropy_weight": 0.01}}
    module = CaptioningModule.from_hparams(config, vocab, meta).train()
    module.scst.reward = CiderD([["w1 w2 w3".split(), "w2 w4".split()]] * 5)
    feats, mask, tokens = _batch()
    from captioning.data.datamodule import Batch

    batch = Batch(feats.half(), mask, tokens, torch.arange(5))
    with torch.device("meta"):
        out = module.scst.loss(module, batch)
        out["loss"].backward()
    _on_cpu(*out.values())
    drawn = None
    with torch.device("meta"), torch.no_grad():
        drawn = sample(module.decoder, feats, mask, n=2, max_length=4, bos=BOS, eos=EOS, banned=[0, BOS, UNK])
    _on_cpu(drawn.tokens, drawn.log_probs)
