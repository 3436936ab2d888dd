"""The checkout state a record keeps: its commit, and whether the code differed from it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from captioning.provenance import checkout_state


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_checkout_is_dirty_when_its_code_differs_not_its_reports(tmp_path: Path) -> None:
    """The reproduction rewrites docs/results/*.md between its runs: a report changed there leaves the
    next run clean; a changed module, config or test makes it dirty; untracked files do not count."""
    repo = tmp_path / "repo"
    (repo / "docs" / "results").mkdir(parents=True)
    (repo / "conf").mkdir()
    (repo / "docs" / "results" / "report.md").write_text("before\n")
    (repo / "conf" / "train.yaml").write_text("lr: 1.0e-3\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    state = checkout_state(repo)
    assert len(state["git_commit"]) == 40 and state["git_dirty"] is False

    (repo / "docs" / "results" / "report.md").write_text("after\n")
    (repo / "docs" / "results" / "d15.json").write_text("{}\n")
    (repo / "results.bin").write_text("untracked\n")
    assert checkout_state(repo)["git_dirty"] is False

    (repo / "conf" / "train.yaml").write_text("lr: 2.0e-3\n")
    assert checkout_state(repo)["git_dirty"] is True


def test_outside_a_checkout_there_is_no_commit(tmp_path: Path) -> None:
    assert checkout_state(tmp_path) == {}
