"""``onnxq analyze``: where a quantized model's error enters, layer by layer (an edge: it reads the
stages, nothing reads it).
"""
