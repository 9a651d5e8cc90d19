"""Temperley–Lieb diagrams, rewriting and normal forms for non-crossing routing attention (math_spec part A).

Files: ``diagram_np`` (host oracle), ``diagram_jax`` (jit/vmap kernels), ``rewriting`` (seed rules, mirror rule,
complete system A–D), ``normal_form`` (diagram -> Jones NF in O(n²)).
"""
