"""Named tiny graph builders (float32, opset 17) and random inputs for them.

Every builder returns an ``onnx.ModelProto`` that passes ``onnx.checker``; weights come from a
seeded numpy RNG, so two calls give the same bytes.  Node and tensor names are fixed so that
tests can refer to them (``conv``, ``conv.weight``, ``conv_out``, ...).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT


# ------------------------------------------------------------------------------- plumbing
def rng(seed: int = 0) -> np.random.Generator:
    """The seeded generator every builder draws its weights from."""
    return np.random.default_rng(seed)


def weight(r: np.random.Generator, *shape: int, scale: float = 0.1) -> np.ndarray:
    """A float32 weight of ``shape``."""
    return (r.standard_normal(shape) * scale).astype(np.float32)


def init(name: str, value: np.ndarray) -> TensorProto:
    """An initializer from a numpy array."""
    return numpy_helper.from_array(np.ascontiguousarray(value), name)


def tensor(name: str, shape: list[int | str | None] | None, elem: int = FLOAT):
    """A ValueInfo (graph input or output)."""
    return helper.make_tensor_value_info(name, elem, shape)


def model(
    nodes, inputs, outputs, initializers=(), opset: int = OPSET, name: str = "tiny"
) -> onnx.ModelProto:
    """A checked model of one graph at ``opset``."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="onnxq-tests"
    )
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m)
    return m


def random_inputs(m: onnx.ModelProto, seed: int = 0, dynamic: int = 2) -> dict[str, np.ndarray]:
    """One batch of random values for the model's inputs (symbolic dims become ``dynamic``)."""
    r = rng(seed)
    inits = {t.name for t in m.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dynamic for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if dtype == np.bool_:
            out[vi.name] = np.asarray(r.integers(0, 2, size=shape).astype(bool))
        else:
            out[vi.name] = r.standard_normal(shape).astype(dtype)
    return out


def random_batches(m: onnx.ModelProto, n: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n`` random batches for ``m``."""
    return [random_inputs(m, seed=seed * 1000 + i) for i in range(n)]


def op_types(m: onnx.ModelProto) -> list[str]:
    """The op types of the top-level graph, in order."""
    return [n.op_type for n in m.graph.node]


def count_ops(m: onnx.ModelProto, op_type: str) -> int:
    """How many top-level nodes have ``op_type``."""
    return sum(n.op_type == op_type for n in m.graph.node)


# ------------------------------------------------------------------------------- builders
def conv_relu(
    channels: int = 16, out_channels: int = 16, size: int = 8, seed: int = 0
) -> onnx.ModelProto:
    """x -> Conv(3x3, bias) -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv.weight", "conv.bias"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    inits = [
        init("conv.weight", weight(r, out_channels, channels, 3, 3)),
        init("conv.bias", weight(r, out_channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, size, size])],
        [tensor("y", [1, out_channels, size, size])],
        inits,
        name="conv_relu",
    )


def conv_hardswish(op: str = "pair", channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv(3x3, bias) -> hardswish -> Conv(3x3) -> y; the hardswish as ``pair``
    (``x * HardSigmoid(x, 1/6, 1/2)``, before opset 14), ``HardSwish`` or ``Relu``."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "c1.weight", "c1.bias"], ["c1_out"], name="c1", pads=[1, 1, 1, 1]
        )
    ]
    if op == "pair":
        nodes += [
            helper.make_node(
                "HardSigmoid", ["c1_out"], ["gate"], name="gate", alpha=1 / 6, beta=0.5
            ),
            helper.make_node("Mul", ["c1_out", "gate"], ["act"], name="swish"),
        ]
    else:
        nodes.append(helper.make_node(op, ["c1_out"], ["act"], name="act"))
    nodes.append(
        helper.make_node("Conv", ["act", "c2.weight"], ["y"], name="c2", pads=[1, 1, 1, 1])
    )
    inits = [
        init("c1.weight", weight(r, channels, channels, 3, 3, scale=1.0)),
        init("c1.bias", weight(r, channels)),
        init("c2.weight", weight(r, channels, channels, 3, 3)),
    ]
    shape = [1, channels, 8, 8]
    return model(nodes, [tensor("x", shape)], [tensor("y", shape)], inits, name="conv_hardswish")


def conv_small(seed: int = 0) -> onnx.ModelProto:
    """A Conv with 3 input channels: TensorRT's min_channels=16 rule keeps it float."""
    return conv_relu(channels=3, out_channels=16, seed=seed)


def conv_bn_relu(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv(no bias) -> BatchNormalization -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv.weight"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "BatchNormalization",
            ["conv_out", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["bn_out"],
            name="bn",
            epsilon=1e-3,
        ),
        helper.make_node("Relu", ["bn_out"], ["y"], name="relu"),
    ]
    inits = [init("conv.weight", weight(r, channels, channels, 3, 3)), *_bn_params(r, channels)]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        inits,
        name="conv_bn_relu",
    )


def _bn_params(r: np.random.Generator, channels: int) -> list[TensorProto]:
    return [
        init("bn.scale", (1.0 + 0.2 * r.standard_normal(channels)).astype(np.float32)),
        init("bn.bias", (0.1 * r.standard_normal(channels)).astype(np.float32)),
        init("bn.mean", (0.1 * r.standard_normal(channels)).astype(np.float32)),
        init("bn.var", (0.5 + r.random(channels)).astype(np.float32)),
    ]


def conv_transpose(
    channels: int = 16, out_channels: int = 16, group: int = 1, seed: int = 0
) -> onnx.ModelProto:
    """x -> ConvTranspose(3x3, stride 2, bias) -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "ConvTranspose",
            ["x", "convt.weight", "convt.bias"],
            ["convt_out"],
            name="convt",
            strides=[2, 2],
            group=group,
        ),
        helper.make_node("Relu", ["convt_out"], ["y"], name="relu"),
    ]
    inits = [
        init("convt.weight", weight(r, channels, out_channels // group, 3, 3)),
        init("convt.bias", weight(r, out_channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, out_channels, 17, 17])],
        inits,
        name="conv_transpose",
    )


def conv_transpose_bn(
    channels: int = 16, out_channels: int = 16, group: int = 2, seed: int = 0
) -> onnx.ModelProto:
    """x -> ConvTranspose(group, no bias) -> BatchNormalization -> y (BN output is the graph's)."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "ConvTranspose", ["x", "convt.weight"], ["convt_out"], name="convt", group=group
        ),
        helper.make_node(
            "BatchNormalization",
            ["convt_out", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["y"],
            name="bn",
        ),
    ]
    inits = [
        init("convt.weight", weight(r, channels, out_channels // group, 3, 3)),
        *_bn_params(r, out_channels),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 6, 6])],
        [tensor("y", [1, out_channels, 8, 8])],
        inits,
        name="conv_transpose_bn",
    )


def residual_add(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> conv1 -> relu1 (skip) -> conv2; y = Add(conv2_out, skip)."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "conv1.weight", "conv1.bias"],
            ["conv1_out"],
            name="conv1",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["conv1_out"], ["skip"], name="relu1"),
        helper.make_node(
            "Conv",
            ["skip", "conv2.weight", "conv2.bias"],
            ["conv2_out"],
            name="conv2",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Add", ["conv2_out", "skip"], ["y"], name="add"),
    ]
    inits = [
        init("conv1.weight", weight(r, channels, channels, 3, 3)),
        init("conv1.bias", weight(r, channels)),
        init("conv2.weight", weight(r, channels, channels, 3, 3)),
        init("conv2.bias", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        inits,
        name="residual_add",
    )


def gemm(
    trans_b: bool = True, k: int = 32, n: int = 16, bias: bool = True, seed: int = 0
) -> onnx.ModelProto:
    """x[2, K] -> Gemm(B constant, transB) -> Relu -> y[2, N]."""
    r = rng(seed)
    b = weight(r, n, k) if trans_b else weight(r, k, n)
    inputs = ["x", "gemm.weight"] + (["gemm.bias"] if bias else [])
    nodes = [
        helper.make_node("Gemm", inputs, ["gemm_out"], name="gemm", transB=int(trans_b)),
        helper.make_node("Relu", ["gemm_out"], ["y"], name="relu"),
    ]
    inits = [init("gemm.weight", b)] + ([init("gemm.bias", weight(r, n))] if bias else [])
    return model(nodes, [tensor("x", [2, k])], [tensor("y", [2, n])], inits, name="gemm")


def gemm_bn(trans_b: bool = True, k: int = 32, n: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[2, K] -> Gemm(transB, bias) -> BatchNormalization -> Relu -> y."""
    r = rng(seed)
    b = weight(r, n, k) if trans_b else weight(r, k, n)
    nodes = [
        helper.make_node(
            "Gemm",
            ["x", "gemm.weight", "gemm.bias"],
            ["gemm_out"],
            name="gemm",
            transB=int(trans_b),
        ),
        helper.make_node(
            "BatchNormalization",
            ["gemm_out", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
            ["bn_out"],
            name="bn",
        ),
        helper.make_node("Relu", ["bn_out"], ["y"], name="relu"),
    ]
    inits = [init("gemm.weight", b), init("gemm.bias", weight(r, n)), *_bn_params(r, n)]
    return model(nodes, [tensor("x", [2, k])], [tensor("y", [2, n])], inits, name="gemm_bn")


def matmul_const(k: int = 32, n: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[1, 4, K] @ W[K, N] (constant) -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "matmul.weight"], ["matmul_out"], name="matmul"),
        helper.make_node("Relu", ["matmul_out"], ["y"], name="relu"),
    ]
    return model(
        nodes,
        [tensor("x", [1, 4, k])],
        [tensor("y", [1, 4, n])],
        [init("matmul.weight", weight(r, k, n))],
        name="matmul_const",
    )


def matmul_act(k: int = 32, n: int = 16) -> onnx.ModelProto:
    """a[1, 4, K] @ b[1, K, N], both activations (an attention core)."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="matmul")]
    return model(
        nodes,
        [tensor("a", [1, 4, k]), tensor("b", [1, k, n])],
        [tensor("y", [1, 4, n])],
        name="matmul_act",
    )


def shape_subgraph(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[N, C, 64] -> Shape -> Gather -> Concat -> Reshape(x, ...) -> Conv -> y.

    The batch dimension is symbolic, so simplify cannot fold the shape computation away.
    """
    r = rng(seed)
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
        helper.make_node("Gather", ["x_shape", "gather.index"], ["batch"], name="gather", axis=0),
        helper.make_node("Concat", ["batch", "reshape.tail"], ["new_shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "new_shape"], ["x4d"], name="reshape"),
        helper.make_node(
            "Conv", ["x4d", "conv.weight", "conv.bias"], ["y"], name="conv", pads=[1, 1, 1, 1]
        ),
    ]
    inits = [
        init("gather.index", np.array([0], dtype=np.int64)),
        init("reshape.tail", np.array([channels, 8, 8], dtype=np.int64)),
        init("conv.weight", weight(r, channels, channels, 3, 3)),
        init("conv.bias", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", ["N", channels, 64])],
        [tensor("y", ["N", channels, 8, 8])],
        inits,
        name="shape_subgraph",
    )


def with_constant_nodes(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """conv_relu whose weight and bias are Constant nodes instead of initializers."""
    r = rng(seed)
    w = weight(r, channels, channels, 3, 3)
    b = weight(r, channels)
    nodes = [
        helper.make_node(
            "Constant", [], ["conv.weight"], name="weight_const", value=numpy_helper.from_array(w)
        ),
        helper.make_node(
            "Constant", [], ["conv.bias"], name="bias_const", value=numpy_helper.from_array(b)
        ),
        helper.make_node(
            "Conv", ["x", "conv.weight", "conv.bias"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        name="with_constant_nodes",
    )


def identity_dropout(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Identity -> Conv -> Dropout(inference) -> Identity -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node("Identity", ["x"], ["x_id"], name="identity_in"),
        helper.make_node(
            "Conv",
            ["x_id", "conv.weight", "conv.bias"],
            ["conv_out"],
            name="conv",
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Dropout", ["conv_out"], ["drop_out"], name="dropout"),
        helper.make_node("Identity", ["drop_out"], ["mid"], name="identity_mid"),
        helper.make_node("Relu", ["mid"], ["y"], name="relu"),
    ]
    inits = [
        init("conv.weight", weight(r, channels, channels, 3, 3)),
        init("conv.bias", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        inits,
        name="identity_dropout",
    )


def if_model(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x -> Conv -> Relu -> t; y = If(cond, then: Identity(t), else: Neg(t))."""
    r = rng(seed)
    shape = [1, channels, 8, 8]
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["t"], ["then_out"], name="then_identity")],
        "then_branch",
        [],
        [tensor("then_out", shape)],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["t"], ["else_out"], name="else_neg")],
        "else_branch",
        [],
        [tensor("else_out", shape)],
    )
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv.weight", "conv.bias"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["conv_out"], ["t"], name="relu"),
        helper.make_node(
            "If", ["cond"], ["y"], name="if", then_branch=then_graph, else_branch=else_graph
        ),
    ]
    inits = [
        init("conv.weight", weight(r, channels, channels, 3, 3)),
        init("conv.bias", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", shape), tensor("cond", [], TensorProto.BOOL)],
        [tensor("y", shape)],
        inits,
        name="if_model",
    )


# --------------------------------------------------------------- graphs rules decline
def conv_dynamic_weight(channels: int = 16) -> onnx.ModelProto:
    """Conv whose weight is a graph input (not a constant)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8]), tensor("w", [channels, channels, 3, 3])],
        [tensor("y", [1, channels, 8, 8])],
        name="conv_dynamic_weight",
    )


def grouped_conv(
    channels: int = 16, group: int = 2, kernel: int = 1, seed: int = 0
) -> onnx.ModelProto:
    """x -> Conv(group, kernel x kernel) -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "conv.weight"],
            ["conv_out"],
            name="conv",
            group=group,
            pads=[kernel // 2] * 4,
        ),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    inits = [init("conv.weight", weight(r, channels, channels // group, kernel, kernel))]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        inits,
        name="grouped_conv",
    )


def gemm_act(k: int = 32, n: int = 16) -> onnx.ModelProto:
    """Gemm of two activations (B is a graph input)."""
    nodes = [helper.make_node("Gemm", ["x", "b"], ["y"], name="gemm")]
    return model(
        nodes, [tensor("x", [2, k]), tensor("b", [k, n])], [tensor("y", [2, n])], name="gemm_act"
    )


def matmul_vector(k: int = 32, seed: int = 0) -> onnx.ModelProto:
    """x[4, K] @ v[K] (a constant vector: GEMV)."""
    r = rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "matmul.weight"], ["y"], name="matmul")]
    return model(
        nodes,
        [tensor("x", [4, k])],
        [tensor("y", [4])],
        [init("matmul.weight", weight(r, k))],
        name="matmul_vector",
    )


def conv_add_broadcast(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """conv_out + z[1, C, 1, 1]: a broadcast Add, not a residual."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv.weight"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Add", ["conv_out", "z"], ["y"], name="add"),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8]), tensor("z", [1, channels, 1, 1])],
        [tensor("y", [1, channels, 8, 8])],
        [init("conv.weight", weight(r, channels, channels, 3, 3))],
        name="conv_add_broadcast",
    )


def shared_weight(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """One weight read by a Conv (channel axis 0) and a ConvTranspose (channel axis 1)."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "shared.weight"], ["conv_out"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "ConvTranspose", ["conv_out", "shared.weight"], ["y"], name="convt", pads=[1, 1, 1, 1]
        ),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, channels, 8, 8])],
        [init("shared.weight", weight(r, channels, channels, 3, 3))],
        name="shared_weight",
    )


def shared_input(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x feeds a Conv (quantized) and a Sigmoid (float): two outputs."""
    r = rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight"], ["y"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["x"], ["side"], name="sigmoid"),
    ]
    shape = [1, channels, 8, 8]
    return model(
        nodes,
        [tensor("x", shape)],
        [tensor("y", shape), tensor("side", shape)],
        [init("conv.weight", weight(r, channels, channels, 3, 3))],
        name="shared_input",
    )


def name_clash(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """conv_relu whose tensors already use the names materialize derives (x_quantized, ...)."""
    r = rng(seed)
    nodes = [
        helper.make_node(
            "Conv", ["x", "conv.weight", "x_scale"], ["x_quantized"], name="conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node("Relu", ["x_quantized"], ["x_dequantized"], name="x_QuantizeLinear"),
    ]
    inits = [
        init("conv.weight", weight(r, channels, channels, 3, 3)),
        init("x_scale", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("x_dequantized", [1, channels, 8, 8])],
        inits,
        name="name_clash",
    )


def log_model(channels: int = 16) -> onnx.ModelProto:
    """x -> Log -> Relu -> y: NaN for negative inputs."""
    nodes = [
        helper.make_node("Log", ["x"], ["log_out"], name="log"),
        helper.make_node("Relu", ["log_out"], ["y"], name="relu"),
    ]
    shape = [1, channels, 8, 8]
    return model(nodes, [tensor("x", shape)], [tensor("y", shape)], name="log_model")


# --------------------------------------------------------------- onnxruntime rule-set graphs
def binary(op_type: str = "Add", tail: bool = True, channels: int = 16) -> onnx.ModelProto:
    """a, b -> Add/Mul -> (Relu) -> y: two activations into an element-wise op."""
    out = "bin_out" if tail else "y"
    nodes = [helper.make_node(op_type, ["a", "b"], [out], name="binary")]
    if tail:
        nodes.append(helper.make_node("Relu", ["bin_out"], ["y"], name="relu"))
    shape = [1, channels, 8, 8]
    return model(
        nodes,
        [tensor("a", shape), tensor("b", shape)],
        [tensor("y", shape)],
        name=f"binary_{op_type}",
    )


def mul_const(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x * constant -> Relu -> y."""
    r = rng(seed)
    shape = [1, channels, 8, 8]
    nodes = [
        helper.make_node("Mul", ["x", "mul.scale"], ["mul_out"], name="binary"),
        helper.make_node("Relu", ["mul_out"], ["y"], name="relu"),
    ]
    return model(
        nodes,
        [tensor("x", shape)],
        [tensor("y", shape)],
        [init("mul.scale", weight(r, 1, channels, 1, 1))],
        name="mul_const",
    )


def concat(tail: bool = True, channels: int = 16) -> onnx.ModelProto:
    """a, b -> Concat(axis 1) -> (Relu) -> y."""
    out = "cat_out" if tail else "y"
    nodes = [helper.make_node("Concat", ["a", "b"], [out], name="concat", axis=1)]
    if tail:
        nodes.append(helper.make_node("Relu", ["cat_out"], ["y"], name="relu"))
    shape = [1, channels, 8, 8]
    return model(
        nodes,
        [tensor("a", shape), tensor("b", shape)],
        [tensor("y", [1, 2 * channels, 8, 8])],
        name="concat",
    )


def unary(op_type: str = "Sigmoid", tail: bool = True, channels: int = 16) -> onnx.ModelProto:
    """x -> Sigmoid/GlobalAveragePool/... -> (Relu) -> y."""
    out = "unary_out" if tail else "y"
    nodes = [helper.make_node(op_type, ["x"], [out], name="unary")]
    if tail:
        nodes.append(helper.make_node("Relu", ["unary_out"], ["y"], name="relu"))
    out_shape = [1, channels, 1, 1] if op_type == "GlobalAveragePool" else [1, channels, 8, 8]
    return model(
        nodes, [tensor("x", [1, channels, 8, 8])], [tensor("y", out_shape)], name=f"unary_{op_type}"
    )


def two_branch_concat(channels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """Two convs on x, concatenated, then a Sigmoid -> y (a small onnxruntime-backend net)."""
    r = rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["c1_out"], name="c1"),
        helper.make_node("Conv", ["x", "c2.weight", "c2.bias"], ["c2_out"], name="c2"),
        helper.make_node("Concat", ["c1_out", "c2_out"], ["cat"], name="concat", axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["pooled"], name="gap"),
        helper.make_node("Sigmoid", ["pooled"], ["y"], name="sigmoid"),
    ]
    inits = [
        init("c1.weight", weight(r, channels, channels, 1, 1)),
        init("c1.bias", weight(r, channels)),
        init("c2.weight", weight(r, channels, channels, 1, 1)),
        init("c2.bias", weight(r, channels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, channels, 8, 8])],
        [tensor("y", [1, 2 * channels, 1, 1])],
        inits,
        name="two_branch_concat",
    )


# Every float builder (no argument needed) by name, for parametrized tests.
def spectrogram(bins: int = 32, mels: int = 16, seed: int = 0) -> onnx.ModelProto:
    """An audio front end and a learned layer: x [1, 1, 16384] -> two strided Convs (an STFT's
    real and imaginary parts) -> squares -> Add (power) -> Transpose -> MatMul (mel) ->
    Clip(1e-6) -> Log -> Transpose -> Conv(k3, 16 -> 16) -> Relu -> y."""
    r = rng(seed)
    nodes = [
        helper.make_node("Conv", ["x", "stft_re.weight"], ["re"], name="stft_re", strides=[16]),
        helper.make_node("Conv", ["x", "stft_im.weight"], ["im"], name="stft_im", strides=[16]),
        helper.make_node("Mul", ["re", "re"], ["re2"], name="re_sq"),
        helper.make_node("Mul", ["im", "im"], ["im2"], name="im_sq"),
        helper.make_node("Add", ["re2", "im2"], ["power"], name="power"),
        helper.make_node("Transpose", ["power"], ["power_t"], name="power_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["power_t", "mel.weight"], ["mel"], name="mel"),
        helper.make_node("Clip", ["mel", "eps"], ["mel_floor"], name="floor"),
        helper.make_node("Log", ["mel_floor"], ["logmel"], name="log"),
        helper.make_node("Transpose", ["logmel"], ["features"], name="features", perm=[0, 2, 1]),
        helper.make_node(
            "Conv", ["features", "conv.weight", "conv.bias"], ["conv_out"], name="conv", pads=[1, 1]
        ),
        helper.make_node("Relu", ["conv_out"], ["y"], name="relu"),
    ]
    inits = [
        init("stft_re.weight", weight(r, bins, 1, 64)),
        init("stft_im.weight", weight(r, bins, 1, 64)),
        init("mel.weight", np.abs(weight(r, bins, mels))),
        init("eps", np.array(1e-6, dtype=np.float32)),
        init("conv.weight", weight(r, mels, mels, 3)),
        init("conv.bias", weight(r, mels)),
    ]
    return model(
        nodes,
        [tensor("x", [1, 1, 16384])],
        [tensor("y", [1, mels, 1021])],
        inits,
        name="spectrogram",
    )


def two_head_detector(channels: int = 32, squash: str = "Sigmoid") -> onnx.ModelProto:
    """x -> body Conv -> Relu -> (cls Conv, box Conv) -> Concat -> Reshape -> Split ->
    (``squash``ed scores, boxes) -> Concat -> y, and a second output through an Add of two
    computed tensors."""
    r = rng(1)
    c = channels
    nodes = [
        helper.make_node("Conv", ["x", "wb"], ["b"], name="body", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["br"], name="relu"),
        helper.make_node("Conv", ["br", "wc"], ["cls"], name="cls"),
        helper.make_node("Conv", ["br", "wx"], ["box"], name="box"),
        helper.make_node("Concat", ["box", "cls"], ["cat"], name="cat", axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["flat"], name="reshape"),
        helper.make_node("Split", ["flat", "sizes"], ["boxes", "logits"], name="split", axis=1),
        helper.make_node(squash, ["logits"], ["scores"], name="sigmoid"),
        helper.make_node("Concat", ["boxes", "scores"], ["y"], name="out", axis=1),
        helper.make_node("Conv", ["br", "wm"], ["m"], name="mixed"),
        helper.make_node("Add", ["m", "br"], ["z"], name="add"),
    ]
    inits = [
        init("wb", weight(r, c, c, 3, 3)),
        init("wc", weight(r, c, c, 1, 1)),
        init("wx", weight(r, c, c, 1, 1)),
        init("wm", weight(r, c, c, 1, 1)),
        init("shape", np.array([1, 2 * c, -1])),
        init("sizes", np.array([c, c])),
    ]
    return model(
        nodes,
        [tensor("x", [1, c, 8, 8])],
        [tensor("y", [1, 2 * c, 64]), tensor("z", [1, c, 8, 8])],
        inits,
    )


BUILDERS = {
    "conv_relu": conv_relu,
    "conv_small": conv_small,
    "conv_bn_relu": conv_bn_relu,
    "conv_transpose": conv_transpose,
    "residual_add": residual_add,
    "gemm_transb1": lambda: gemm(trans_b=True),
    "gemm_transb0": lambda: gemm(trans_b=False),
    "matmul_const": matmul_const,
    "matmul_act": matmul_act,
    "shape_subgraph": shape_subgraph,
    "with_constant_nodes": with_constant_nodes,
    "identity_dropout": identity_dropout,
    "if_model": if_model,
    "two_branch_concat": two_branch_concat,
    "spectrogram": spectrogram,
    "tabular_mlp": lambda: tabular(),
    "tabular_trees": lambda: tabular(trees=True),
}


def with_tail(m: onnx.ModelProto, op_type: str = "Sigmoid") -> onnx.ModelProto:
    """``m`` with one more op after its first output, so that output is no longer a graph output
    (onnxruntime fuses a Conv only when its output can be quantized)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    old = out.graph.output[0]
    tail_name = f"{old.name}_tail"
    out.graph.node.append(helper.make_node(op_type, [old.name], [tail_name], name="tail"))
    new = onnx.ValueInfoProto()
    new.CopyFrom(old)
    new.name = tail_name
    out.graph.output[0].CopyFrom(new)
    return out


def tabular(trees: bool = False, k: int = 64, n: int = 32) -> onnx.ModelProto:
    """A scikit-learn-style pipeline: x[N, K] -> ai.onnx.ml Scaler -> MatMul W[K, N] (a PCA) ->
    Relu -> MatMul -> y[N, 4] (an MLP), or (``trees``) -> an ai.onnx.ml TreeEnsembleRegressor
    with one split per tree on the projected features.  onnx's shape inference does not read
    the Scaler, so every shape after it is unknown."""
    r = rng(3)
    nodes = [
        helper.make_node(
            "Scaler",
            ["x"],
            ["scaled"],
            name="scaler",
            domain="ai.onnx.ml",
            offset=[0.5] * k,
            scale=[2.0] * k,
        ),
        helper.make_node("MatMul", ["scaled", "pca.weight"], ["projected"], name="pca"),
    ]
    inits = [init("pca.weight", weight(r, k, n))]
    if trees:
        count = 4  # tree t splits feature t at 0: leaf 1 (<=) or leaf 2 (>)
        nodes.append(
            helper.make_node(
                "TreeEnsembleRegressor",
                ["projected"],
                ["y"],
                name="forest",
                domain="ai.onnx.ml",
                n_targets=1,
                nodes_treeids=[t for t in range(count) for _ in range(3)],
                nodes_nodeids=[0, 1, 2] * count,
                nodes_featureids=[f for t in range(count) for f in (t, 0, 0)],
                nodes_values=[0.0] * (3 * count),
                nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"] * count,
                nodes_truenodeids=[1, 0, 0] * count,
                nodes_falsenodeids=[2, 0, 0] * count,
                target_treeids=[t for t in range(count) for _ in range(2)],
                target_nodeids=[1, 2] * count,
                target_ids=[0, 0] * count,
                target_weights=[float(w) for t in range(count) for w in (-1 - t, 1 + t)],
            )
        )
        out = tensor("y", [None, 1])
    else:
        nodes += [
            helper.make_node("Relu", ["projected"], ["hidden"], name="relu"),
            helper.make_node("MatMul", ["hidden", "out.weight"], ["y"], name="out"),
        ]
        inits.append(init("out.weight", weight(r, n, 4)))
        out = tensor("y", [None, 4])
    graph = helper.make_graph(nodes, "tabular", [tensor("x", [None, k])], [out], inits)
    m = helper.make_model(
        graph,
        producer_name="onnxq-tests",
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 3)],
    )
    m.ir_version = IR_VERSION
    onnx.checker.check_model(m)
    return m


def feature_encoder(norm_after_first: bool = False, seed: int = 0) -> onnx.ModelProto:
    """A speech feature encoder: x[N, 1, T] -> Conv1d(1 -> 16, k3) 'conv0' -> Relu
    [-> InstanceNormalization] -> Conv1d(16 -> 16, k3) 'conv1' -> Relu -> Conv1d(16 -> 16, k3)
    'conv2' -> Transpose to [N, T, C] -> LayerNormalization -> MatMul(16 -> 16) 'proj' -> y."""
    r = rng(seed)
    inits = [
        init("w0", weight(r, 16, 1, 3, scale=0.5)),
        init("w1", weight(r, 16, 16, 3)),
        init("w2", weight(r, 16, 16, 3)),
        init("ln.g", np.ones(16, np.float32)),
        init("ln.b", np.zeros(16, np.float32)),
        init("proj.w", weight(r, 16, 16)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", kernel_shape=[3]),
        helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
    ]
    first = "r0"
    if norm_after_first:
        inits += [init("in.g", np.ones(16, np.float32)), init("in.b", np.zeros(16, np.float32))]
        nodes.append(
            helper.make_node("InstanceNormalization", ["r0", "in.g", "in.b"], ["n0"], name="norm0")
        )
        first = "n0"
    nodes += [
        helper.make_node("Conv", [first, "w1"], ["c1"], name="conv1", kernel_shape=[3]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", kernel_shape=[3]),
        helper.make_node("Transpose", ["c2"], ["t"], name="to_nlc", perm=[0, 2, 1]),
        helper.make_node("LayerNormalization", ["t", "ln.g", "ln.b"], ["ln"], name="ln", axis=-1),
        helper.make_node("MatMul", ["ln", "proj.w"], ["y"], name="proj"),
    ]
    return model(
        nodes,
        [tensor("x", ["n", 1, "t"])],
        [tensor("y", ["n", "t2", 16])],
        inits,
        name="feature_encoder",
    )


def nms_detector() -> onnx.ModelProto:
    """x[1, 64, 256] -> MatMul -> Relu -> MatMul -> 64 boxes and scores -> NonMaxSuppression
    -> the kept indices ``sel`` and their boxes ``picked`` (a detector's post-processing)."""
    r = rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["o"], name="fc2"),
        helper.make_node("Slice", ["o", "s0", "s4", "ax"], ["boxes"], name="box_slice"),
        helper.make_node("Slice", ["o", "s4", "s5", "ax"], ["score_col"], name="score_slice"),
        helper.make_node("Transpose", ["score_col"], ["scores"], name="to_classes", perm=[0, 2, 1]),
        helper.make_node(
            "NonMaxSuppression", ["boxes", "scores", "max_out", "iou"], ["sel"], name="nms"
        ),
        helper.make_node("Gather", ["sel", "two"], ["idx"], name="pick_index", axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["boxes2"], name="flat"),
        helper.make_node("Gather", ["boxes2", "idx"], ["picked"], name="pick", axis=0),
    ]
    inits = [
        init("w1", weight(r, 256, 64, scale=0.1)),
        init("w2", weight(r, 64, 5, scale=0.3)),
        helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("s4", TensorProto.INT64, [1], [4]),
        helper.make_tensor("s5", TensorProto.INT64, [1], [5]),
        helper.make_tensor("ax", TensorProto.INT64, [1], [2]),
        helper.make_tensor("max_out", TensorProto.INT64, [1], [16]),
        helper.make_tensor("iou", TensorProto.FLOAT, [1], [0.5]),
        helper.make_tensor("two", TensorProto.INT64, [], [2]),
        helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
    ]
    return model(
        nodes,
        [tensor("x", [1, 64, 256])],
        [tensor("picked", ["k", 4]), tensor("sel", ["k", 3], TensorProto.INT64)],
        inits,
        name="nms_detector",
    )


def recurrent(
    cell: str = "LSTM", steps: int | str = "t", features: int = 64, hidden: int = 64, seed: int = 0
) -> onnx.ModelProto:
    """x[steps, batch, F] -> LSTM/GRU/RNN (constant W, R, B) -> its output y -> MatMul
    (constant [hidden, 128]) -> Relu -> out: a recurrent keyword spotter's core."""
    r = rng(seed)
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    nodes = [
        helper.make_node(
            cell, ["x", "rnn.W", "rnn.R", "rnn.B"], ["y"], name="rnn", hidden_size=hidden
        ),
        helper.make_node("Squeeze", ["y", "one"], ["h"], name="squeeze"),
        helper.make_node("MatMul", ["h", "fc.weight"], ["fc_out"], name="fc"),
        helper.make_node("Relu", ["fc_out"], ["out"], name="relu"),
    ]
    inits = [
        init("rnn.W", weight(r, 1, gates * hidden, features, scale=0.2)),
        init("rnn.R", weight(r, 1, gates * hidden, hidden, scale=0.2)),
        init("rnn.B", weight(r, 1, 2 * gates * hidden, scale=0.1)),
        init("fc.weight", weight(r, hidden, 128)),
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
    ]
    return model(
        nodes,
        [tensor("x", [steps, 2, features])],
        [tensor("out", [steps, 2, 128])],
        inits,
        name=f"{cell.lower()}_model",
    )


def matmul_stack(k: int = 128, n: int = 256, seed: int = 0) -> onnx.ModelProto:
    """x[B, 8, K] -> MatMul(W1 [K, N]) -> Relu -> MatMul(W2 [N, K]) -> y, and x @ x^T (an
    activation x activation MatMul, as attention's scores) -> scores."""
    r = rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Relu", ["h"], ["hr"], name="relu"),
        helper.make_node("MatMul", ["hr", "w2"], ["y"], name="down"),
        helper.make_node("Transpose", ["x"], ["xt"], name="xt", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"], name="scores"),
    ]
    inits = [init("w1", weight(r, k, n)), init("w2", weight(r, n, k))]
    return model(
        nodes,
        [tensor("x", ["b", 8, k])],
        [tensor("y", ["b", 8, k]), tensor("scores", ["b", 8, 8])],
        inits,
        name="matmul_stack",
    )


def swiglu(
    gate_op: str = "Mul",
    outliers: tuple[int, ...] = (),
    gain: bool = False,
    up_read_twice: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """A SwiGLU block: x (* gain [128]) -> g = x W_gate, u = x W_up [128, 256], SiLU(g) = g *
    Sigmoid(g), h = SiLU(g) ``gate_op`` u, y = h W_down [256, 128].  The columns ``outliers`` of
    W_gate and W_up are 6x louder (their channels of h about 36x); ``up_read_twice`` makes u a
    graph output too."""
    r = rng(seed)
    wg, wu, wd = weight(r, 128, 256), weight(r, 128, 256), weight(r, 256, 128)
    for j in outliers:
        wg[:, j] *= 6.0
        wu[:, j] *= 6.0
    source = "xg" if gain else "x"
    nodes = [helper.make_node("Mul", ["x", "gain"], ["xg"], name="norm_gain")] if gain else []
    nodes += [
        helper.make_node("MatMul", [source, "wg"], ["g"], name="gate"),
        helper.make_node("MatMul", [source, "wu"], ["u"], name="up"),
        helper.make_node("Sigmoid", ["g"], ["sg"], name="sigmoid"),
        helper.make_node("Mul", ["g", "sg"], ["silu"], name="silu"),
        helper.make_node(gate_op, ["silu", "u"], ["h"], name="glu"),
        helper.make_node("MatMul", ["h", "wd"], ["y"], name="down"),
    ]
    inits = [init("wg", wg), init("wu", wu), init("wd", wd)]
    if gain:
        inits.append(init("gain", (1.0 + r.random(128)).astype(np.float32)))
    outputs = [tensor("y", [2, 8, 128])] + ([tensor("u", [2, 8, 256])] if up_read_twice else [])
    return model(nodes, [tensor("x", [2, 8, 128])], outputs, inits)


def encoder_block(
    hidden: int = 64, residual_readers: int = 1, skip_shape: tuple = ("b", "s", 64), seed: int = 0
) -> onnx.ModelProto:
    """x[b, s, H] -> MatMul + bias Add 'dense' -> Add(skip) 'residual' -> LayerNormalization ->
    y (a transformer encoder's residual connection); with ``residual_readers`` 2 a Relu reads
    the residual sum too (output 'side').  Shapes inferred."""
    r = rng(seed)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"], name="dense"),
        helper.make_node("Add", ["mm", "bias"], ["h"], name="dense_bias"),
        helper.make_node("Add", ["h", "skip"], ["sum"], name="residual"),
        helper.make_node("LayerNormalization", ["sum", "g", "beta"], ["y"], name="ln", axis=-1),
    ]
    outputs = [tensor("y", ["b", "s", hidden])]
    if residual_readers == 2:
        nodes.append(helper.make_node("Relu", ["sum"], ["side"], name="side"))
        outputs.append(tensor("side", ["b", "s", hidden]))
    inits = [
        init("w", weight(r, hidden, hidden)),
        init("bias", weight(r, hidden)),
        init("g", 1 + weight(r, hidden)),
        init("beta", weight(r, hidden)),
    ]
    inputs = [tensor("x", ["b", "s", hidden]), tensor("skip", list(skip_shape))]
    m = model(nodes, inputs, outputs, inits, opset=17, name="encoder_block")
    return onnx.shape_inference.infer_shapes(m)
