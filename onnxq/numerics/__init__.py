"""Numbers without a graph: streaming tensor statistics, the observers (range methods by name),
quantization parameters, precisions, block formats, exact sums and accuracy metrics.
"""
