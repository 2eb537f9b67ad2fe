"""tools/bench_prefill.py's --processes aggregate (the GPU part of the tool runs on the H200
only): each row the median over the processes, every process's value kept, the rates rescaled
to the median, and the table's spread column."""

import json

import pytest
from tool_module import tool_module


@pytest.fixture(scope="module")
def bench():
    return tool_module("bench_prefill")


def _report(ms_by_tokens: dict[int, float], fmt: str = "nvfp4") -> dict:
    rows = [{"format": fmt, "path": "graph", "row_moe_max": "16", "chunk": 32768, "tokens": n,
             "ms": ms, "tokens_per_s": n / ms * 1e3, "tflops": n / ms, "mfu": n / ms / 1e3}
            for n, ms in ms_by_tokens.items()]
    return {"preset": "full", "matmul_peak_flops": 7.64e14, "chunk": 32768, "gpu": "H200",
            "rows": rows, "breakdown": {"k": "table"}}


def test_rows_take_the_median_over_processes_and_keep_each(bench, tmp_path, capsys):
    # 2026-12-05: NVFP4 8K read 137.9, 168.7, 156.2 and 124.6 ms in four processes
    reps = [_report({25: 10.0, 8192: ms}) for ms in (137.9, 168.7, 156.2, 124.6)]
    del reps[2]["rows"][0]  # a process that did not time a row: the others count
    res = bench.aggregate(reps)
    assert res["processes"] == 4
    short, long = res["rows"]
    assert short["ms"] == 10.0 and short["ms_processes"] == [10.0] * 3
    assert long["ms"] == pytest.approx((137.9 + 156.2) / 2)
    assert long["ms_processes"] == [137.9, 168.7, 156.2, 124.6]
    assert long["tokens_per_s"] == pytest.approx(8192 / long["ms"] * 1e3)
    assert long["tflops"] == pytest.approx(8192 / long["ms"])
    bench.write_report(res, tmp_path, 8192)
    md = (tmp_path / "prefill.md").read_text()
    assert "| ms per process | spread |" in md
    assert "| 137.9, 168.7, 156.2, 124.6 | 30% |" in md
    assert json.loads((tmp_path / "prefill.json").read_text())["rows"][1]["ms"] == long["ms"]


def test_one_process_keeps_the_plain_table(bench, tmp_path, capsys):
    bench.write_report(_report({512: 16.9}), tmp_path, 0)
    md = (tmp_path / "prefill.md").read_text()
    assert "spread" not in md and "| 512 | 16.9 |" in md
