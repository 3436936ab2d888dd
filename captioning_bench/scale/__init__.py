"""``captioning-bench scale``: the input pipeline, memory and time at COCO size, against the disk's limits.

Without the data: a synthetic store of ``--items`` train + 2 x ``--eval-items`` (val, test) items of
[grid*grid, dim] random fp16 (``synthetic.write_store``, through the real ``FeatureStoreWriter``) and
a Karpathy-layout split file of ``--captions-per-item`` Zipf captions each (``synthetic``).  COCO
Karpathy is ``--items 113287 --eval-items 5000`` (123,287 items).  A shape that would leave less
than ``--keep-free-gb`` free on the disk runs at the largest one that fits (the grid side halved,
then the dim) and says so (``scale/fit``).  The store and the split file stay in ``--root`` and
are reused by a run of the same shape (``--rebuild`` writes them again).

Stages (``--skip`` any), each printing its JSON lines as soon as they are measured:

- ``build``: the store and the split file written (the build's rate), the disk's sequential write (dd-like);
- ``write``: the store writer alone (``FeatureStoreWriter``, one shard of distinct items cycled) vs a
  plain sequential write of the same bytes, alternated, in ``--write-root`` (tmpfs, ``/dev/shm``,
  shows the writer's own cost; a disk, how close it comes to the disk);
- ``disk``: the disk's random-read limit at one item per read (cold and warm page cache, 1..max
  workers readers);
- ``annotations``: reading the split file, building the vocabulary, setting up the data module;
- ``loader``: the training DataLoader (shuffled, per worker count, cold and warm page cache) vs
  the random-read limit at as many readers, and vs ``decoder``: the soft-attention LSTM
  decoder's training step at the same batch and shape on this device;
- ``memory``: peak RSS and PSS of the input path over ``--memory-batches`` (default one epoch) at
  ``--memory-items`` (10k) and at full size; ``ddp``: the PSS of ``--ddp-pss`` ranks reading their
  shares of the same store;
- ``evaluate``: ``captioning-evaluate`` of ``--eval-items`` test items (beam 3, all metrics) with a
  random-weight decoder of the default size: decode, scoring per metric, writing (``write_over_decode``),
  in ``--eval-precision`` (fp32 by default);
- ``extract``: ``bench extract-images`` projected to the store's item count.

Every line carries ``items`` (in the store), ``shape``, ``item_bytes`` and ``machine``; where a
limit exists, ``limit`` and ``ratio = value / limit``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

__all__ = ["STAGES", "add_arguments", "run"]

STAGES = ("build", "write", "disk", "annotations", "decoder", "loader", "memory", "ddp", "evaluate", "extract")


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _names(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown stage {unknown[0]!r}: choose from {', '.join(STAGES)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--items", type=int, default=113287, help="train items (COCO Karpathy: 113287)")
    parser.add_argument("--eval-items", type=int, default=5000, help="val and test items each; the evaluation's size")
    parser.add_argument("--grid", type=int, default=14, help="grid side H = W")
    parser.add_argument("--dim", type=int, default=512, help="channels C")
    parser.add_argument("--captions-per-item", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=10000, help="words of the Zipf law")
    parser.add_argument("--workers", type=_ints, default=[0, 2, 4], help="DataLoader workers to time, e.g. 0,2,4")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100, help="loader batches timed per setting")
    parser.add_argument("--root", default=None, help="work folder (default: <tmp>/captioning-bench-scale)")
    parser.add_argument("--rebuild", action="store_true", help="write the store and split file again")
    parser.add_argument("--skip", type=_names, default=[], help=f"stages to skip: {','.join(STAGES)}")
    parser.add_argument("--cold", default="fadvise", choices=["fadvise", "drop_caches"],
                        help="how the page cache is emptied: the store's files only, or the whole machine")
    parser.add_argument("--read-items", type=int, default=3000, help="blocks read per random-read limit")
    parser.add_argument("--disk-write-gb", type=float, default=2.0, help="dd-like sequential write size")
    parser.add_argument("--keep-free-gb", type=float, default=20.0, help="disk space the store must leave free")
    parser.add_argument("--write-items", type=int, default=6000, help="items of the write stage")
    parser.add_argument("--write-root", default=None, help="the write stage's folder (default: <root>/write)")
    parser.add_argument("--write-repeats", type=int, default=5, help="alternated rounds of the write stage")
    parser.add_argument("--memory-items", type=int, default=10000, help="the small store of the memory stage")
    parser.add_argument("--memory-batches", type=int, default=0, help="batches per memory probe (0: one epoch)")
    parser.add_argument("--memory-workers", type=int, default=2)
    parser.add_argument("--ddp-pss", type=int, default=2, help="ranks of the ddp stage")
    parser.add_argument("--ddp-batches", type=int, default=100, help="batches per rank in the ddp stage")
    parser.add_argument("--eval-beam", type=int, default=3)
    parser.add_argument("--eval-batch-size", type=int, default=None, help="items decoded together (default: the job's)")
    parser.add_argument("--eval-precision", default="fp32", choices=["fp32", "bf16", "fp16"],
                        help="the evaluation's decoding precision (its files: <root>/eval/<precision>)")
    parser.add_argument("--eval-metrics", type=lambda t: [m for m in t.split(",") if m],
                        default=["bleu", "meteor", "rouge", "cider"], help="metrics of the evaluate stage")
    parser.add_argument("--extract-images", type=int, default=128, help="JPEGs of the extraction stage")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """Yield each stage's records as soon as they are measured."""
    # imported here, not at the top: the memory probe (python -m captioning_bench.scale.memory)
    # imports this package, and the stages' imports (evaluation, extraction) would inflate what it measures
    from captioning_bench.scale.stages import Scale

    scale = Scale.prepare(args)
    yield from scale.fit_record()
    for stage in STAGES:
        if stage not in args.skip:
            yield from getattr(scale, stage)()
