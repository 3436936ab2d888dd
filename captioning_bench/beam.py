"""``captioning-bench beam``: batched beam search vs one item at a time (same code, batch 1).

A soft-attention ``LSTMDecoder`` (random weights, Show-Attend-Tell COCO sizes by default)
decodes ``--batch-size`` items with ``beam_search`` in one call (all items x beams as
``B*K`` rows per decoder step, the beams of an item sharing its keys/values), and the same
function is called on items one by one.  Reported: captions/s of each (median over
``--repeats`` alternating runs) and the speedup (``best``: from the fastest runs); on cuda
``beam/batched`` also gives ``peak_memory_mb``, the most memory allocated during its first timed
run (the decoder's weights, the features and the search's B*K rows).

With random weights <eos> is rarely chosen, so most hypotheses run to ``--length`` words:
the worst case for both paths.  ``--eos-bias`` makes the model stop earlier.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from captioning.models.decoders import build_decoder
from captioning.models.search import DecodeConfig, beam_search

BOS, EOS, UNK = 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--regions", type=int, default=196)
    parser.add_argument("--feature-dim", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--attention-dim", type=int, default=512)
    parser.add_argument("--embed", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--length", type=int, default=20, help="max caption words")
    parser.add_argument("--length-penalty", default="gnmt", choices=["none", "gnmt", "avg"])
    parser.add_argument(
        "--single-items",
        type=int,
        default=8,
        help="items decoded one at a time for the baseline (captions/s is per item)",
    )
    parser.add_argument("--eos-bias", type=float, default=0.0, help="added to the <eos> logit")
    parser.add_argument(
        "--amp",
        default="auto",
        choices=["auto", "bf16", "off"],
        help="bf16 autocast for both paths (auto = bf16 on cuda, off on cpu)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternating runs of both paths (median kept)"
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--seed", type=int, default=0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decoder(args: Any, device: torch.device) -> torch.nn.Module:
    """The soft-attention ``LSTMDecoder`` both paths decode with (random weights, eval mode; the
    <eos> logit raised by ``--eos-bias``)."""
    cfg = dict(
        variant="soft_attention",
        embed_dim=args.embed,
        hidden_dim=args.hidden,
        attention_dim=args.attention_dim,
        dropout=0.0,
    )
    dec = build_decoder(cfg, args.vocab, args.feature_dim).to(device).eval()
    if args.eos_bias:
        with torch.no_grad():
            dec.out_vocab.bias[EOS] += args.eos_bias
    return dec


def _features(args: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random non-negative features [B, N, C] (seeded) and an all-valid mask [B, N]."""
    g = torch.Generator().manual_seed(args.seed)
    feats = torch.relu(torch.randn(args.batch_size, args.regions, args.feature_dim, generator=g))
    feats = feats.to(device)
    mask = torch.ones(args.batch_size, args.regions, dtype=torch.bool, device=device)
    return feats, mask


def _autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16 autocast when ``amp == "bf16"``, else nothing."""
    if amp == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


@dataclass
class _Runs:
    """Seconds of each timed run of both paths, the hypotheses of their last runs, and the peak
    memory of the first batched run (None off cuda)."""

    batched_s: list[float] = field(default_factory=list)
    single_s: list[float] = field(default_factory=list)
    batched: list = field(default_factory=list)
    single: list = field(default_factory=list)
    peak_mb: float | None = None


def _alternate(
    batched: Callable[[], list], single: Callable[[], list], repeats: int, device: torch.device
) -> _Runs:
    """Time ``repeats`` runs of each path, alternating, so a busy machine slows both alike."""
    runs = _Runs()
    for _ in range(max(1, repeats)):
        _sync(device)
        if device.type == "cuda" and runs.peak_mb is None:
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        runs.batched = batched()
        _sync(device)
        runs.batched_s.append(time.perf_counter() - t0)
        if device.type == "cuda" and runs.peak_mb is None:
            runs.peak_mb = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        t0 = time.perf_counter()
        runs.single = single()
        _sync(device)
        runs.single_s.append(time.perf_counter() - t0)
    return runs


def _shape(args: Any, device: torch.device, amp: str) -> dict:
    """The sizes every record of this run carries."""
    return {
        "device": device.type,
        "beam": args.beam,
        "batch_size": args.batch_size,
        "regions": args.regions,
        "feature_dim": args.feature_dim,
        "hidden": args.hidden,
        "attention_dim": args.attention_dim,
        "embed": args.embed,
        "vocab": args.vocab,
        "length": args.length,
        "amp": amp,
        "threads": torch.get_num_threads(),
    }


def _records(args: Any, runs: _Runs, n_single: int, shape: dict) -> list[dict]:
    """``beam/batched``, ``beam/one_at_a_time`` (with how many of its captions equal the batched
    ones) and ``beam/speedup``; value: from the median run, best: from the fastest."""
    same = sum(
        int(a[0].tokens == b[0].tokens)
        for a, b in zip(runs.batched[:n_single], runs.single, strict=True)
    )
    mean_len = sum(len(h[0].tokens) for h in runs.batched) / max(1, len(runs.batched))
    batched_cps = args.batch_size / statistics.median(runs.batched_s)
    single_cps = n_single / statistics.median(runs.single_s)
    best_ratio = (args.batch_size / min(runs.batched_s)) / (n_single / min(runs.single_s))
    return [
        {
            "name": "beam/batched",
            "unit": "captions/s",
            "value": round(batched_cps, 2),
            "mean_words": round(mean_len, 2),
            **({"peak_memory_mb": runs.peak_mb} if runs.peak_mb is not None else {}),
            **shape,
        },
        {
            "name": "beam/one_at_a_time",
            "unit": "captions/s",
            "value": round(single_cps, 2),
            "items": n_single,
            "same_captions_as_batched": f"{same}/{n_single}",
            **shape,
        },
        {
            "name": "beam/speedup",
            "unit": "x",
            "value": round(batched_cps / single_cps, 2),
            "best": round(best_ratio, 2),
            "repeats": max(1, args.repeats),
            "target": 10.0,
            **shape,
        },
    ]


def run(args: Any) -> list[dict]:
    device = torch.device(args.device)
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dec = _decoder(args, device)
    feats, mask = _features(args, device)
    bcfg = DecodeConfig(
        beam_size=args.beam,
        max_length=args.length,
        min_length=1,
        length_penalty=args.length_penalty,
        n_best=1,
    )
    amp = args.amp if args.amp != "auto" else ("bf16" if device.type == "cuda" else "off")
    n_single = max(1, min(args.single_items, args.batch_size))

    def batched() -> list:
        with _autocast(device, amp):
            return beam_search(dec, feats, mask, bcfg, BOS, EOS, UNK)

    def single() -> list:
        out = []
        with _autocast(device, amp):
            for i in range(n_single):
                out.extend(beam_search(dec, feats[i : i + 1], mask[i : i + 1], bcfg, BOS, EOS, UNK))
        return out

    # warm-up (allocator, kernels) on a small slice
    with _autocast(device, amp):
        beam_search(dec, feats[:2], mask[:2], bcfg, BOS, EOS, UNK)
    runs = _alternate(batched, single, args.repeats, device)
    return _records(args, runs, n_single, _shape(args, device, amp))
