"""Decoders (registered; one module each), attention, position codes, fused kernels and search
(greedy, beam, sampling)."""
