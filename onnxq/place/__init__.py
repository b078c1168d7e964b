"""Placement: where Q/DQ go and why each op does or does not get them, as one stage.

* :mod:`~onnxq.place.facts`: :class:`GraphFacts`, what the graph says before any data (shape
  paths, precision paths, heads, score maps, grouped and position-normalised convs, where
  readers saturate), computed once per run.
* :mod:`~onnxq.place.engine`: :func:`annotate`, one pass of the profile's rule set
  (``onnxq.place.rules.weighted``, ``static``): rules claim, the engine collects.
* :mod:`~onnxq.place.exclusions`: :data:`EXCLUSIONS`, the decisions that need the calibration
  data, as values.
* :mod:`~onnxq.place.loop`: :func:`place`, the one loop of placement and measurement.
* :mod:`~onnxq.place.annotations`: the stage's output, :class:`Annotations` and one
  :class:`Decision` per node, which ``materialize`` and the report read.

The modules are imported one by one (``from onnxq.place.loop import place``); this package
file imports none of them, so the rules can read the graph facts without an import circle.
"""
