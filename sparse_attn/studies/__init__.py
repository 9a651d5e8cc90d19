"""What the experiments share, importable from notebooks: the mechanism registry, budget matching, grid cells and
rows, the LM objective, classification metrics, the router warm start, the benchmark harness, entry-point helpers.

Top of the library: it may import every other layer; nothing in `sparse_attn/` imports it.
"""
