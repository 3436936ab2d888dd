"""``captioning-bench <name> [--device cpu|cuda] [options]``: the benchmark harness.

Each benchmark lives in ``captioning_bench.<name>`` (``-`` becomes ``_``) and exposes
``add_arguments(parser)`` and ``run(args) -> list[dict]``.  Every result is printed as one
JSON line with at least ``name``, ``unit`` and ``value`` (as soon as it is measured when ``run``
is a generator); benchmarks compare against a
baseline in the same run and report ratios, which transfer across machines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

BENCHMARKS = {
    "train": "decoder training throughput vs a tutorial-style decoder",
    "beam": "batched beam search vs one item at a time",
    "metrics": "BLEU+ROUGE-L+CIDEr-D vs pycocoevalcap",
    "extract-images": "full extraction job vs backbone forward alone",
    "extract-videos": "video extraction job (decode + forward + write) vs backbone forward alone",
    "scale": "input pipeline, memory and evaluation time at COCO size vs the disk's limits",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captioning-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="name", required=True)
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if not a.startswith("-")), None)
    module = None
    for name, help_text in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
        p.add_argument("--output", default=None, help="also append the JSON lines to this file")
        if name == chosen:  # import only the benchmark that runs (each pulls its own dependencies)
            module = importlib.import_module(f"captioning_bench.{name.replace('-', '_')}")
            module.add_arguments(p)
    args = parser.parse_args(argv)
    assert module is not None
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
            return 2
    for r in module.run(args):  # a list, or a generator printing each result as it is measured
        line = json.dumps(r, sort_keys=False)
        print(line, flush=True)
        if args.output:
            with open(args.output, "a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
