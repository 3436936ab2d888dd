"""Feature extraction: registered 2-D and 3-D backbones, the extraction job writing a FeatureStore,
and featurizing raw media the way a checkpoint was trained."""
