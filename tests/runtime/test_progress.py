"""The shared progress bar: items pass through unchanged, with or without a bar."""

from __future__ import annotations

from onnxq.runtime.progress import bar, counted


def test_counted_passes_every_item_through_with_and_without_a_bar(capsys):
    assert list(counted(range(5), "work", enabled=False)) == [0, 1, 2, 3, 4]
    assert list(counted(iter("abc"), "work", enabled=True, total=3, unit="layer")) == list("abc")
    assert capsys.readouterr().err == ""  # stderr is no terminal here: no bar drawn


def test_bar_is_off_when_stderr_is_no_terminal(capsys):
    with bar("calibrating", total=4) as counter:
        counter.update(3)
        assert counter.disable  # tqdm's disable=None: off for a pipe or a log file
    assert capsys.readouterr().err == ""
