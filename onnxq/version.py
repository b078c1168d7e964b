"""onnxq's version (the package's, as pyproject.toml declares it); written into every output's
metadata and report, so it sits apart from the package's other imports."""

__version__ = "0.1.0"
