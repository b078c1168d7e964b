"""Stage 3, calibrate: stream batches through onnxruntime, observe the placed tensors, turn
statistics into ranges.
"""
