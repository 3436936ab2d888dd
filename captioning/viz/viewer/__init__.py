"""The attention viewer: a self-contained folder a browser opens from disk, no server, no network.

``captioning-evaluate ... viewer=true`` and ``captioning-caption ... viewer=true`` write
``<output_dir>/viewer/`` (``viewer.compare=<other run's predictions.json>``: both runs side by side):

- ``index.html``, ``viewer.js``, ``viewer.css``: the page (``static/``, plain ES2020, no build step);
- ``data/index.js``: ``Viewer.index({...})``: the runs (name, file, what the attention positions
  are: ``Layout``), and per item its id, captions, per-item metrics and pointing hits/misses, for
  the list, its search, filters and sorting;
- ``data/page-NNNN.js``: ``Viewer.page(n, [...])``: ``page_size`` items each, loaded by a
  ``<script>`` element when one of them is shown (Chromium refuses ``fetch()`` of files beside a
  page opened from ``file://``, but loads scripts): per run the words, the attention rows as base64
  float16 (the bytes of ``attention.npy``: 2 bytes a weight), log-probabilities, n-best list and
  grounding; the references and region boxes;
- ``images/NNNNNN.jpg``: what the model saw (``captioning.features.featurize.display_crop``, the
  crop the heatmaps draw; a video's frames side by side in one JPEG).
"""

from captioning.viz.viewer.config import ViewerConfig, switch_overrides, viewer_switch
from captioning.viz.viewer.items import (
    Layout,
    ViewerItem,
    ViewerRun,
    entry_key,
    infer_layout,
    layout_of_meta,
    layout_of_result,
    read_compare,
    run_of_result,
)
from captioning.viz.viewer.writer import RunInfo, ViewerWriter, encode_attention

__all__ = ["ViewerConfig", "switch_overrides", "viewer_switch", "Layout", "ViewerItem", "ViewerRun", "entry_key", "infer_layout",
           "layout_of_meta", "layout_of_result", "read_compare", "run_of_result", "RunInfo", "ViewerWriter",
           "encode_attention"]
