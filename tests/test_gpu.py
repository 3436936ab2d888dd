"""The GPU paths on a CUDA device: bf16 autocast, decoding on the device, the Python API, the fused
kernels and the benchmarks' peak memory.

Marked ``gpu`` and skipped where ``torch.cuda.is_available()`` is false (CPU CI); ``make gpu-check``
(``scripts/gpu_check.sh``) runs them first on a GPU machine.  The models and batches are the CPU
tests' own (``test_decoders``, ``test_kernels``, ``test_search``, ``test_api``), so each check here
is its CPU counterpart moved to the device.  fp32 here means fp32: TF32 is switched off for
products and convolutions, so CPU and CUDA differ only by summation order.

Tolerances: fp32 on CUDA vs the CPU or the reference path, loss parts to ``assert_close``'s float32
default (rtol 1.3e-6, atol 1e-5), gradients atol 1e-5 / rtol 1e-4, beam scores 1e-4 absolute (the
Captioner's: 1e-5 per summed word log-prob, reasoned out at that test); bf16
autocast vs fp32, the cross-entropy within 1% and all the gradients (one vector) within 10% of their
norm (bf16 keeps 8 bits of mantissa; on a CPU's bf16 autocast these test models differ by at most
0.04% and 3.4%).
"""

from __future__ import annotations

import pytest
import torch
from test_decoders import CASES, IDS, _batch, _decoder

from captioning.models.decoders import build_decoder, decoder_class
from captioning.models.search import (
    DecodeConfig,
    beam_search,
    decode_batch,
    greedy_decode,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]

CUDA = torch.device("cuda")
BOS, EOS, UNK = 1, 2, 3
LSTM_EXAMPLES = decoder_class("lstm").examples()


@pytest.fixture(autouse=True)
def exact_fp32():
    """No TF32 in fp32 products or convolutions while a test runs (restored afterwards)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _toy_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(6, 4, 6, generator=g, requires_grad=True)
    mask = torch.ones(6, 4, dtype=torch.bool)
    mask[1, 2:] = False
    mask[4, 3:] = False
    tokens = torch.tensor([[1, 4, 5, 6, 2, 0], [1, 7, 8, 2, 0, 0], [1, 9, 10, 11, 4, 2],
                           [1, 5, 5, 2, 0, 0], [1, 6, 2, 0, 0, 0], [1, 11, 10, 9, 2, 0]])
    return feats, mask, tokens


def _loss_and_grads(dec, feats, mask, tokens, seed: int) -> tuple[dict, dict]:
    dec.zero_grad(set_to_none=True)
    feats.grad = None
    torch.manual_seed(seed)  # hard attention samples: the same draws on both paths
    out = dec.compute_loss(feats, mask, tokens, label_smoothing=0.1)
    out["loss"].backward()
    grads = {n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}
    grads["<features>"] = feats.grad.clone()
    return {k: v.detach() for k, v in out.items()}, grads


def _grads(dec: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in dec.named_parameters() if p.grad is not None}


def _relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """``|a - b| / |b|`` over all the gradients together (one vector)."""
    diff = torch.cat([(a[n].float() - b[n].float()).flatten() for n in b])
    return float(diff.norm() / torch.cat([b[n].float().flatten() for n in b]).norm())


# ------------------------------------------------------------------------------ bf16 autocast


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_bf16_autocast_training_loss(name: str, i: int) -> None:
    """Under ``torch.autocast(bfloat16)`` (what ``trainer=gpu``'s bf16-mixed does) the vocabulary
    logits are bf16, the loss parts come out float32 and finite, the weights stay float32 and
    their gradients are float32, finite and close to the fp32 step's."""
    dec = _decoder(name, i).to(CUDA).train()
    feats, mask, tokens = (t.to(CUDA) for t in _batch())
    torch.manual_seed(3)
    ref = dec.compute_loss(feats, mask, tokens)
    ref["loss"].backward()
    g_ref = _grads(dec)
    dec.zero_grad(set_to_none=True)

    logits: list[torch.dtype] = []
    hook = dec.out_vocab.register_forward_hook(lambda _m, _i, out: logits.append(out.dtype))
    torch.manual_seed(3)  # hard attention: the same soft/sampled choice as the fp32 step
    with torch.autocast(CUDA.type, dtype=torch.bfloat16):
        out = dec.compute_loss(feats, mask, tokens)
    hook.remove()
    out["loss"].backward()  # outside autocast, as Lightning does
    assert logits and set(logits) == {torch.bfloat16}, logits
    for key in ("loss", "xe"):
        assert out[key].dtype == torch.float32 and torch.isfinite(out[key]), (key, out[key])
    g = _grads(dec)
    assert g.keys() == g_ref.keys()
    for n, p in dec.named_parameters():
        assert p.dtype == torch.float32, n
    for n, grad in g.items():
        assert grad.dtype == torch.float32 and bool(torch.isfinite(grad).all()), n
    if getattr(dec, "hard", False):
        return  # sampled locations may differ with the attention's rounding: no closeness claim
    torch.testing.assert_close(out["xe"], ref["xe"], rtol=0.01, atol=0.0)
    assert _relative_error(g, g_ref) <= 0.1


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_bf16_autocast_decoding_step_gives_float32_log_probs(name: str, i: int) -> None:
    dec = _decoder(name, i).to(CUDA).eval()
    feats, mask, _ = (t.to(CUDA) for t in _batch())
    with torch.no_grad(), torch.autocast(CUDA.type, dtype=torch.bfloat16):
        state = dec.init_state(feats, mask)
        lp, alpha, _ = dec.step(torch.full((feats.shape[0],), BOS, device=CUDA), state)
    assert lp.dtype == torch.float32 and lp.device.type == CUDA.type
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(feats.shape[0], device=CUDA), rtol=0, atol=1e-3)
    if alpha is not None:
        assert alpha.device.type == CUDA.type
        real = alpha.float().sum(-1)
        torch.testing.assert_close(real, torch.ones_like(real), rtol=0, atol=1e-2)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_eager_training_loss_on_cuda_equals_the_cpu(name: str, i: int) -> None:
    """The eager step on CUDA (one product of h_{t-1}; the LSTM's pointwise update one fused kernel,
    ``_thnn_fused_lstm_cell``, as ``nn.LSTMCell`` runs there) computes the CPU's loss and gradients,
    fp32, to the tolerances of the module docstring; packed and static schedules."""
    dec = _decoder(name, i).train()
    if getattr(dec, "hard", False):
        pytest.skip("hard attention samples its locations: the devices draw differently")
    feats, mask, tokens = _batch()
    for static in (False, True):
        runs = []
        for device in (torch.device("cpu"), CUDA):
            dec.to(device).zero_grad(set_to_none=True)
            out = dec.compute_loss(feats.to(device), mask.to(device), tokens.to(device), static=static)
            out["loss"].backward()
            runs.append(({k: v.detach().cpu() for k, v in out.items()}, {n: g.cpu() for n, g in _grads(dec).items()}))
        (cpu, g_cpu), (gpu, g_gpu) = runs
        for key in cpu:
            torch.testing.assert_close(gpu[key], cpu[key], msg=key)
        for n in g_cpu:
            torch.testing.assert_close(g_gpu[n], g_cpu[n], atol=1e-5, rtol=1e-4, msg=n)


# ------------------------------------------------------------------------------ the fast step


@pytest.mark.parametrize("k", range(len(LSTM_EXAMPLES)), ids=[e["variant"] for e in LSTM_EXAMPLES])
def test_the_fast_step_on_cuda_equals_the_plain_step(k: int) -> None:
    """``FastStep`` (one product of h_{t-1}, weights cast once, the LSTM update as one fused kernel
    on CUDA) == ``plain_step`` (the modules, ``nn.LSTMCell``) on CUDA, fp32: same loss parts and
    gradients (incl. the features')."""
    torch.manual_seed(0)
    fast = build_decoder(LSTM_EXAMPLES[k], 12, 6, layout=(2, 2)).to(CUDA).train()
    plain_dec = build_decoder({**LSTM_EXAMPLES[k], "fast_step": False}, 12, 6, layout=(2, 2)).to(CUDA).train()
    plain_dec.load_state_dict(fast.state_dict())
    feats, mask, tokens = _toy_batch(1)
    feats = feats.detach().to(CUDA).requires_grad_(True)
    mask, tokens = mask.to(CUDA), tokens.to(CUDA)
    got, g_got = _loss_and_grads(fast, feats, mask, tokens, seed=5)
    want, g_want = _loss_and_grads(plain_dec, feats, mask, tokens, seed=5)
    assert got.keys() == want.keys()
    for key in got:
        assert got[key].device.type == CUDA.type
        torch.testing.assert_close(got[key], want[key], msg=key)
    assert g_got.keys() == g_want.keys()
    for name in g_want:
        torch.testing.assert_close(g_got[name], g_want[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("k", [2, 3], ids=["soft_attention", "soft_attention-general-2layers"])
def test_the_fast_step_under_bf16_autocast_agrees_with_the_plain_step(k: int) -> None:
    """The same under bf16 autocast: the fast step computes in bf16 with autocast off inside its loop,
    the plain step lets autocast pick per module, so they agree to bf16 rounding only."""
    torch.manual_seed(0)
    runs = []
    for fast in (True, False):
        torch.manual_seed(0)
        dec = build_decoder({**LSTM_EXAMPLES[k], "fast_step": fast}, 12, 6, layout=(2, 2)).to(CUDA).train()
        feats, mask, tokens = (t.to(CUDA) for t in _toy_batch(2))
        torch.manual_seed(1)
        with torch.autocast(CUDA.type, dtype=torch.bfloat16):
            out = dec.compute_loss(feats, mask, tokens, label_smoothing=0.1)
        out["loss"].backward()
        runs.append((out, _grads(dec)))
    (a, g_a), (b, g_b) = runs
    torch.testing.assert_close(a["xe"], b["xe"], rtol=0.01, atol=0.0)
    assert g_a.keys() == g_b.keys() and all(g.dtype == torch.float32 for g in g_a.values())
    assert _relative_error(g_a, g_b) <= 0.1


# ------------------------------------------------------------------------------ decoding


class DeviceProbe:
    """A decoder whose ``init_state``/``step`` outputs are checked: every tensor on ``device``."""

    def __init__(self, decoder, device: torch.device) -> None:
        self.decoder, self.device, self.tensors = decoder, device, 0

    def __getattr__(self, name: str):
        return getattr(self.decoder, name)

    def _check(self, *values) -> None:
        for v in values:
            if isinstance(v, torch.Tensor):
                assert v.device.type == self.device.type, (v.shape, v.device)
                self.tensors += 1
            elif hasattr(v, "rows"):  # DecoderState
                self._check(*v.rows.values(), *v.memory.values())

    def init_state(self, features, mask):
        state = self.decoder.init_state(features, mask)
        self._check(state)
        return state

    def step(self, prev, state):
        self._check(prev, state)
        out = self.decoder.step(prev, state)
        self._check(*out)
        return out


def _peaky(name: str, i: int):
    """A test_decoders example with a sharper output layer (as test_search's models): no near-ties
    between CPU and CUDA arithmetic."""
    dec = _decoder(name, i, seed=4).eval()
    with torch.no_grad():
        dec.out_vocab.weight.mul_(3.0)
    return dec


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_greedy_and_beam_on_cuda_stay_on_the_device_and_equal_cpu(name: str, i: int) -> None:
    dec = _peaky(name, i)
    feats, mask, _ = _batch(7)
    cfg = DecodeConfig(beam_size=3, max_length=6, min_length=1, length_penalty="gnmt", n_best=2)
    cpu_beam = beam_search(dec, feats, mask, cfg, BOS, EOS, UNK)
    cpu_greedy = greedy_decode(dec, feats, mask, 6, BOS, EOS, unk=UNK)
    probe = DeviceProbe(dec.to(CUDA), CUDA)
    gpu_beam = beam_search(probe, feats.to(CUDA), mask.to(CUDA), cfg, BOS, EOS, UNK)
    gpu_greedy = greedy_decode(probe, feats.to(CUDA), mask.to(CUDA), 6, BOS, EOS, unk=UNK)
    assert probe.tensors > 0
    pairs = [*zip(cpu_greedy, gpu_greedy, strict=True)]
    pairs += [p for a, b in zip(cpu_beam, gpu_beam, strict=True) for p in zip(a, b, strict=True)]
    for c, g in pairs:
        assert g.tokens == c.tokens
        assert g.score == pytest.approx(c.score, abs=1e-4)
        if c.attention is not None:  # results come back to the host as float32 (the search's contract)
            assert g.attention.device.type == "cpu" and g.attention.dtype == torch.float32
            torch.testing.assert_close(g.attention, c.attention, rtol=0, atol=1e-4)


def test_seeded_sampling_on_cuda_is_repeatable_and_stays_on_the_device() -> None:
    dec = _peaky(*CASES[0]).to(CUDA)
    feats, mask, _ = _batch(8)
    cfg = DecodeConfig(strategy="sample", num_samples=3, max_length=5, seed=11, temperature=1.5)
    runs = []
    for _ in range(2):
        probe = DeviceProbe(dec, CUDA)
        runs.append(decode_batch(probe, feats.to(CUDA), mask.to(CUDA), cfg, BOS, EOS, UNK))
        assert probe.tensors > 0
    assert [[h.tokens for h in item] for item in runs[0]] == [[h.tokens for h in item] for item in runs[1]]
    vocab = set(range(int(dec.vocab_size))) - {0, BOS, UNK}
    assert all(len(item) == 3 and all(set(h.tokens) <= vocab for h in item) for item in runs[0])


# ------------------------------------------------------------------------------ the Python API


@pytest.fixture(scope="module")
def api_checkpoint(tmp_path_factory) -> dict:
    """test_api's untrained soft-attention checkpoint over a random-weight EfficientNet-Lite0 and
    its three photos (a coloured square in a different corner each)."""
    from test_api import _image, _meta, _vocab
    from test_caption_cli import save_checkpoint

    tmp = tmp_path_factory.mktemp("gpu_api")
    (tmp / "photos").mkdir()
    colours = [(220, 30, 30), (30, 200, 40), (40, 40, 220)]
    images = [_image(tmp / "photos" / f"p{i}.png", c, i) for i, c in enumerate(colours)]
    ckpt = save_checkpoint(tmp / "soft.ckpt", _meta("image"), _vocab(), {}, tmp, seed=1)
    return {"ckpt": ckpt, "images": images, "tmp": tmp}


def test_captioner_on_cuda_equals_cpu_and_draws_heatmaps(api_checkpoint) -> None:
    """``Captioner`` (backbone + decoder) on CUDA: the same captions as on the CPU, attention rows
    to 1e-4, and the per-word heatmap figures written."""
    from PIL import Image

    from captioning import Captioner

    images = api_checkpoint["images"]
    cpu = Captioner.from_checkpoint(api_checkpoint["ckpt"], device="cpu").caption(images, beam_size=3)
    gpu_model = Captioner.from_checkpoint(api_checkpoint["ckpt"], device="cuda")
    assert gpu_model.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in gpu_model.module.parameters())
    gpu = gpu_model.caption(images, beam_size=3)
    assert [r.ok for r in gpu] == [True] * len(images)
    for c, g in zip(cpu, gpu, strict=True):
        # The score sums len(tokens) + 1 word log-probs.  fp32 on both sides (TF32 off), so they differ
        # only by the order of summation: each product of K terms (K <= 2048 here) rounds differently by
        # ~sqrt(K) 2^-24 ~ 3e-6 relative, and the backbone's ~60 layers and the decoder's recurrence carry
        # those differences to every word, so one word's log-prob (|log p| < ~10) differs by up to ~1e-5
        # late in a caption (a 40-word caption differed by 1.5e-4 in all, 3.7e-6 per word, on an H200).
        # The differences do not cancel reliably (they share the state), so they add: 1e-5 per word.
        assert g.tokens == c.tokens and g.score == pytest.approx(c.score, abs=1e-5 * (len(c.tokens) + 1))
        assert g.attention.shape == c.attention.shape
        assert abs(g.attention - c.attention).max() <= 1e-4
    for k, r in enumerate(gpu):
        png = r.figure(api_checkpoint["tmp"] / f"heatmap{k}.png")
        width, height = Image.open(png).size
        assert width > 200 and height > 100


# ------------------------------------------------------------------------------ benchmarks


def test_benchmarks_report_peak_memory_on_cuda() -> None:
    """``peak_memory_mb`` of the train and beam benchmarks: present on cuda, and a batch 4x larger
    takes more memory (the activations grow with it)."""
    from conftest import run_bench

    sizes = "--regions 49 --feature-dim 256 --hidden 128 --attention-dim 64 --embed 64 --vocab 500"
    peaks = []
    for batch in (8, 32):
        (ours,) = run_bench("train", f"--device cuda --batch-size {batch} {sizes} --length 8 --steps 2 "
                                     f"--warmup 1 --skip-baseline")
        assert ours["device"] == "cuda" and ours["amp"] == "bf16"
        peaks.append(ours["peak_memory_mb"])
    assert 0 < peaks[0] < peaks[1], peaks
    beam = run_bench("beam", f"--device cuda --batch-size 8 --beam 3 {sizes} --length 6 --single-items 2")
    assert beam[0]["name"] == "beam/batched" and beam[0]["peak_memory_mb"] > 0


# ------------------------------------------------------------------------------ the training input path


def _tiny_store(tmp_path):
    import numpy as np

    from captioning.data.records import CaptionRecord
    from captioning.store.feature_store import FeatureStore
    from captioning.store.writer import FeatureStoreWriter

    meta = {"settings": {"t": 1}, "kind": "image", "positions": 6, "dim": 8, "grid": [2, 3], "dtype": "float16"}
    caps = ["a red circle", "a blue square on the left", "red", "a circle and a square"]
    records = [CaptionRecord(f"id{i}", i, f"{i}.jpg", tuple(caps[(i + k) % 4] for k in range(3)), "train")
               for i in range(30)]
    with FeatureStoreWriter(tmp_path / "store", meta, shard_size=8) as w:
        for i in range(30):
            w.add(f"id{i}", (np.random.default_rng(i).normal(size=(6, 8))).astype(np.float16), valid=1 + i % 6)
    return records, FeatureStore.open(tmp_path / "store")


@pytest.mark.parametrize("cache", ["none", "device"])
def test_the_gpu_input_path_gives_the_cpu_loaders_batches(tmp_path, cache: str) -> None:
    """On CUDA, batches copied ahead on a side stream (``PrefetchLoader``, ``when_ready``) or gathered
    from the device cache equal the CPU loader's, in order, over two epochs."""
    from captioning.data.datamodule import CaptionDataModule
    from captioning.data.vocab import Vocabulary

    records, store = _tiny_store(tmp_path)
    vocab = Vocabulary.build([c.split() for r in records for c in r.captions])

    class OnDevice:
        def __init__(self, device):
            self.strategy, self.current_epoch = type("S", (), {"root_device": device})(), 0

    got = {}
    for name, device, setting in (("cpu", torch.device("cpu"), "none"), ("gpu", CUDA, cache)):
        dm = CaptionDataModule({"train": records, "val": records[:2]}, store, vocab, max_length=6, batch_size=6,
                               num_workers=0, cache=setting, seed=1)
        dm.trainer = OnDevice(device)
        batches = []
        for epoch in range(2):
            torch.manual_seed(epoch)
            for b in dm.train_dataloader():
                b = dm.on_after_batch_transfer(b.to(device), 0)
                batches.append([t.cpu() for t in (b.features, b.mask, b.tokens, b.index)])
        got[name] = batches
    assert len(got["gpu"]) == len(got["cpu"]) > 4
    for a, b in zip(got["gpu"], got["cpu"], strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
