"""The summary's shared lines (``onnxq.report.lines``): fidelity in full and in short, and the
float ops' reasons grouped."""

from __future__ import annotations

from onnxq.backends.validate import OutputFidelity
from onnxq.place.annotations import Decision
from onnxq.report.lines import NAME_LIMIT, brief_fidelity_lines, fidelity_lines, reason_lines

OUTPUTS = [
    OutputFidelity("logits", 0.9991234, 0.25, 12.0, top1_agreement=0.975),
    OutputFidelity("labels", 0.875, 1.0, 9.0, compared="agreement"),
    OutputFidelity("strings", 0.0, 0.0, 0.0, compared="not compared: a string output"),
]


def test_full_lines_say_the_mode_and_the_agreement_of_integer_outputs():
    assert fidelity_lines(OUTPUTS, "unfused") == [
        "fidelity logits (unfused): cosine 0.999123, max abs error 0.25 (float range 12), "
        "top-1 agreement 97.50%",
        "fidelity labels (unfused): equal to the float model's in 87.5% of its values on the "
        "held batches",
        "fidelity strings: not compared: a string output",
    ]


def test_short_lines_leave_out_the_mode():
    assert brief_fidelity_lines(OUTPUTS) == [
        "fidelity logits: cosine 0.999123, max abs error 0.25 (float range 12), top-1 "
        "agreement 97.50%",
        "fidelity labels: agreement",
        "fidelity strings: not compared: a string output",
    ]


def test_reasons_that_differ_only_in_names_share_a_line():
    long = "x" * (NAME_LIMIT + 10)
    ops = [
        Decision("a", "Add", False, "", "input 'p' is not quantized"),
        Decision("b", "Add", False, "", "input 'q' is not quantized"),
        Decision("c", "Mul", False, "", f"input '{long}' is not quantized"),
    ]
    lines = reason_lines(ops)
    assert lines["Add: input 'p' is not quantized (and 1 more with other names)"] == 2
    (mul,) = [line for line in lines if line.startswith("Mul")]
    shown = mul.split("'")[1]  # the quoted name, by its start and its end
    assert len(shown) == NAME_LIMIT and shown.startswith("x" * 24) and "…" in shown
