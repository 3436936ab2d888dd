"""Datasets: annotation formats into one record type, vocabulary, tokenizer, media and video reading,
the Lightning datamodule over a FeatureStore, and the embedded synthetic datasets."""
