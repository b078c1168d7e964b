"""Stage 5, mixed precision: per-layer sensitivity and the ``--target`` search that keeps the
fewest, most harmful layers float.
"""
