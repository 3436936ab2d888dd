"""``python -m captioning_reproduce``: run a protocol's missing runs, then write its report.

    python -m captioning_reproduce --protocol confirmation            # every claim's runs + report
    python -m captioning_reproduce --protocol confirmation --headline # the headline claims' runs first
    python -m captioning_reproduce --protocol development --report    # the report from the records only
"""

from __future__ import annotations

import argparse
from pathlib import Path

from captioning_reproduce.catalogue import load_catalogue, load_protocol
from captioning_reproduce.report import load_records, write_report
from captioning_reproduce.runner import Runner, needed

RESULTS = Path("docs/results")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", default="confirmation", help="conf/reproduce/<name>.yaml or a path")
    parser.add_argument("--variants", nargs="+", default=None, help="run only these variants")
    parser.add_argument("--data-seeds", type=int, nargs="+", default=None, help="run only these data seeds")
    parser.add_argument("--headline", action="store_true", help="only the headline claims' runs")
    parser.add_argument("--report", action="store_true", help="write the report from the records, run nothing")
    parser.add_argument("--work", default="results/reproduce", help="data, features and checkpoints")
    parser.add_argument("--results", default=str(RESULTS), help="per-run records (runs/) and the reports")
    args = parser.parse_args(argv)
    catalogue, protocol = load_catalogue(), load_protocol(args.protocol)
    results = Path(args.results)
    if not args.report:
        plan = needed(catalogue, protocol, args.variants, headline_only=args.headline)
        if args.data_seeds is not None:
            plan = {s: v for s, v in plan.items() if s in args.data_seeds}
        Runner(catalogue, protocol, Path(args.work), results / "runs").run(plan)
    development = load_records(results / "runs" / "development") if protocol.name != "development" else None
    path = write_report(catalogue, protocol, load_records(results / "runs" / protocol.name), results, development)
    print(path.read_text(encoding="utf-8"))
    print(f"written: {path}")


if __name__ == "__main__":
    main()
