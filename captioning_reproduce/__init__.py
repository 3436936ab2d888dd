"""``make reproduce``: the seed papers' claims tested on the embedded synthetic data.

Three parts: the catalogue of stores, variants and claims and the protocols, as config
(``catalogue``, ``conf/reproduce/``); the runner that trains and tests what a protocol needs
(``runner``); the report that turns the per-run records into tables, verdicts and a figure
(``report``).  The data are built so that attention is needed (``captioning.data.synthetic``):
``shapes`` captions bind colours to shapes left to right, ``moving_shapes`` videos show two brief
events whose order the caption names.  Development used data seed 0; the confirmation protocol
runs fresh data seeds once, under a verdict rule fixed beforehand.
"""
