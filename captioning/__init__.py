"""captioning: image and video captioning with attention.

Pipeline: ``captioning-extract`` (CNN features -> FeatureStore) ->
``captioning-train`` (LSTM decoder with soft/hard attention) ->
``captioning-evaluate`` / ``captioning-caption`` (beam search, metrics, heatmaps).
"""

__version__ = "0.1.0"
