"""Figures: per-word attention heatmaps (grids, frames) and the HTML gallery."""
