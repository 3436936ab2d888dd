"""Training: the job (``job.train``), the LightningModule (``module``), callbacks, checkpoint I/O, the
self-critical stage (``scst``), end-to-end fine-tuning of the encoder (``finetune``)."""
