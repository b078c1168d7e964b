"""A hypothesis strategy for random *valid* float32 ONNX graphs (opset 17, batch 1, small sizes).

``fuzz_cases()`` draws a :class:`FuzzCase`: a model built op by op over a pool of float
activations whose static shapes are tracked exactly, plus a seed for calibration batches.  Ops:
Conv (plain and depthwise), Gemm, MatMul (constant and activation x activation), Add, Mul,
Concat, Relu, Clip, Reshape, Transpose, MaxPool, AveragePool, Resize, Slice, Split, Softmax,
LayerNormalization, Where, the Shape -> Gather -> Concat -> Reshape idiom, and control flow
(``tests/fuzz_control_flow.py``): If (condition ``ReduceSum(t) > 0`` on an activation, two
branches reading the outer scope, a Conv or MatMul among their choices), Loop and Scan (a
MatMul in the body).  Constants (weights, shapes, scalars) are initializers or ``Constant``
nodes at random.

Every case passes ``onnx.checker`` (full check, strict shape inference agrees with the tracked
shapes) and runs in onnxruntime with finite outputs; anything else is filtered with ``assume``
(set ``FUZZGRAPHS_STRICT=1`` to raise instead, which is how the generator itself is debugged).
Graphs on which onnxruntime's optimizer changes the float results are filtered too (always
``assume``: that is an onnxruntime bug, not something the generator or onnxq got wrong).

The graphs are *well conditioned* on purpose, so that a quantization error bound means something:

* weights are scaled by ``gain / sqrt(fan_in)``, so activations stay O(1) at any depth and
  Softmax never sees logits large enough to turn into a near-argmax;
* switching ops are continuous at the switch: ``Where(x > 0, x, a * x)`` (a leaky ReLU), and an
  ``If`` whose condition reads an intermediate activation exposes that condition as an extra bool
  output, so the oracle can tell a legitimate branch flip (quantization noise moved the sum
  across 0) from an error;
* LayerNormalization normalizes at least 8 values (over fewer, e.g. 2, it is a sign function).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import assume
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from tests.fuzz_control_flow import op_if, op_loop, op_scan

OPSET = 17
IR_VERSION = 8
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
STRICT = os.environ.get("FUZZGRAPHS_STRICT") == "1"


@dataclass
class Tensor:
    """A float activation in the pool, with its exact static shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class FuzzCase:
    """A generated model and the seed of its calibration batches."""

    model: onnx.ModelProto
    seed: int
    ops: list[str] = field(default_factory=list)

    def batches(self, n: int = 4, seed_offset: int = 0) -> list[dict[str, np.ndarray]]:
        """``n`` batches of N(0, 1) float32 values for the model's inputs."""
        return random_batches(self.model, n, self.seed + seed_offset)

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}{_dims(i)}" for i in self.model.graph.input)
        outs = ", ".join(f"{o.name}{_dims(o)}" for o in self.model.graph.output)
        return f"FuzzCase(seed={self.seed}, inputs=[{ins}], ops={self.ops}, outputs=[{outs}])"


def _dims(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


def random_batches(model: onnx.ModelProto, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        batch = {}
        for vi in model.graph.input:
            shape = _dims(vi)
            batch[vi.name] = r.standard_normal(shape).astype(np.float32)
        out.append(batch)
    return out


# ------------------------------------------------------------------------------- the builder
class Builder:
    """Accumulates nodes and constants; every op method consumes pool tensors and adds new."""

    def __init__(self, draw: Callable, rng: np.random.Generator):
        self.draw = draw
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []
        self.pool: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.consumed: set[str] = set()
        self.extra_outputs: list[onnx.ValueInfoProto] = []
        self.ops: list[str] = []
        self._n = 0

    # -- plumbing ----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{base}_{self._n}"

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=self.fresh(op), **attrs))
        self.consumed.update(i for i in inputs if i)

    def const(self, base: str, value: np.ndarray) -> str:
        """A constant as an initializer or a Constant node (drawn)."""
        name = self.fresh(base)
        value = np.asarray(value)
        if self.draw(st.booleans()):
            self.inits.append(numpy_helper.from_array(value, name))
        else:
            self.nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [name],
                    name=self.fresh("Constant"),
                    value=numpy_helper.from_array(value, name),
                )
            )
        return name

    def ints(self, base: str, values: list[int]) -> str:
        return self.const(base, np.asarray(values, dtype=np.int64))

    def weight(self, shape: tuple[int, ...], fan_in: int, gain: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * gain / math.sqrt(max(fan_in, 1))).astype(
            np.float32
        )

    def add(self, name: str, shape: tuple[int, ...]) -> Tensor:
        t = Tensor(name, tuple(int(d) for d in shape))
        assert all(d >= 1 for d in t.shape), t
        self.pool.append(t)
        return t

    def pick(self, pred: Callable[[Tensor], bool] = lambda t: True) -> Tensor | None:
        """A pool tensor satisfying ``pred``, newest first (so shrinking favours chains)."""
        cands = [t for t in reversed(self.pool) if pred(t)]
        return self.draw(st.sampled_from(cands)) if cands else None

    def choice(self, values):
        return self.draw(st.sampled_from(list(values)))


Op = Callable[[Builder], bool]


def _rank(n: int) -> Callable[[Tensor], bool]:
    return lambda t: t.rank == n


def _rank_at_least(n: int) -> Callable[[Tensor], bool]:
    return lambda t: t.rank >= n


# ------------------------------------------------------------------------------- ops
def op_conv(b: Builder) -> bool:
    x = b.pick(_rank(4))
    if x is None:
        return False
    batch, c, h, w = x.shape
    depthwise = c > 1 and b.draw(st.booleans())
    if depthwise:
        group, out_c = c, c * b.choice([1, 2])
    else:
        group, out_c = 1, b.choice([1, 4, 16, 16, 24, 32, 32])
    k = b.choice([1, 3, 5])
    pad = b.choice([0, k // 2])
    stride = b.choice([1, 2])
    if h + 2 * pad < k or w + 2 * pad < k:
        pad = k // 2
        if h + 2 * pad < k or w + 2 * pad < k:
            return False
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    fan_in = (c // group) * k * k
    inputs = [x.name, b.const("conv_w", b.weight((out_c, c // group, k, k), fan_in, 1.4))]
    if b.draw(st.booleans()):
        inputs.append(b.const("conv_b", b.weight((out_c,), 1, 0.1)))
    y = b.fresh("conv")
    b.node(
        "Conv", inputs, [y], kernel_shape=[k, k], pads=[pad] * 4, strides=[stride] * 2, group=group
    )
    b.add(y, (batch, out_c, oh, ow))
    b.ops.append(f"Conv{'dw' if depthwise else ''}{k}x{k}/{stride}:{c}->{out_c}")
    return True


def op_gemm(b: Builder) -> bool:
    x = b.pick(_rank(2))
    if x is None:
        return False
    k = x.shape[1]
    n = b.choice([1, 4, 16, 32, 48])
    trans_b = b.draw(st.booleans())
    w = b.weight((n, k) if trans_b else (k, n), k, 1.4)
    inputs = [x.name, b.const("gemm_w", w)]
    bias = b.choice(["none", "vector", "row", "scalar"])
    if bias == "vector":
        inputs.append(b.const("gemm_b", b.weight((n,), 1, 0.1)))
    elif bias == "row":
        inputs.append(b.const("gemm_b", b.weight((1, n), 1, 0.1)))
    elif bias == "scalar":
        inputs.append(b.const("gemm_b", b.weight((1,), 1, 0.1)))
    alpha = b.choice([1.0, 0.5])
    beta = b.choice([1.0, 2.0])
    y = b.fresh("gemm")
    b.node("Gemm", inputs, [y], transB=int(trans_b), alpha=alpha, beta=beta)
    b.add(y, (x.shape[0], n))
    b.ops.append(f"Gemm{'T' if trans_b else ''}:{k}->{n}")
    return True


def op_matmul(b: Builder) -> bool:
    x = b.pick(_rank_at_least(2))
    if x is None:
        return False
    k = x.shape[-1]
    kind = b.choice(["const", "const", "const", "vector", "self"])
    y = b.fresh("matmul")
    if kind == "const":
        n = b.choice([1, 4, 16, 32, 32])
        b.node("MatMul", [x.name, b.const("mm_w", b.weight((k, n), k, 1.4))], [y])
        b.add(y, (*x.shape[:-1], n))
        b.ops.append(f"MatMul:{k}->{n}")
    elif kind == "vector":
        b.node("MatMul", [x.name, b.const("mm_v", b.weight((k,), k, 1.0))], [y])
        b.add(y, x.shape[:-1])
        b.ops.append(f"MatMulVec:{k}")
    else:  # x @ x^T / k: activation x activation, kept O(1)
        m = x.shape[-2]
        perm = list(range(x.rank))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        xt = b.fresh("xT")
        b.node("Transpose", [x.name], [xt], perm=perm)
        raw = b.fresh("gram")
        b.node("MatMul", [x.name, xt], [raw])
        b.node("Mul", [raw, b.const("inv_k", np.asarray(1.0 / k, np.float32))], [y])
        b.add(y, (*x.shape[:-2], m, m))
        b.ops.append(f"MatMulAct:{m}x{k}")
    return True


def op_binary(b: Builder) -> bool:
    op = b.choice(["Add", "Mul"])
    x = b.pick()
    assert x is not None
    y = b.fresh(op.lower())
    same = [t for t in b.pool if t.shape == x.shape]
    if b.draw(st.booleans()) and same:
        other = b.draw(st.sampled_from(same))
        b.node(op, [x.name, other.name], [y])
        b.ops.append(f"{op}(act,act){list(x.shape)}")
    else:
        forms = ["scalar", "last", "full"] + (["channel"] if x.rank == 4 else [])
        form = b.choice(forms)
        shapes = {
            "scalar": (),
            "last": x.shape[-1:],
            "full": x.shape,
            "channel": (*x.shape[1:2], 1, 1),
        }  # channel: rank-4 tensors only
        shape = shapes[form]
        if op == "Mul":
            value = b.rng.uniform(0.5, 1.5, size=shape) * b.rng.choice([-1.0, 1.0], size=shape)
        else:
            value = b.rng.standard_normal(shape) * 0.5
        b.node(op, [x.name, b.const(f"{op.lower()}_c", value.astype(np.float32))], [y])
        b.ops.append(f"{op}(act,{form})")
    b.add(y, x.shape)
    return True


def op_concat(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    axis = b.draw(st.integers(0, x.rank - 1))
    mates = [
        t
        for t in b.pool
        if t.rank == x.rank
        and all(
            d1 == d2 for i, (d1, d2) in enumerate(zip(t.shape, x.shape, strict=True)) if i != axis
        )
    ]
    parts = [x, *b.draw(st.lists(st.sampled_from(mates), min_size=1, max_size=2))]
    shape = list(x.shape)
    shape[axis] = sum(t.shape[axis] for t in parts)
    y = b.fresh("concat")
    b.node(
        "Concat",
        [t.name for t in parts],
        [y],
        axis=axis - x.rank if b.draw(st.booleans()) else axis,
    )
    b.add(y, shape)
    b.ops.append(f"Concat{len(parts)}@{axis}")
    return True


def op_relu(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    y = b.fresh("relu")
    b.node("Relu", [x.name], [y])
    b.add(y, x.shape)
    b.ops.append("Relu")
    return True


def op_clip(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    lo = b.choice([None, 0.0, -1.0, -6.0])
    hi = b.choice([None, 1.0, 6.0])
    inputs = [x.name, "" if lo is None else b.const("clip_min", np.float32(lo))]
    if hi is not None:
        inputs.append(b.const("clip_max", np.float32(hi)))
    y = b.fresh("clip")
    b.node("Clip", inputs, [y])
    b.add(y, x.shape)
    b.ops.append(f"Clip({lo},{hi})")
    return True


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def op_reshape(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    total = math.prod(x.shape)
    forms = ["flatten", "to4d"]
    if x.rank >= 3:
        forms.append("merge_last")
    form = b.choice(forms)
    if form == "flatten":
        target = (x.shape[0], total // x.shape[0])
        spec = [x.shape[0], -1] if b.draw(st.booleans()) else [0, -1]
    elif form == "merge_last":
        target = (*x.shape[:-2], x.shape[-2] * x.shape[-1])
        spec = [0] * (x.rank - 2) + [-1]
    else:  # [1, C, H, W] with C * H * W = total (so later ops can convolve)
        c = b.choice(_divisors(total))
        h = b.choice(_divisors(total // c))
        target = (1, c, h, total // (c * h))
        spec = list(target)
        spec[b.draw(st.integers(1, 3))] = -1
    y = b.fresh("reshape")
    b.node("Reshape", [x.name, b.ints("shape", spec)], [y])
    b.add(y, target)
    b.ops.append(f"Reshape{list(target)}")
    return True


def op_transpose(b: Builder) -> bool:
    x = b.pick(_rank_at_least(2))
    if x is None:
        return False
    perm = b.draw(st.permutations(list(range(x.rank))))
    y = b.fresh("transpose")
    b.node("Transpose", [x.name], [y], perm=list(perm))
    b.add(y, tuple(x.shape[p] for p in perm))
    b.ops.append(f"Transpose{list(perm)}")
    return True


def op_pool(b: Builder) -> bool:
    x = b.pick(_rank(4))
    if x is None:
        return False
    op = b.choice(["MaxPool", "AveragePool"])
    batch, c, h, w = x.shape
    k = b.choice([1, 2, 3])
    stride = b.choice([1, 2])
    pad = b.choice([0, k // 2])
    if h + 2 * pad < k or w + 2 * pad < k:
        return False
    attrs: dict = {"kernel_shape": [k, k], "strides": [stride] * 2, "pads": [pad] * 4}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(b.draw(st.booleans()))
    y = b.fresh(op.lower())
    b.node(op, [x.name], [y], **attrs)
    b.add(y, (batch, c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1))
    b.ops.append(f"{op}{k}/{stride}")
    return True


def op_resize(b: Builder) -> bool:
    x = b.pick(_rank(4))
    if x is None:
        return False
    batch, c, h, w = x.shape
    mode = b.choice(["nearest", "linear"])
    sh, sw = b.choice([1, 2]), b.choice([1, 2])
    y = b.fresh("resize")
    if b.draw(st.booleans()):
        scales = b.const("scales", np.asarray([1, 1, sh, sw], np.float32))
        b.node("Resize", [x.name, "", scales], [y], mode=mode)
    else:
        sizes = b.ints("sizes", [batch, c, h * sh, w * sw])
        b.node("Resize", [x.name, "", "", sizes], [y], mode=mode)
    b.add(y, (batch, c, h * sh, w * sw))
    b.ops.append(f"Resize-{mode}x{sh}x{sw}")
    return True


def op_slice(b: Builder) -> bool:
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    axis = b.choice([i for i, d in enumerate(x.shape) if d >= 2])
    d = x.shape[axis]
    start = b.draw(st.integers(0, d - 1))
    end = b.draw(st.integers(start + 1, d))
    step = b.choice([1, 2])
    inputs = [
        x.name,
        b.ints("starts", [start - d if b.draw(st.booleans()) else start]),
        b.ints("ends", [end]),
        b.ints("axes", [axis]),
    ]
    if step != 1 or b.draw(st.booleans()):
        inputs.append(b.ints("steps", [step]))
    shape = list(x.shape)
    shape[axis] = len(range(start, end, step))
    y = b.fresh("slice")
    b.node("Slice", inputs, [y])
    b.add(y, shape)
    b.ops.append(f"Slice@{axis}[{start}:{end}:{step}]")
    return True


def op_split(b: Builder) -> bool:
    x = b.pick(lambda t: max(t.shape) >= 2)
    if x is None:
        return False
    axis = b.choice([i for i, d in enumerate(x.shape) if d >= 2])
    d = x.shape[axis]
    outs = [b.fresh("split"), b.fresh("split")]
    if d % 2 == 0 and b.draw(st.booleans()):
        sizes = [d // 2, d // 2]
        b.node("Split", [x.name], outs, axis=axis)
    else:
        first = b.draw(st.integers(1, d - 1))
        sizes = [first, d - first]
        b.node("Split", [x.name, b.ints("split", sizes)], outs, axis=axis)
    for name, size in zip(outs, sizes, strict=True):
        shape = list(x.shape)
        shape[axis] = size
        b.add(name, shape)
    b.ops.append(f"Split@{axis}{sizes}")
    return True


def op_softmax(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    axis = b.choice(sorted({-1, x.rank - 1, *([1] if x.rank > 1 else [])}))
    y = b.fresh("softmax")
    b.node("Softmax", [x.name], [y], axis=axis)
    b.add(y, x.shape)
    b.ops.append(f"Softmax@{axis}")
    return True


def op_layernorm(b: Builder) -> bool:
    x = b.pick(lambda t: t.shape[-1] >= 8)
    if x is None:
        return False
    d = x.shape[-1]
    scale = b.const("ln_scale", b.rng.uniform(0.5, 1.5, d).astype(np.float32))
    inputs = [x.name, scale]
    if b.draw(st.booleans()):
        inputs.append(b.const("ln_bias", (b.rng.standard_normal(d) * 0.1).astype(np.float32)))
    y = b.fresh("layernorm")
    b.node("LayerNormalization", inputs, [y], axis=-1, epsilon=1e-5)
    b.add(y, x.shape)
    b.ops.append(f"LayerNorm[{d}]")
    return True


def op_where(b: Builder) -> bool:
    x = b.pick()
    assert x is not None
    cond, neg = b.fresh("positive"), b.fresh("leak")
    b.node("Greater", [x.name, b.const("zero", np.float32(0.0))], [cond])
    alpha = b.choice([0.0, 0.1, 0.3])
    b.node("Mul", [x.name, b.const("alpha", np.float32(alpha))], [neg])
    y = b.fresh("where")
    b.node("Where", [cond, x.name, neg], [y])
    b.add(y, x.shape)
    b.ops.append(f"Where(x>0,x,{alpha}x)")
    return True


def op_shape_reshape(b: Builder) -> bool:
    x = b.pick(_rank_at_least(2))
    if x is None:
        return False
    keep = b.draw(st.integers(1, x.rank - 1))  # leading dims kept from Shape(x)
    shape, kept = b.fresh("shape"), b.fresh("kept")
    b.node("Shape", [x.name], [shape])
    b.node("Gather", [shape, b.ints("idx", list(range(keep)))], [kept], axis=0)
    target = b.fresh("target")
    b.node("Concat", [kept, b.ints("minus_one", [-1])], [target], axis=0)
    y = b.fresh("dynreshape")
    b.node("Reshape", [x.name, target], [y])
    b.add(y, (*x.shape[:keep], math.prod(x.shape[keep:])))
    b.ops.append(f"Shape-Gather-Concat-Reshape(keep {keep})")
    return True


OPS: dict[str, Op] = {
    "Conv": op_conv,
    "Gemm": op_gemm,
    "MatMul": op_matmul,
    "Binary": op_binary,
    "Concat": op_concat,
    "Relu": op_relu,
    "Clip": op_clip,
    "Reshape": op_reshape,
    "Transpose": op_transpose,
    "Pool": op_pool,
    "Resize": op_resize,
    "Slice": op_slice,
    "Split": op_split,
    "Softmax": op_softmax,
    "LayerNormalization": op_layernorm,
    "Where": op_where,
    "ShapeReshape": op_shape_reshape,
    "If": op_if,
    "Loop": op_loop,
    "Scan": op_scan,
}
# Conv/Gemm/MatMul are what onnxq quantizes: draw them more often
WEIGHTED_OPS = ["Conv", "Conv", "Conv", "Gemm", "Gemm", "MatMul", "MatMul", *OPS]


# ------------------------------------------------------------------------------- strategy
def _input_shape(draw) -> tuple[int, ...]:
    rank = draw(st.sampled_from([4, 4, 4, 3, 2]))
    if rank == 4:
        return (
            1,
            draw(st.sampled_from([1, 3, 8, 16, 16, 32, 32])),
            draw(st.integers(1, 10)),
            draw(st.integers(1, 10)),
        )
    if rank == 3:
        return (1, draw(st.integers(1, 8)), draw(st.sampled_from([1, 4, 16, 32, 32])))
    return (1, draw(st.sampled_from([1, 3, 16, 32, 64, 64])))


@st.composite
def fuzz_cases(draw, max_ops: int = 8) -> FuzzCase:
    """A valid random model (see the module docstring) and a batch seed."""
    seed = draw(st.integers(0, 2**31 - 1))
    b = Builder(draw, np.random.default_rng(seed))
    first = _input_shape(draw)
    b.inputs.append(b.add("input", first))
    if draw(st.integers(0, 3)) == 0:  # a second input: same shape (to meet the first) or its own
        b.inputs.append(b.add("input2", first if draw(st.booleans()) else _input_shape(draw)))
    n_ops = draw(st.integers(1, max_ops))
    applied = 0
    for _ in range(n_ops * 3):
        if applied == n_ops:
            break
        if OPS[draw(st.sampled_from(WEIGHTED_OPS))](b):
            applied += 1
    assume(applied > 0)
    model = _assemble(b)
    _validate(model)
    return FuzzCase(model, seed, b.ops)


def _assemble(b: Builder) -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    inputs = [vi(t.name, FLOAT, list(t.shape)) for t in b.inputs if t.name in b.consumed]
    input_names = {t.name for t in b.inputs}
    leaves = [t for t in b.pool if t.name not in b.consumed and t.name not in input_names]
    outputs = [vi(t.name, FLOAT, list(t.shape)) for t in leaves] + b.extra_outputs
    graph = helper.make_graph(b.nodes, "fuzz", inputs, outputs, b.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxq-fuzzgraphs"
    )
    model.ir_version = IR_VERSION
    return model


def _reject(why: str) -> None:
    if STRICT:
        raise AssertionError(why)
    assume(False)


def _validate(model: onnx.ModelProto) -> None:
    """onnx.checker (full: strict shape inference must agree) and one onnxruntime run."""
    import onnxruntime as ort

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        _reject(f"checker: {exc}")
    inputs = random_batches(model, 1, 0)[0]
    runs = []
    for level in (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    ):
        try:
            opts = ort.SessionOptions()
            opts.log_severity_level = 4
            opts.graph_optimization_level = level
            session = ort.InferenceSession(
                model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
            )
            runs.append(session.run(None, inputs))
        except Exception as exc:
            _reject(f"onnxruntime: {exc}")
            return
    by_name = {o.name: o for o in model.graph.output}
    for meta, value, optimized in zip(session.get_outputs(), runs[0], runs[1], strict=True):
        expected = _dims(by_name[meta.name])
        if list(value.shape) != expected:
            _reject(f"{meta.name}: onnxruntime shape {list(value.shape)} != tracked {expected}")
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            _reject(f"{meta.name}: non-finite output")
        # onnxruntime's graph optimizer must not change the float model's results (it does on
        # some graphs, e.g. Transpose -> MatMul with a 1-D right-hand side in 1.31: an
        # onnxruntime bug that would otherwise be blamed on onnxq)
        if value.dtype.kind == "f" and not np.allclose(value, optimized, rtol=1e-4, atol=1e-5):
            assume(False)
