"""Stage 6, materialize: the only writers of Q/DQ nodes and of the backends' quantized weight
ops."""
