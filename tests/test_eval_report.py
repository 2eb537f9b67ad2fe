"""`flint-graph eval`'s printed report (nano/eval_cli.py): the header names the checkpoint whole
on one line, for the user to copy (README), in any terminal width and piped. CPU only, no
model."""

from __future__ import annotations

import pytest
from report_console import piped, table_rows
from rich.console import Console

from flint_graph.nano.eval_cli import _print

# what `flint-graph eval` scores by default: 74 characters, a hash in the directory name
MODEL = "/home/newcomer/.cache/flint_graph/flint-nano-5943c144c50a/model-nvfp4.gguf"


def _report(model: str = MODEL) -> dict:
    return {"model": model, "format": "nvfp4", "engine": "reference", "plant": None,
            "seconds": 41.2,
            "groups": {"tools": {"n": 50, "valid": 0.98, "exact": 0.94},
                       "arith": {"n": 50, "correct": 0.96}},
            "targets": [{"group": "tools", "metric": "valid", "target": 0.95, "met": True},
                        {"group": "arith", "metric": "correct", "target": 0.9, "met": True}]}


@pytest.mark.parametrize("width", [80, 160])
def test_the_header_names_the_checkpoint_whole_on_one_line(width):
    # As the table's title it was folded to the table's width: ".../flint-nano-5943c14" and
    # "4c50a/model-nvfp4.gguf" on two lines even at 160 columns.
    console = Console(record=True, width=width)
    _print(_report(), console)
    lines = console.export_text().splitlines()
    assert lines[0] == f"eval: {MODEL} (nvfp4, reference engine), 41.2 s of decoding"
    assert [r[:3] for r in table_rows("\n".join(lines))] == [
        ["tools", "50", "valid"], ["tools", "50", "exact"], ["arith", "50", "correct"]]


def test_the_header_is_whole_when_piped(monkeypatch, capsys):
    piped(monkeypatch, 80)
    _print(_report("/tmp/[odd] dir/model-nvfp4.gguf"))  # a "[" is text, not rich markup
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "eval: /tmp/[odd] dir/model-nvfp4.gguf (nvfp4, reference engine), 41.2 s of decoding"


def test_a_full_share_target_reads_100_percent():
    """The phrasing suite's greeting and refusal targets showed as "≥100%" (a new user's
    trial); a share of 1 is exactly 100%."""
    from flint_graph.nano.eval_cli import _target

    assert [_target(x) for x in (1.0, 0.95, 0.9)] == ["100%", "≥95%", "≥90%"]
