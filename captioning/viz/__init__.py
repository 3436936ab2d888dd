"""Figures: per-word attention heatmaps (image grids, region boxes, video frames) and the HTML gallery."""
