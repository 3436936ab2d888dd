"""The viewer of ``captioning-caption``: its ``CaptionResult`` stream (and another run's file to compare).

``ResultsViewer.tap(results)`` passes the results on unchanged (to the gallery) and adds each to the
viewer as it goes by; ``close()`` writes the rest and returns ``viewer/index.html``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from captioning.viz.viewer.config import ViewerConfig
from captioning.viz.viewer.items import (
    Layout,
    ViewerItem,
    ViewerRun,
    infer_layout,
    read_compare,
    run_of_result,
    width_of,
)
from captioning.viz.viewer.writer import RunInfo, ViewerWriter

__all__ = ["ResultsViewer", "stream_names"]


def stream_names(meta: dict[str, Any]) -> list[str] | None:
    """The encoder of each feature stream of two-stream features (None for one store)."""
    streams = meta.get("streams")
    if not streams:
        return None
    return [str((s.get("encoder") or {}).get("name") or (s.get("settings") or {}).get("backbone")
                or Path(str(s.get("root", "?"))).name) for s in streams]


class ResultsViewer:
    """``viewer/`` of a captioner's results: ``captioner`` gives kind, grid / regions, hard attention,
    the feature meta and its source (duck-typed ``captioning.caption.api.Captioner``)."""

    def __init__(self, out_dir: str | Path, cfg: ViewerConfig, captioner: Any, title: str) -> None:
        if captioner.kind == "video":
            layout = Layout("frames", None, int(captioner.feature_meta.get("frames") or 0) or None, 1)
        elif captioner.regions:
            layout = Layout("regions")
        else:
            layout = Layout("grid", tuple(captioner.grid))
        source = str(captioner.source)
        runs = [RunInfo(Path(source).name, source, layout, hard=captioner.hard_attention,
                        streams=stream_names(captioner.feature_meta))]
        self.others: dict[str, ViewerRun] | None = None
        if cfg.compare:
            path, self.others = read_compare(cfg.compare)
            width = width_of(list(self.others.values()))
            runs.append(RunInfo(path.parent.name or path.name, str(path),
                                infer_layout(width, layout) if width else Layout("positions")))
        self.writer = ViewerWriter(out_dir, cfg, runs, kind=captioner.kind, title=title)

    def item(self, result: Any) -> ViewerItem | None:
        """The viewer item of one result (None for an input that failed)."""
        if result.error is not None:
            return None
        runs: list[ViewerRun | None] = [run_of_result(result)]
        if self.others is not None:
            runs.append(self.others.get(str(result.input)))
        return ViewerItem(str(result.input), runs, pixels=result.image, frame_indices=result.frame_indices,
                          boxes=result.boxes, image_size=None if result.image_size is None else tuple(result.image_size),
                          note=None if result.image is not None else "no pixels for this input: drawn on gray")

    def tap(self, results: Iterable[Any]) -> Iterator[Any]:
        return self.writer.tap(results, self.item)

    def close(self) -> Path:
        return self.writer.close()
