"""``python -m onnxq.cli``: the ``onnxq`` command."""

from onnxq.cli.main import main_exit

main_exit()
