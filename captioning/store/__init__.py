"""The FeatureStore: sharded, memory-mapped fp16 annotation vectors indexed by item id (``feature_store``),
and several stores of the same items read as one (``streams``)."""
