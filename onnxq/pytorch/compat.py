"""What exporting a Hugging Face transformers module needs from :mod:`onnxq.pytorch.export`.

torch.onnx's TorchScript exporter passes every ``forward`` parameter that has a default
positionally, filled with its default (``torch.onnx`` ``_decide_input_format``).  transformers 5
wraps ``forward`` in decorators that set some of those parameters (``use_cache``) as keywords,
so the call fails with "got multiple values for argument 'use_cache'".  :func:`given_inputs_only`
hides the defaulted parameters for the duration of the export; the module tree, and so the
node names, stay the module's own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def given_inputs_only(module: Any) -> Iterator[None]:
    """Within the block, ``module.forward`` takes positional inputs only (``*inputs``), so the
    TorchScript exporter passes exactly the example inputs; restored afterwards."""
    own = vars(module).get("forward")
    bound = module.forward

    def forward(*inputs: Any) -> Any:
        return bound(*inputs)

    vars(module)["forward"] = forward
    try:
        yield
    finally:
        if own is None:
            del vars(module)["forward"]
        else:
            vars(module)["forward"] = own


def non_tensor_hint(value: Any) -> str:
    """What to do about a non-tensor module output: a transformers key/value cache (a
    ``DynamicCache``, ``past_key_values``) gets the switch that removes it."""
    if type(value).__name__.endswith("Cache"):
        return (
            "it is a key/value cache (transformers returns one by default): set "
            "model.config.use_cache = False before exporting, or wrap forward to return "
            "the tensors you need"
        )
    return "return tensors, or tuples/lists/dicts of tensors"
