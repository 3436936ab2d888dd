"""Captioning raw media: the Python API (``api.Captioner``), input discovery (``inputs``) and the
caption job (``job.caption``: captions.json, figures, gallery)."""
