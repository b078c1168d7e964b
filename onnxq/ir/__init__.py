"""Model I/O and graph plumbing: the only package that edits ONNX protos.

``load_model`` reads a model safely (external data confined to the model's folder), upgrades an
opset too old for per-axis Q/DQ and runs shape inference.  :class:`Graph` is an index over a
``GraphProto`` (producers, consumers, constants, types) with the few edits the pipeline needs;
after a batch of edits, :meth:`Graph.commit` re-sorts the nodes topologically and drops what no
longer feeds an output.  ``save_model`` writes atomically.  Past ``external.LAZY_BYTES`` of
external data, weights stay on disk until read (``onnxq.ir.external``).
"""

from onnxq.ir import external
from onnxq.ir.augment import PEAKS_OUTPUT, with_channel_peaks, with_outputs
from onnxq.ir.bodies import CONTROL_FLOW_OPS, Body, all_bodies, every_node
from onnxq.ir.bodies import opens as opens_body
from onnxq.ir.body_graph import BodyGraph, child_graphs, scope_index, scopes
from onnxq.ir.constants import (
    DEFAULT_DOMAINS,
    INTEGER_OPS,
    PROTO_LIMIT,
    QDQ_OPS,
    WEIGHT_ONLY_OPS,
    is_integer_op,
)
from onnxq.ir.graph import ConstInfo, Graph
from onnxq.ir.load import check_model, load_model, name_nodes, sort_nodes, unshare_biases
from onnxq.ir.node_values import constant_node_value, has_subgraph, inner_op_types, node_attrs
from onnxq.ir.ops import BIAS_READERS, WEIGHTED_OP_TYPES, WEIGHTED_OPS
from onnxq.ir.opset import (
    LoadRecord,
    OpsetUpgrade,
    drop_initializer_inputs,
    lower_ir_version,
    opset_purpose,
    opset_version,
    set_domain_opset,
    set_opset,
    upgrade_opset,
)
from onnxq.ir.order import attr_graphs, node_reads
from onnxq.ir.probe_plan import Probe, ProbePlan, never_ran, unrun
from onnxq.ir.probes import with_probes
from onnxq.ir.save import (
    atomic_write_bytes,
    inline_nbytes,
    model_nbytes,
    runtime_ir_version,
    save_model,
    serialize,
    session_bytes_or_path,
    weight_nbytes,
)
from onnxq.ir.scratch import interrupt, scratch_dir, uninterrupted
from onnxq.ir.shapes import infer_shapes, shapes_for_inputs
from onnxq.ir.twin import ACCUMULATED, LOCAL, Twin, pruned, twin_model
from onnxq.ir.weightless import copy_without_initializers

__all__ = [
    "ACCUMULATED",
    "BIAS_READERS",
    "CONTROL_FLOW_OPS",
    "DEFAULT_DOMAINS",
    "INTEGER_OPS",
    "LOCAL",
    "PEAKS_OUTPUT",
    "PROTO_LIMIT",
    "QDQ_OPS",
    "WEIGHTED_OPS",
    "WEIGHTED_OP_TYPES",
    "WEIGHT_ONLY_OPS",
    "Body",
    "BodyGraph",
    "ConstInfo",
    "Graph",
    "LoadRecord",
    "OpsetUpgrade",
    "Probe",
    "ProbePlan",
    "Twin",
    "all_bodies",
    "atomic_write_bytes",
    "attr_graphs",
    "check_model",
    "child_graphs",
    "constant_node_value",
    "copy_without_initializers",
    "drop_initializer_inputs",
    "every_node",
    "external",
    "has_subgraph",
    "infer_shapes",
    "inline_nbytes",
    "inner_op_types",
    "interrupt",
    "is_integer_op",
    "load_model",
    "lower_ir_version",
    "model_nbytes",
    "name_nodes",
    "never_ran",
    "node_attrs",
    "node_reads",
    "opens_body",
    "opset_purpose",
    "opset_version",
    "pruned",
    "runtime_ir_version",
    "save_model",
    "scope_index",
    "scopes",
    "scratch_dir",
    "serialize",
    "session_bytes_or_path",
    "set_domain_opset",
    "set_opset",
    "shapes_for_inputs",
    "sort_nodes",
    "twin_model",
    "uninterrupted",
    "unrun",
    "unshare_biases",
    "upgrade_opset",
    "weight_nbytes",
    "with_channel_peaks",
    "with_outputs",
    "with_probes",
]
