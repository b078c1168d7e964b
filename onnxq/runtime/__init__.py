"""Where onnxq's work runs: devices, threads, freed memory, the progress bar."""
