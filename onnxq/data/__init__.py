"""Calibration data: what a model takes, and the sources that feed it batches (npz/npy folders,
images, iterables).
"""
