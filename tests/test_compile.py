"""``compile`` (auto | true | false): compiled training where it pays, one graph for a whole run.

``compile: auto`` compiles the training loss with CUDA graphs on a CUDA device and runs it eagerly
elsewhere.  A compiled run sees ONE shape (captions padded to ``data.max_length``, an epoch's
smaller last batch padded with empty rows), so it compiles once: counted here with a backend that
only records the graphs dynamo hands it (no inductor, seconds not minutes), over a real Lightning
fit whose batches have different caption lengths, a smaller last batch and validation passes.
"""

from __future__ import annotations

import functools

import pytest
import pytorch_lightning as pl
import torch
from test_decoders import CASES, IDS, _batch, _decoder

from captioning.data.datamodule import CaptionDataModule
from captioning.data.records import CaptionRecord
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError
from captioning.store.feature_store import FeatureStore
from captioning.store.writer import FeatureStoreWriter
from captioning.train import module as module_mod
from captioning.train.compiled import compile_mode, compile_setting, fixed_shapes
from captioning.train.module import CaptioningModule

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


class GraphCounter:
    """A torch.compile backend that runs the traced graph as it is and counts the graphs."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> object:
        self.graphs += 1
        return gm.forward


def test_compile_auto_is_cuda_graphs_on_cuda_and_eager_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert compile_mode("auto", CUDA, compilable=True) == "reduce-overhead"
    assert compile_mode("auto", CPU, compilable=True) is None
    assert compile_mode("auto", CUDA, compilable=False) is None  # hard attention: eager, no error
    assert compile_mode("true", CPU, compilable=True) == "default"
    assert compile_mode("false", CUDA, compilable=True) is None
    assert [compile_setting(v) for v in (True, False, "auto", "True")] == ["true", "false", "auto", "true"]
    with pytest.raises(ConfigError, match="compile='maybe' is not one of auto, true, false"):
        compile_setting("maybe")
    module = _module("auto")
    assert module.settings.compile == "auto" and module.compile_mode() is None  # on this CPU
    monkeypatch.setattr(CaptioningModule, "device", property(lambda self: CUDA))
    assert module.compile_mode() == "reduce-overhead"


def test_fixed_shapes_pads_captions_and_rows_without_changing_the_loss() -> None:
    dec = _decoder("lstm", 2).eval()
    feats, mask, tokens = _batch()
    padded = fixed_shapes(feats, mask, tokens, items=8, rows=8, length=9, pad=0)
    assert [tuple(x.shape) for x in padded] == [(8, 4, 6), (8, 4), (8, 9)]
    assert not padded[1][5:].any() and not padded[2][5:].any()
    static = functools.partial(dec.compute_loss, static=True)
    a, b = static(feats, mask, tokens), static(*padded)
    for key in ("loss", "xe", "ds"):
        torch.testing.assert_close(b[key], a[key], msg=key)
    # a per-image batch (2 items x 2 captions) padded to 4 items x 2 captions
    grouped = fixed_shapes(feats[:2], mask[:2], tokens[:4], items=4, rows=8, length=9, pad=0)
    assert [tuple(x.shape) for x in grouped] == [(4, 4, 6), (4, 4), (8, 9)]
    a, b = static(feats[:2], mask[:2], tokens[:4]), static(*grouped)
    for key in ("loss", "xe", "ds"):
        torch.testing.assert_close(b[key], a[key], msg=key)


@pytest.mark.parametrize("name,i", CASES, ids=IDS)
def test_every_compilable_decoder_compiles_its_static_loss_as_one_graph(name: str, i: int) -> None:
    """fullgraph: no graph break; the same loss as eager; a second shape is a second graph (what
    the counter of the run below would see)."""
    dec = _decoder(name, i).train()
    if not dec.compilable:
        pytest.skip("not compilable (samples on the host)")
    torch._dynamo.reset()
    counter = GraphCounter()
    static = functools.partial(dec.compute_loss, static=True)
    compiled = torch.compile(static, backend=counter, fullgraph=True, dynamic=False)
    feats, mask, tokens = _batch()
    torch.manual_seed(0)
    eager = static(feats, mask, tokens)
    torch.manual_seed(0)
    out = compiled(feats, mask, tokens)
    compiled(feats, mask, tokens)
    assert counter.graphs == 1
    torch.testing.assert_close(out["loss"], eager["loss"])
    compiled(feats[:4], mask[:4], tokens[:4])  # a smaller batch: another shape, another graph
    assert counter.graphs == 2


# ---------------------------------------------------------------------------- a compiled Lightning run

WORDS = "a red green blue circle square triangle on the left right of".split()


def _records(split: str, n: int, offset: int) -> list[CaptionRecord]:
    """Items with captions of 2 to 6 words (different lengths in every batch)."""
    out = []
    for i in range(n):
        k = i + offset
        caps = tuple(" ".join(WORDS[(k + j) % len(WORDS)] for j in range(2 + (k + c) % 5)) for c in range(2))
        out.append(CaptionRecord(f"id{k}", k, f"{k}.jpg", caps, split))
    return out


def toy_data(tmp_path, module: CaptioningModule, batching: str, val_items: int) -> CaptionDataModule:
    """A data module of 21 training items with 2 captions each (``_records``) and random 4 x 6
    features, in batches of 8 captions."""
    meta = {"settings": {"backbone": "toy"}, "kind": "image", "positions": 4, "dim": 6, "grid": [2, 2],
            "dtype": "float16"}
    train, val = _records("train", 21, 0), _records("val", val_items, 100)
    g = torch.Generator().manual_seed(0)
    with FeatureStoreWriter(tmp_path / "store", meta, shard_size=16) as w:
        for r in train + val:
            w.add(r.item_id, torch.randn(4, 6, generator=g).numpy())
    vocab = Vocabulary.from_dict(module.hparams["vocab"])
    return CaptionDataModule({"train": train, "val": val}, FeatureStore.open(tmp_path / "store"), vocab, max_length=6,
                             batch_size=8, num_workers=0, batching=batching)


def _module(setting: str, batch_size: int = 8) -> CaptioningModule:
    vocab = Vocabulary.build([w.split() for w in WORDS]).to_dict()
    meta = {"kind": "image", "positions": 4, "dim": 6, "grid": [2, 2], "dtype": "float16",
            "settings": {"backbone": "toy"}}
    config = {"model": {"name": "lstm", "embed_dim": 8, "hidden_dim": 12, "attention_dim": 6, "dropout": 0.1},
              "compile": setting, "data": {"batch_size": batch_size, "max_length": 6},
              "decode": {"beam_size": 1, "max_length": 6}, "optim": {"scheduler": "none"}}
    return CaptioningModule.from_hparams(config, vocab, meta)


def counting_compile(monkeypatch: pytest.MonkeyPatch) -> GraphCounter:
    """``torch.compile`` with a ``GraphCounter`` backend wherever the package calls it."""
    counter, compile_ = GraphCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{**kw, "backend": counter, "mode": None}))
    torch._dynamo.reset()
    return counter


@pytest.mark.parametrize("batching,shapes", [("caption", {8, 2}), ("image", {4, 1})])
def test_a_compiled_run_compiles_once_over_epochs_lengths_a_short_last_batch_and_validation(
        tmp_path, monkeypatch: pytest.MonkeyPatch, batching: str, shapes: set[int]) -> None:
    """21 training items x 2 captions = 42 captions in batches of 8 captions (per caption: 8 rows;
    per image: 4 items of 2 captions): five full batches of different caption lengths and a short
    last one, twice (2 epochs), validation after each: one graph."""
    module = _module("true")
    dm = toy_data(tmp_path, module, batching, val_items=5)
    counter = counting_compile(monkeypatch)
    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(module_mod, "fixed_shapes", functools.partial(_recording, module_mod.fixed_shapes, seen))
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                         default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    # the batches did differ: 8 rows and 2 (the last), captions of several lengths
    assert len(seen) == 12 and {b for b, _ in seen} == shapes and len({t for _, t in seen}) > 1, seen
    assert counter.graphs == 1, f"{counter.graphs} graphs for batches of shapes {sorted(set(seen))}"


def _recording(original, seen, features, mask, tokens, items, rows, length, pad):
    seen.append((features.shape[0], tokens.shape[1]))
    return original(features, mask, tokens, items, rows, length, pad)

