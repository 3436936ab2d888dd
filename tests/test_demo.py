"""``make demo`` is the README's pipeline: its commands are the README's pipeline commands with only
sizes, places and progress added (each override of a key the demo may add, and the rest equal to
the README's command), so they compose to the defaults; its summary prints val pointing with its
chance level."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from conftest import REPO
from hydra import compose, initialize_config_dir

import captioning.cli.extract  # noqa: F401  (registers the extract schema)
import captioning.cli.train  # noqa: F401  (registers the train and decoder schemas)
from captioning import demo
from captioning.utils.io import atomic_write_json

ALLOWED = demo.SIZE_KEYS + demo.WHERE_KEYS + demo.SHOW_KEYS


def composed(name: str, *overrides: str):
    with initialize_config_dir(version_base="1.3", config_dir=str(REPO / "conf")):
        return compose(name, overrides=list(overrides))


def readme_pipeline() -> dict[str, list[list[str]]]:
    """job -> the argument lists of the README pipeline block's ``captioning-<job>`` commands."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## The pipeline\n", 1)[1].split("\n## ", 1)[0]
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]
    out: dict[str, list[list[str]]] = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0].startswith("captioning-"):
            out.setdefault(words[0].removeprefix("captioning-"), []).append(words[1:])
    return out


def demo_steps(out: str = "outputs/demo", root: str = "data/shapes", images: int = demo.IMAGES) -> list:
    return [*demo.first_steps(out, root, images, demo.EPOCHS), *demo.last_steps(out, "run/best.ckpt", ["a.jpg"])]


def own(args: list[str]) -> list[str]:
    """A command's arguments less those of the keys the demo may add (and the README fills in)."""
    return [a for a in args if a.split("=", 1)[0] not in ALLOWED]


@pytest.mark.parametrize(("root", "images"), [("data/shapes", demo.IMAGES), ("/elsewhere/shapes", 600)])
def test_the_demo_runs_the_readme_pipeline_commands_with_sizes_only(root, images):
    readme = readme_pipeline()
    steps = demo_steps(root=root, images=images)
    assert [job for _, job, _ in steps] == ["generate", "extract", "train", "evaluate", "evaluate", "caption"]
    for _, job, args in steps:
        mine = [a if a != "split=val" else "split=test" for a in own(args)]  # the README's evaluate, on val too
        assert mine == own(readme[job][0]), (job, mine, readme[job][0])
    sizes = {a for _, _, args in steps for a in args if a.split("=", 1)[0] in demo.SIZE_KEYS}
    assert {"model.hidden_dim=128", "model.embed_dim=64", "model.attention_dim=64", "optim.lr=2e-3",
            f"trainer.max_epochs={demo.EPOCHS}"} <= sizes


def test_the_demo_check_fails_on_an_override_that_is_not_a_size(monkeypatch):
    monkeypatch.setattr(demo, "CPU_LSTM", [*demo.CPU_LSTM, "model.doubly_stochastic=1.0"])
    with pytest.raises(AssertionError):
        test_the_demo_runs_the_readme_pipeline_commands_with_sizes_only("data/shapes", demo.IMAGES)
    monkeypatch.setattr(demo, "CPU_LSTM", ["model.hidden_dim=128"])
    monkeypatch.setitem(demo.PIPELINE, "train", ["data=shapes", "model=soft_attention", "model.position_code=learned",
                                                 "trainer=cpu"])
    with pytest.raises(AssertionError):
        test_the_demo_runs_the_readme_pipeline_commands_with_sizes_only("data/shapes", demo.IMAGES)


def test_the_demo_extracts_and_trains_with_the_defaults():
    """What the demo's extract and train commands compose to differs from the bare defaults only in
    the keys it may add."""
    (_, _, extract), (_, _, train) = demo_steps()[1:3]
    assert composed("extract", *extract) == composed("extract")
    cfg, default = composed("train", *train), composed("train")
    for key in ("hidden_dim", "embed_dim", "attention_dim"):
        cfg.model[key] = default.model[key]
    cfg.trainer.max_epochs, cfg.optim.lr = default.trainer.max_epochs, default.optim.lr
    cfg.callbacks.progress.bar = default.callbacks.progress.bar
    assert cfg == default


def _write_eval(out: Path, split: str, pointing: float, chance: float) -> None:
    atomic_write_json(out / "eval" / split / "metrics.json", {"Bleu_4": 0.9, "CIDEr": 7.5})
    atomic_write_json(out / "eval" / split / "report.json", {
        "structure": {"binding_accuracy": 0.95, "chance_binding_accuracy": 0.5},
        "grounding": {"pointing_accuracy": pointing, "chance_pointing_accuracy": chance}})


def test_demo_summary_prints_its_time_and_val_pointing_with_its_chance(tmp_path, capsys):
    _write_eval(tmp_path, "val", 0.9541, 0.0613)
    _write_eval(tmp_path, "test", 0.25, 0.05)
    demo.print_summary(tmp_path, "run", "run/best.ckpt", 300.0)
    lines = capsys.readouterr().out.splitlines()
    assert "Demo finished in 5.0 min (300 s)." in lines
    val = next(line for line in lines if line.lstrip().startswith("val:"))
    assert "BLEU-4 0.900  CIDEr 7.500  binding accuracy 0.950 (chance 0.500)" in val
    assert "pointing accuracy 0.954 (chance 0.061)" in val
    headline = [line for line in lines if "val pointing accuracy" in line]
    assert len(headline) == 1 and headline[0].strip().startswith("val pointing accuracy 0.954 (chance 0.061):")
