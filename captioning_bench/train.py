"""``captioning-bench train``: decoder training throughput, ours vs a tutorial-style decoder.

Both models are the same soft-attention LSTM (Xu et al. 2015: additive attention, scalar
gate, h0/c0 from the mean annotation, doubly stochastic regulariser, dropout) trained with
Adam on the same random captions.  The baseline is written the way common tutorials write it:
one caption per row, the batch sorted by caption length and shrinking as captions end, ``U_a v``
recomputed at every step, the vocabulary projection inside the loop, fp32.  Ours is
``LSTMDecoder.compute_loss`` as the training job runs it: per-image batches (``--batching image``:
``round(batch-size / 5)`` items with 5 captions each, their keys ``U_a v`` projected once per item),
the caption lengths from the host, only the captions still running in each step, one output
projection for all real tokens after the loop; optional bf16 autocast.  ``--compile`` times
``compute_loss(static=True)`` under ``torch.compile`` instead: all rows at every step, one graph,
replayed from CUDA graphs on a GPU (where a decoder step's small kernels are launch-bound); on a
CPU it is slower than ``compute_loss`` (the padded steps run).  With tiny sizes (``--batch-size 8
--regions 16 --feature-dim 64 ...``) both models are bound by per-operation overhead, which is what
dominates on a GPU.  ``--cli`` adds the end-to-end view: ``captioning-train``'s steady-state steps/s
on a synthetic dataset of the same shapes, with its loader alone and its loop alone
(``captioning_bench.train_cli``), beside the benchmark's own step rate.

Reported: captions/s (forward + backward + Adam step) of each from the median step time
(``best``: from the fastest step), the two models' steps alternating so that a busy machine
slows both alike, and the speedup; eager, each model's ``ops_per_step`` (``dispatched_ops``: about
the kernels a step launches on a GPU, counted on any device).  On cuda, ``train/ours`` also gives ``peak_memory_mb``: the
most memory allocated during one of its steps, measured before the baseline exists (its weights,
gradients, Adam state, the batch and the step's activations).
Caption lengths are drawn uniformly from ``[length // 2, length]`` words (COCO-like), so the
baseline's shrinking batch saves real work.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from captioning.models.decoders import build_decoder
from captioning_bench.dispatch import dispatched_ops
from captioning_bench.train_cli import cli_figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--regions", type=int, default=196, help="annotation vectors N (14x14)")
    parser.add_argument("--feature-dim", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--attention-dim", type=int, default=512)
    parser.add_argument("--embed", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=10000)
    parser.add_argument("--length", type=int, default=20, help="max caption words")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per model")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--amp",
        default="auto",
        choices=["auto", "bf16", "off"],
        help="ours: bf16 autocast (auto = bf16 on cuda, off on cpu); the baseline stays fp32",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="ours: torch.compile LSTMDecoder.compute_loss(static=True) (fixed shapes, one graph; "
        "CUDA graphs on cuda); compile time reported apart",
    )
    parser.add_argument(
        "--deep-output",
        action="store_true",
        help="ours: Xu's deep output layer (more work than the baseline's plain softmax)",
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument(
        "--cli",
        action="store_true",
        help="also train with captioning-train on a synthetic dataset of these shapes and report its "
        "steady-state steps/s beside the benchmark's (captioning_bench.train_cli); compile=auto on "
        "cuda with --compile, else compile=true/false as --compile says",
    )
    parser.add_argument("--batching", default="image", choices=["image", "caption"],
                        help="image: each item once with its 5 captions (round(batch-size / 5) items, the job's "
                        "default); caption: one caption per row (the tutorial's); ours and the CLI alike")
    parser.add_argument("--cli-steps", type=int, default=1000, help="--cli: steps per epoch (sets the items)")
    parser.add_argument("--cli-items", type=int, default=0, help="--cli: training items (5 captions each; "
                        "0: enough for --cli-steps)")
    parser.add_argument("--cli-epochs", type=int, default=2, help="--cli: epochs")
    parser.add_argument("--cli-workers", type=int, default=4, help="--cli: loader processes")
    parser.add_argument("--cli-cache", default="auto", choices=["auto", "device", "none"], help="--cli: data.cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-baseline", action="store_true")


class TutorialDecoder(nn.Module):
    """The common tutorial implementation of Show-Attend-Tell's decoder (the baseline)."""

    def __init__(
        self,
        feature_dim: int,
        embed: int,
        hidden: int,
        attention: int,
        vocab: int,
        dropout: float = 0.3,
    ) -> None:
        super().__init__()
        self.encoder_att = nn.Linear(feature_dim, attention)
        self.decoder_att = nn.Linear(hidden, attention)
        self.full_att = nn.Linear(attention, 1)
        self.embedding = nn.Embedding(vocab, embed)
        self.init_h = nn.Linear(feature_dim, hidden)
        self.init_c = nn.Linear(feature_dim, hidden)
        self.f_beta = nn.Linear(hidden, 1)
        self.cell = nn.LSTMCell(embed + feature_dim, hidden)
        self.fc = nn.Linear(hidden, vocab)
        self.dropout = nn.Dropout(dropout)
        self.vocab = vocab

    def loss(self, features: Tensor, tokens: Tensor, lengths: Tensor) -> Tensor:
        """``features [B,N,C]``, ``tokens [B,T+1]``, ``lengths [B]`` (tokens incl. bos/eos)."""
        lengths, order = lengths.sort(descending=True)
        features, tokens = features[order], tokens[order]
        decode_lengths = (lengths - 1).tolist()
        b, n, _ = features.shape
        t_max = max(decode_lengths)
        emb = self.embedding(tokens)
        mean = features.mean(1)
        h, c = self.init_h(mean), self.init_c(mean)
        preds = features.new_zeros(b, t_max, self.vocab)
        alphas = features.new_zeros(b, t_max, n)
        for t in range(t_max):
            bt = sum(1 for length in decode_lengths if length > t)
            att1 = self.encoder_att(features[:bt])  # recomputed at every step
            att2 = self.decoder_att(h[:bt])
            e = self.full_att(torch.tanh(att1 + att2.unsqueeze(1))).squeeze(2)
            alpha = torch.softmax(e, dim=1)
            awe = (features[:bt] * alpha.unsqueeze(2)).sum(1)
            awe = torch.sigmoid(self.f_beta(h[:bt])) * awe
            h, c = self.cell(torch.cat([emb[:bt, t], awe], dim=1), (h[:bt], c[:bt]))
            preds[:bt, t] = self.fc(self.dropout(h))
            alphas[:bt, t] = alpha
        targets = tokens[:, 1:]
        packed_p = nn.utils.rnn.pack_padded_sequence(preds, decode_lengths, batch_first=True)
        packed_t = nn.utils.rnn.pack_padded_sequence(targets, decode_lengths, batch_first=True)
        xe = F.cross_entropy(packed_p.data, packed_t.data)
        return xe + ((1.0 - alphas.sum(1)) ** 2).sum(1).mean()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _make_batch(args: Any, device: torch.device) -> dict[str, Any]:
    """The benchmark's batch: ``B`` captions of ``length // 2 .. length`` words over random features;
    ours reads them per image (``--batching image``: ``round(B / 5)`` items, 5 captions each) or one per
    row, the tutorial decoder always one per row.  Lengths count tokens incl. <bos>/<eos>."""
    g = torch.Generator().manual_seed(args.seed)
    group = 5 if args.batching == "image" else 1
    items = max(1, round(args.batch_size / group))
    rows, length = items * group, args.length
    feats = torch.relu(torch.randn(items, args.regions, args.feature_dim, generator=g))
    words = torch.randint(max(1, length // 2), length + 1, (rows,), generator=g)
    tokens = torch.zeros(rows, length + 2, dtype=torch.long)
    for i, n in enumerate(words.tolist()):
        tokens[i, 0] = 1
        tokens[i, 1 : n + 1] = torch.randint(4, args.vocab, (n,), generator=g)
        tokens[i, n + 1] = 2
    lengths = words + 2
    row_feats = feats.repeat_interleave(group, 0)[: args.batch_size]
    return {"feats": feats.to(device), "mask": torch.ones(items, args.regions, dtype=torch.bool, device=device),
            "tokens": tokens.to(device), "steps": (lengths - 1).tolist(), "rows": rows,
            "baseline": (row_feats.to(device), tokens[: args.batch_size].to(device), lengths[: args.batch_size].to(device))}


def _time_interleaved(
    fns: dict[str, Any], steps: int, warmup: int, device: torch.device
) -> dict[str, list[float]]:
    """Seconds per call of each function, the functions alternating call by call (so a busy
    machine slows both alike)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(steps):
        for name, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def peak_memory_mb(fn: Any, device: torch.device) -> float | None:
    """MiB of device memory allocated at the peak of one call of ``fn`` (None off cuda), after
    one call unmeasured (Adam creates its state in the first step)."""
    if device.type != "cuda":
        return None
    fn()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def _adam(params) -> torch.optim.Optimizer:
    """Same optimiser for both models (fused kernel where this torch has one)."""
    try:
        return torch.optim.Adam(params, lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=1e-4)


def _amp_mode(args: Any, device: torch.device) -> str:
    """``--amp`` resolved: "auto" is bf16 on cuda, off elsewhere."""
    return args.amp if args.amp != "auto" else ("bf16" if device.type == "cuda" else "off")


def _shape(args: Any, device: torch.device) -> dict:
    """The sizes every record of this run carries."""
    return {
        "device": device.type,
        "batch_size": args.batch_size,
        "regions": args.regions,
        "feature_dim": args.feature_dim,
        "hidden": args.hidden,
        "attention_dim": args.attention_dim,
        "embed": args.embed,
        "vocab": args.vocab,
        "length": args.length,
        "steps": args.steps,
        "threads": torch.get_num_threads(),
    }


def _ours_step(args: Any, device: torch.device, batch: dict[str, Any], amp: str) -> Callable[[], None]:
    """One training step (loss, backward, Adam) of ``LSTMDecoder.compute_loss`` on the batch, as the
    training job runs it (per image, the caption lengths from the host); compiled with ``--compile``."""
    cfg = dict(
        variant="soft_attention",
        scoring="additive",
        embed_dim=args.embed,
        hidden_dim=args.hidden,
        attention_dim=args.attention_dim,
        dropout=0.3,
        deep_output=bool(args.deep_output),
    )
    ours = build_decoder(cfg, args.vocab, args.feature_dim).to(device).train()
    opt = _adam(list(ours.parameters()))
    feats, mask, tokens = batch["feats"], batch["mask"], batch["tokens"]
    if args.compile:
        mode = "reduce-overhead" if device.type == "cuda" else None
        compiled = torch.compile(functools.partial(ours.compute_loss, static=True), fullgraph=True, mode=mode)
        loss_fn = functools.partial(compiled, feats, mask, tokens)
    else:
        loss_fn = functools.partial(ours.compute_loss, feats, None, tokens, lengths=batch["steps"])

    def step() -> None:
        ctx = (
            torch.autocast(device.type, dtype=torch.bfloat16)
            if amp == "bf16"
            else contextlib.nullcontext()
        )
        if args.compile and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with ctx:
            loss = loss_fn()["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _compile_seconds(step: Callable[[], None], device: torch.device) -> float:
    """Seconds of a compiled step's first three calls (they compile and record the CUDA graphs),
    timed apart from the steady-state steps."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    _sync(device)
    return time.perf_counter() - t0


def _baseline_step(args: Any, device: torch.device, batch: dict[str, Any]) -> Callable[[], None]:
    """One training step (loss, backward, Adam) of ``TutorialDecoder`` on the batch, fp32."""
    base = (
        TutorialDecoder(args.feature_dim, args.embed, args.hidden, args.attention_dim, args.vocab)
        .to(device)
        .train()
    )
    base_opt = _adam(list(base.parameters()))
    feats, tokens, lengths = batch["baseline"]

    def step() -> None:
        loss = base.loss(feats, tokens, lengths)
        base_opt.zero_grad(set_to_none=True)
        loss.backward()
        base_opt.step()

    return step


def _records(
    args: Any, times: dict[str, list[float]], *, amp: str, compile_s: float,
    peak_mb: float | None, shape: dict, rows: dict[str, int],
) -> list[dict]:
    """``train/ours``, and unless ``--skip-baseline`` ``train/baseline`` and ``train/speedup`` (of the
    captions/s), from the seconds of each step of each model (value: median, best: fastest) and the
    captions of each one's batch (``rows``)."""
    med = {k: statistics.median(v) / rows[k] for k, v in times.items()}  # seconds per caption
    best = {k: min(v) / rows[k] for k, v in times.items()}
    results = [
        {
            "name": "train/ours",
            "unit": "captions/s",
            "value": round(1 / med["ours"], 2),
            "best": round(1 / best["ours"], 2),
            "batching": args.batching,
            "captions": rows["ours"],
            "amp": amp,
            "compile": bool(args.compile),
            "compile_s": round(compile_s, 1),
            "deep_output": bool(args.deep_output),
            **({"peak_memory_mb": peak_mb} if peak_mb is not None else {}),
            **shape,
        }
    ]
    if args.skip_baseline:
        return results
    results.append(
        {
            "name": "train/baseline",
            "unit": "captions/s",
            "value": round(1 / med["baseline"], 2),
            "best": round(1 / best["baseline"], 2),
            "amp": "off",
            **shape,
        }
    )
    results.append(
        {
            "name": "train/speedup",
            "unit": "x",
            "value": round(med["baseline"] / med["ours"], 2),
            "best": round(best["baseline"] / best["ours"], 2),
            "target": 8.0,
            **shape,
        }
    )
    return results


def run(args: Any) -> list[dict]:
    device = torch.device(args.device)
    if getattr(args, "threads", 0):
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    batch = _make_batch(args, device)
    rows = {"ours": batch["rows"], "baseline": batch["baseline"][1].shape[0]}
    amp = _amp_mode(args, device)
    shape = _shape(args, device)
    ours_step = _ours_step(args, device, batch, amp)
    compile_s = _compile_seconds(ours_step, device) if args.compile else 0.0
    peak_mb = peak_memory_mb(ours_step, device)  # before the baseline takes memory of its own
    fns: dict[str, Callable[[], None]] = {"ours": ours_step}
    if not args.skip_baseline:
        fns["baseline"] = _baseline_step(args, device, batch)
    times = _time_interleaved(fns, args.steps, args.warmup, device)
    records = _records(args, times, amp=amp, compile_s=compile_s, peak_mb=peak_mb, shape=shape, rows=rows)
    if not args.compile:  # a compiled step's kernels are the graph's, not dispatched one by one
        for record in records[:2]:
            record["ops_per_step"] = dispatched_ops(fns["ours" if record["name"] == "train/ours" else "baseline"])
    if getattr(args, "cli", False):
        del fns, ours_step  # the benchmark's models and batch: memory the CLI may need
        if device.type == "cuda":
            torch.cuda.empty_cache()
        setting = ("auto" if device.type == "cuda" else "true") if args.compile else "false"
        baseline_s = statistics.median(times["baseline"]) / rows["baseline"] * args.batch_size \
            if "baseline" in times else None  # a batch of batch_size captions
        records += cli_figures(args, device.type, setting, statistics.median(times["ours"]), baseline_s, shape)
    return records
