"""A run's inputs, found by one rule: its data config, its feature store(s) and its vocabulary.

A training config names its dataset (``data``) and its features (``features_dir``: one FeatureStore
folder, or a list of them read as one, position by position: two-stream features,
``captioning.store.streams``).  ``checkpoint_inputs`` finds them for a trained checkpoint from the
config it recorded, for every job that reads a checkpoint's data (evaluation, probes, captioning a
stored split, the Python API); ``run_inputs`` finds a new run's own by the same rule, and a run
started from a checkpoint's weights (``init_from``) is checked against it with ``Inputs.check``.

The data may have moved since training.  ``data_root=<new folder>`` moves every path under the
recorded ``data.root`` with it: annotation files, media, caption tables, and each feature store
under it (every stream of a two-stream run); ``features_dir=`` (a folder, or a list of folders for
two streams) names the store(s) directly and wins over the move.  The checkpoint's vocabulary is
its own; a new run's is built from its train captions (``data.min_count``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

from captioning.config import DataConfig
from captioning.data.caption_table import CaptionTable, caption_table
from captioning.data.vocab import Vocabulary
from captioning.errors import ConfigError, DataError
from captioning.store.feature_store import FeatureStore
from captioning.store.streams import FeatureStreams, open_features
from captioning.train.checkpoint import check_compatible


@dataclass
class Inputs:
    """What a run reads: its dataset, its feature store (two streams: joined) and its vocabulary."""

    data: DataConfig
    features_dir: list[str]  # one folder, or one per stream
    store: FeatureStore | FeatureStreams
    vocab: Vocabulary

    @cached_property
    def table(self) -> CaptionTable:
        """The dataset's caption table (``captioning.data.caption_table``), read on first use."""
        return caption_table(self.data)

    def check(self, hparams: Mapping[str, Any], path: str | Path) -> None:
        """Refuse the checkpoint ``path`` (its ``hyper_parameters``) unless it was trained on this
        vocabulary and these features (``captioning.train.checkpoint.check_compatible``)."""
        check_compatible(hparams, self.vocab.to_dict(), dict(self.store.meta), path)


def moved(path: str, old_root: str, new_root: str) -> str:
    """``path`` under ``old_root`` -> the same path under ``new_root``; any other path as it is."""
    try:
        rest = PurePath(path).relative_to(old_root)
    except ValueError:
        return path
    return str(PurePath(new_root) / rest)


def checkpoint_data_config(train_cfg: Mapping[str, Any], data_root: str | None = None) -> DataConfig:
    """The ``DataConfig`` a checkpoint was trained with (``train_cfg``: its ``hparams["config"]``).

    ``data_root``: the dataset moved there since; paths under the old ``data.root`` move with it.
    """
    data = dict(train_cfg["data"])
    if data_root is not None:
        old = data["root"]
        data = {k: moved(v, old, data_root) if isinstance(v, str) else v for k, v in data.items()}
        data["annotations"] = {k: moved(v, old, data_root) for k, v in data["annotations"].items()}
        data["root"] = data_root
    return DataConfig(**data)


def feature_dirs(features_dir: Any) -> list[str]:
    """``features_dir`` (one folder, or a list: one per stream) as a list of folders."""
    if isinstance(features_dir, (str, PurePath)):
        return [str(features_dir)]
    dirs = list(features_dir) if isinstance(features_dir, Sequence) else []
    if not dirs or not all(isinstance(d, (str, PurePath)) for d in dirs):
        raise ConfigError(f"features_dir={features_dir!r}: give a feature store folder or a list of them "
                          f"(two streams: features_dir=[<appearance store>,<motion store>])")
    return [str(d) for d in dirs]


def open_store(dirs: list[str], data: DataConfig, fix: str) -> FeatureStore | FeatureStreams:
    """The store(s) at ``dirs``, checked to exist and to hold features of ``data``'s kind; ``fix``
    ends the error for a missing store."""
    missing = [d for d in dirs if not Path(d, "meta.json").is_file()]
    if missing:
        raise DataError(f"no feature store at {', '.join(missing)}: {fix}")
    store = open_features(dirs if len(dirs) > 1 else dirs[0])
    if store.meta.get("kind", data.kind) != data.kind:
        raise ConfigError(
            f"features in {store.root} are '{store.meta.get('kind')}' features but data={data.name} "
            f"is a '{data.kind}' dataset: point features_dir at this dataset's features"
        )
    return store


def run_inputs(data: DataConfig, features_dir: Any, encoder: str) -> Inputs:
    """A new run's inputs: ``data``, the store(s) at ``features_dir``, the train captions' vocabulary
    (``encoder``: the run's encoder, named in the hint to extract a missing store)."""
    dirs = feature_dirs(features_dir)
    table = caption_table(data)
    store = open_store(dirs, data, f"run `captioning-extract data={data.name} "
                                   f"encoder={encoder if len(dirs) == 1 else '<its encoder>'} features_dir=<that folder>` "
                                   f"first (or set features_dir=...)")
    inputs = Inputs(data, dirs, store, table.vocabulary(min_count=data.min_count))
    inputs.table = table  # the cached_property's slot: read once
    return inputs


def checkpoint_inputs(hparams: Mapping[str, Any], path: str | Path, *, data_root: str | None = None,
                      features_dir: Any = None) -> Inputs:
    """The inputs of the checkpoint ``path`` (``hparams``: its ``hyper_parameters``), checked against it.

    data_root: where its dataset is now (paths under the recorded ``data.root`` move with it);
    features_dir: its store(s) now (a folder, or one per stream), default: the recorded ones, moved.
    """
    config = hparams["config"]
    data = checkpoint_data_config(config, data_root)
    if features_dir is not None:
        dirs = feature_dirs(features_dir)
    else:
        dirs = feature_dirs(config["features_dir"])
        if data_root is not None:
            dirs = [moved(d, config["data"]["root"], data_root) for d in dirs]
    example = "features_dir=<its folder>" if len(dirs) == 1 else "features_dir=[<one folder per stream>]"
    store = open_store(dirs, data, f"{path} was trained on the features there; if they moved, pass "
                                   f"data_root=<the dataset's new folder> (the stores under it move with it) or {example}")
    inputs = Inputs(data, dirs, store, Vocabulary.from_dict(hparams["vocab"], source=f"{path}'s vocabulary"))
    inputs.check(hparams, path)
    return inputs

