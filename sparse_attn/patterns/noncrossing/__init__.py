"""Temperley–Lieb diagrams and normal forms for non-crossing routing attention (docs/noncrossing.md).

Files: ``diagram_np`` (host oracle), ``diagram_jax`` (jit/vmap kernels: scan, pointer jumping), ``normal_form``
(diagram -> Jones NF in O(n²)), ``layered`` (layered construction, nesting depth, TL_{2n} doubling), ``selection``
(local-max layers), ``defect_pairs`` (the router's layer in JAX), ``key_rows`` (attention rows and gates), ``stats``.
"""
