"""The scripts behind the docs: the results page reads the figures it is given and invents
none, and the link checker finds broken links and anchors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


PEERS = """# Peers
Measured on a test machine.

## score_unfused: the graph's own arithmetic

| model | float | tool-a | tool-b |
|---|---|---|---|
| net | 0.900 | 0.850 | OOM |

## score: fused

| model | float | tool-a | tool-b |
|---|---|---|---|
| net | 0.900 | 0.800 | OOM |
"""


def test_results_page_reads_evals_and_peers_and_says_what_was_not_measured(tmp_path):
    page = load_script("results_page")
    trt = tmp_path / "eval_trt.json"
    trt.write_text(
        json.dumps(
            {
                "net": {"score": 0.89, "score_unfused": 0.875, "ref_score": 0.9},
                "lm": {"error": "missing: /somewhere/lm.onnx"},
            }
        )
    )
    peers = tmp_path / "PEERS.md"
    peers.write_text(PEERS)
    int4 = tmp_path / "eval_int4.json"
    fidelity = {"logits_cos": 0.99681, "logits_top1_agreement": 0.9464, "logits_max_abs_diff": 2.0}
    int4.write_text(
        json.dumps(
            {
                "lm": {"score": 0.5, "score_unfused": 0.5, "ref_score": 0.6},
                "cnn": {"score": 0.7, "score_unfused": 0.7, "fidelity_unfused": fidelity},
            }
        )
    )
    out = tmp_path / "results.md"
    argv = ["-o", str(out), "--no-example", "--zoo", f"tensorrt={trt}", "--peers", str(peers)]
    assert page.main([*argv, "--section", f"INT4 weight-only={int4}"]) == 0
    text = out.read_text()
    assert "- CPU: " in text and "onnxruntime " in text and "- date: " in text
    assert "| net | - | 0.890 | 0.875 |" in text  # no float eval given: '-'
    assert "| lm | - | not run | not run |" in text
    assert "> Measured on a test machine." in text
    assert "| net | 0.900 | 0.875 | 0.850 | OOM |" in text  # side by side, unfused
    assert "## INT4 weight-only\n\nRead from `eval_int4.json`." in text
    assert "| lm | 0.600 | 0.500 | 0.500 | - |" in text
    assert "| cnn | - | 0.700 | 0.700 | logits cos 0.9968, logits top-1 0.9464 |" in text
    assert "## Mixed precision\n\nNot measured in this run." in text
    assert "## The bundled example" not in text


def test_results_page_without_inputs_measures_nothing_it_was_not_given(tmp_path):
    out = tmp_path / "results.md"
    assert load_script("results_page").main(["-o", str(out), "--no-example"]) == 0
    text = out.read_text()
    assert text.count("Not measured in this run.") == 6  # zoo, peers and four sections
    assert "|" not in text  # no table, so no figure


def test_link_checker_finds_missing_files_and_anchors(tmp_path):
    links = load_script("check_links")
    (tmp_path / "b.md").write_text("# Title\n\n## Exit codes and `outputs`\n\n## A (`a_mode: x`)\n")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md#exit-codes-and-outputs) [web](https://example.org/x) [self](#top)\n"
        "[underscore kept, as mkdocs does](b.md#a-a_mode-x)\n"
        "[gone](c.md) [bad](b.md#nope)\n```\n[in code](d.md)\n```\n# Top\n"
    )
    links.ROOT = tmp_path
    assert links.broken_links(doc) == [
        "a.md: c.md: no such file",
        "a.md: b.md#nope: no heading #nope",
    ]
