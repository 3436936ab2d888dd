"""Console scripts: Hydra argument-to-job glue only; every job function lives in the library."""
