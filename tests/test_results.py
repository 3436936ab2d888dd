"""Every published number from a committed record: the reproduction's reports regenerate byte for
byte from the per-run records in docs/results/runs/ (nothing trained: the report code only), an
edited record changes them, and every decimal number of what the protocols found (README's Results
and docs/results/README.md's findings) is a value of a docs/results/*confirmation*.json report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import REPO

from captioning_reproduce.catalogue import claims_of, load_catalogue, load_protocol
from captioning_reproduce.defaults_report import load_study_records, write_study_report
from captioning_reproduce.defaults_study import load_study
from captioning_reproduce.demo_grid import load_grid
from captioning_reproduce.demo_report import load_demo_records, write_demo_report
from captioning_reproduce.report import load_records, write_report

RESULTS = REPO / "docs" / "results"
PROTOCOLS = sorted(p.stem for p in RESULTS.glob("*.json"))


def regenerate(name: str, runs: Path, out: Path) -> Path:
    """What ``python -m captioning_reproduce --protocol <name> --report`` writes, into ``out``."""
    development = load_records(runs / "development") if name != "development" else None
    return write_report(load_catalogue(), load_protocol(name), load_records(runs / name), out, development)


def test_the_committed_reports_are_the_protocols():
    assert {"development", "confirmation", "confirmation_probes"} <= set(PROTOCOLS)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_a_report_regenerates_byte_for_byte_from_the_committed_records(name, tmp_path):
    path = regenerate(name, RESULTS / "runs", tmp_path)
    for suffix in (".md", ".json"):
        assert path.with_suffix(suffix).read_bytes() == (RESULTS / f"{name}{suffix}").read_bytes(), (
            f"docs/results/{name}{suffix} is not what its records give: regenerate it with "
            f"python -m captioning_reproduce --protocol {name} --report")


def test_an_edited_record_changes_the_report(tmp_path):
    runs = tmp_path / "runs"
    for name in ("development", "confirmation"):
        shutil.copytree(RESULTS / "runs" / name, runs / name)
    record = runs / "confirmation" / "soft_14x14" / "d1.json"
    data = json.loads(record.read_text())
    data["metrics"]["CIDEr"] += 0.01
    record.write_text(json.dumps(data))
    path = regenerate("confirmation", runs, tmp_path / "out")
    assert path.read_bytes() != (RESULTS / "confirmation.md").read_bytes()


def _numbers(obj) -> list[float]:
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    return [float(obj)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def findings() -> str:
    """What the protocols found, where it is stated: docs/results/README.md in full, README in brief."""
    return section(RESULTS / "README.md", "What the protocols found")


def unreported(text: str) -> list[str]:
    """The decimal numbers of ``text`` that no *confirmation*.json report holds (at the places quoted)."""
    values = [x for p in RESULTS.glob("*confirmation*.json") for x in _numbers(json.loads(p.read_text()))]
    missing = []
    for number in re.findall(r"(?<![\w.])[-+]?\d+\.\d+", text):
        places = len(number.split(".")[1])
        if not any(f"{v:+.{places}f}".lstrip("+") == number.lstrip("+") or
                   f"{v:.{places}f}" == number for v in values):
            missing.append(number)
    return missing


def test_every_number_of_the_findings_is_in_the_confirmation_reports():
    for where, text in (("docs/results/README.md", findings()), ("README.md", section(REPO / "README.md", "Results"))):
        assert re.search(r"\d\.\d", text), f"{where} quotes no figure of the reproduction"
        assert not unreported(text), f"{where} quotes numbers no confirmation*.json holds: {unreported(text)}"


def test_the_number_check_fails_on_a_figure_no_report_holds():
    assert unreported("0.910 of the time [0.892, 0.929]") == []
    assert unreported("0.911 of the time [0.892, 0.929]") == ["0.911"]


def test_readme_counts_the_probes_runs_that_are_committed():
    """While the probes protocol is incomplete, the findings say how many of its runs are in, and
    that count is the committed records' (not a sentence left behind by the last update)."""
    protocol = load_protocol("confirmation_probes")
    planned = {(v, seed) for claim in claims_of(load_catalogue(), protocol) for v in claim.variants
               for seed in protocol.seeds_for(claim)}
    recorded = {(r["variant"], r["data_seed"]) for r in load_records(RESULTS / "runs" / "confirmation_probes")}
    assert recorded <= planned
    said = re.search(r"(\d+) of its (\d+) runs", findings())
    if len(recorded) < len(planned):
        assert said is not None and (int(said[1]), int(said[2])) == (len(recorded), len(planned)), (
            f"docs/results/README.md should say {len(recorded)} of its {len(planned)} runs are recorded")
    else:
        assert said is None, "the probes protocol is complete: docs/results/README.md states its verdicts"


def test_the_demo_report_regenerates_byte_for_byte_and_follows_its_records(tmp_path):
    """docs/results/demo_grid.md is what ``python -m captioning_reproduce.demo_grid --report`` writes
    from the committed docs/results/demo/*.json, and a record edited by 0.01 CIDEr changes it."""
    grid, records = load_grid(), load_demo_records(RESULTS / "demo")
    path = write_demo_report(grid, records, tmp_path)
    assert path.read_bytes() == (RESULTS / "demo_grid.md").read_bytes(), (
        "docs/results/demo_grid.md is not what its records give: regenerate it with "
        "python -m captioning_reproduce.demo_grid --report")
    assert len(records) == len(grid["runs"]), "every run of conf/reproduce/demo_grid.yaml has its record"
    edited = [{**records[0], "metrics": {**records[0]["metrics"], "CIDEr": records[0]["metrics"]["CIDEr"] + 0.01}},
              *records[1:]]
    assert write_demo_report(grid, edited, tmp_path / "edited").read_bytes() != path.read_bytes()


def test_every_number_of_the_demo_search_in_docs_is_in_its_report():
    """docs/demo.md's figures of the search (from its decoder paragraph to the timing section) are
    numbers docs/results/demo_grid.md prints, which regenerates from the committed records."""
    doc = (REPO / "docs" / "demo.md").read_text(encoding="utf-8")
    search = doc.split("**The decoder:", 1)[1].split("\n## Time", 1)[0]
    report = set(re.findall(r"\d+\.\d+", (RESULTS / "demo_grid.md").read_text(encoding="utf-8")))
    quoted = re.findall(r"(?<![\w.])\d+\.\d+", search)
    assert quoted, "docs/demo.md quotes no figure of the search"
    assert not [n for n in quoted if n not in report], (
        f"docs/demo.md quotes figures docs/results/demo_grid.md does not hold: {[n for n in quoted if n not in report]}")


def decimals(text: str) -> set[str]:
    """The decimal numbers of markdown text, outside link targets."""
    return set(re.findall(r"(?<![\w.])\d+\.\d+", re.sub(r"\]\([^)]*\)", "]", text)))


def test_the_benchmarks_at_a_glance_are_the_figures_of_their_rows():
    """docs/benchmarks.md's summary table (and the README's benchmark sentence) quote only figures its
    Ratios rows state, each with its sizes, date and record."""
    doc = (REPO / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    glance, rows = section(REPO / "docs" / "benchmarks.md", "At a glance"), doc.split("\n## Ratios\n", 1)[1]
    assert decimals(glance) and not decimals(glance) - decimals(rows), decimals(glance) - decimals(rows)
    readme = section(REPO / "README.md", "Benchmarks")
    assert decimals(readme) and not decimals(readme) - decimals(glance), decimals(readme) - decimals(glance)


def test_the_defaults_study_report_regenerates_byte_for_byte_and_follows_its_records(tmp_path):
    """docs/results/defaults_study.md is what ``python -m captioning_reproduce.defaults_study --report``
    writes from the committed docs/results/defaults/**/d*.json, and an edited record changes it."""
    cfg, records = load_study(), load_study_records(RESULTS / "defaults")
    path = write_study_report(cfg, records, tmp_path)
    assert path.read_bytes() == (RESULTS / "defaults_study.md").read_bytes(), (
        "docs/results/defaults_study.md is not what its records give: regenerate it with "
        "python -m captioning_reproduce.defaults_study --report")
    if records:
        edited = [{**records[0], "metrics": {**records[0]["metrics"], "CIDEr": records[0]["metrics"]["CIDEr"] + 0.01}},
                  *records[1:]]
        assert write_study_report(cfg, edited, tmp_path / "edited").read_bytes() != path.read_bytes()


def test_every_number_of_the_defaults_choice_in_the_findings_is_in_the_study_report():
    """docs/findings.md's section on the default grid and code quotes the study's report (which
    regenerates from its records), the extraction record it links or the confirmation's report;
    shown failing on an edited figure."""
    text = section(REPO / "docs" / "findings.md", "The default grid and position code")
    report = (RESULTS / "defaults_study.md").read_text(encoding="utf-8")
    grids = (RESULTS / "extract" / "images_cpu_grids.jsonl").read_text(encoding="utf-8")
    confirmation = (RESULTS / "defaults_confirmation.md").read_text(encoding="utf-8")
    extra = {"0.85", "0.95", "0.02", "0.06"}  # the rule's constants (conf/reproduce/defaults_study.yaml), chance
    held = decimals(report) | decimals(confirmation) | {m for m in re.findall(r"\d+\.\d+", grids)} | extra

    def missing(t: str) -> set[str]:
        return decimals(t) - held

    assert decimals(text) and not missing(text), missing(text)
    assert missing(text.replace("7.702", "7.712")) == {"7.712"}
