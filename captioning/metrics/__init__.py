"""Caption metrics as the COCO caption toolkit computes them (``coco``: BLEU, METEOR, ROUGE-L, CIDEr-D)
and the scoring of results files against references (``scoring``)."""
