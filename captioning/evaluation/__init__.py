"""Evaluation of a trained model: attention grounding and structured accuracy on the synthetic data,
reports, and the evaluate job (``job.evaluate``: predict -> score -> ground -> write)."""
