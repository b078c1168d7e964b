"""The PyTorch front door: export an ``nn.Module`` to ONNX, check the export, quantize it (an
edge)."""
