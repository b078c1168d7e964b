"""Stage 1, load and simplify: a model ready for placement (opset, shapes, the float rewrites)."""
