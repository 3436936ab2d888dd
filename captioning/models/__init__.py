"""Decoders (registered; one module each), attention, position codes and search (greedy, beam,
sampling)."""
