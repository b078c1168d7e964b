"""Stage 8, report: what was quantized, what was not and why, as JSON, text and one web page."""
