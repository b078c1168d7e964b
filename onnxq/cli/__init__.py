"""The ``onnxq`` command line (an edge: it turns flags into the Python API's calls)."""

from onnxq.cli.main import EXIT_CODES, main, main_exit

__all__ = ["EXIT_CODES", "main", "main_exit"]
