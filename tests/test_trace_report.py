"""perf/trace_report.py on hand-made traces: totals by kind and layer, the gap as the step time
no kernel covers (kernels overlap under PDL), the Chrome-trace / Perfetto file, comparing two
traces, the terminal tables and the HTML plot. CPU only, no torch."""

from __future__ import annotations

import io
import json
import re

import pytest
from report_console import in_terminal, piped, table_rows
from rich.console import Console

from flint_graph.errors import InvalidRequestError
from flint_graph.perf import trace_report as tr
from flint_graph.perf.cli import TOP_KERNELS, report_console

H200 = {"device": "cuda", "gpu": "NVIDIA H200", "driver": "580.1", "torch": "2.11.0",
        "cuda": "13.0", "cuda_bindings": "13.0.1", "cutlass_dsl": "4.8.1", "python": "3.12.3",
        "cpu": "x86_64 (16 threads)"}


def _k(index, name, layer, kind, start_us, us, nbytes) -> dict:
    return {"index": index, "name": name, "layer": layer, "kind": kind, "start_us": start_us,
            "us": us, "bytes": nbytes, "grid": None}


def _trace(step_us: float, kernels: list[dict], **kw) -> dict:
    return {"schema": "flint-graph-trace", "version": 1, "created": "2026-11-30T21:00:00Z",
            "command": "flint-graph trace --batch 1 --context 1024", "machine": dict(H200),
            "git_rev": "22dcfba",
            "model": {"source": "preset tiny (synthetic, in memory)",
                      "config_hash": "3f2a9c1b0d4e", "layers": 2, "hidden": 64},
            "engine": "graph", "format": "nvfp4", "B": 1, "context": 1024, "steps": 5,
            "source": "CUPTI kernel records (torch.profiler) of CUDA-graph replays",
            "copy_bw": 1e12, "graph_nodes": {"kernel": len(kernels), "memcpy": 1},
            "kernels_per_step": len(kernels), "step_us": step_us, "kernels": kernels, **kw}


def gap_trace() -> dict:
    """Kernels one after another with 4 uncovered stretches (10-15, 45-50, 70-75, 95-100 µs);
    copy BW 1 TB/s, so 1e6 bytes take 1 µs at copy speed."""
    return _trace(100.0, [_k(0, "embedding", None, "embedding", 0.0, 10.0, 1e6),
                          _k(1, "qkv_gemv", 0, "gemv", 15.0, 30.0, 1.5e7),
                          _k(2, "attn_decode", 0, "attention", 50.0, 20.0, 4e6),
                          _k(3, "lm_head", None, "lm_head", 75.0, 20.0, 1e7)])


def pdl_trace() -> dict:
    """Overlapping kernels (PDL): durations add up to 55 µs in a 50 µs step, yet 5 µs (40-45)
    is covered by no kernel. residual_add runs twice in layer 1; one kernel's bytes unknown."""
    return _trace(50.0, [_k(0, "qkv_gemv", 0, "gemv", 0.0, 20.0, 1e7),
                         _k(1, "attn_decode", 0, "attention", 15.0, 20.0, None),
                         _k(2, "o_gemv", 0, "gemv", 30.0, 10.0, 2e6),
                         _k(3, "residual_add", 1, "other", 45.0, 3.0, 1e5),
                         _k(4, "residual_add", 1, "other", 48.0, 2.0, 1e5)])


def _by_kind(trace: dict) -> dict:
    return {r["kind"]: r for r in tr.kind_totals(trace)}


def test_kernel_rows_frac_bw_and_share():
    rows = tr.kernel_rows(gap_trace())
    assert [r["name"] for r in rows] == ["embedding", "qkv_gemv", "attn_decode", "lm_head"]
    # 1.5e7 bytes in 30 µs = 0.5 TB/s = half the copy BW
    assert rows[1]["frac_bw"] == pytest.approx(0.5) and rows[1]["share"] == pytest.approx(0.3)
    assert rows[2]["frac_bw"] == pytest.approx(0.2)
    odd = tr.kernel_rows(_trace(10.0, [_k(0, "a", None, "other", 0.0, 0.0, 100.0),
                                       _k(1, "b", None, "other", 0.0, 5.0, None)]))
    assert odd[0]["frac_bw"] is None and odd[0]["share"] == 0.0  # no duration
    assert odd[1]["frac_bw"] is None and odd[1]["share"] == 0.5  # bytes unknown


def test_kind_totals_with_gaps():
    rows = tr.kind_totals(gap_trace())
    assert [r["kind"] for r in rows] == ["embedding", "attention", "gemv", "lm_head", "gap",
                                         "total"]
    k = {r["kind"]: r for r in rows}
    assert (k["gap"]["us"], k["gap"]["count"]) == (pytest.approx(20.0), 4)
    # without overlap, the kinds and the gap add up to the step
    assert sum(r["share"] for r in rows if r["kind"] != "total") == pytest.approx(1.0)
    assert k["gemv"] == {"kind": "gemv", "count": 1, "us": 30.0, "bytes": 1.5e7,
                         "share": pytest.approx(0.3), "frac_bw": pytest.approx(0.5),
                         "floor_us": pytest.approx(15.0)}
    assert k["total"]["us"] == 100.0 and k["total"]["bytes"] == pytest.approx(3e7)
    assert k["total"]["floor_us"] == pytest.approx(30.0)
    assert k["total"]["frac_bw"] == pytest.approx(0.3) and k["total"]["count"] == 4


def test_gap_boundaries_charge_each_hole_to_the_kernels_around_it():
    """Each stretch between kernels goes to (the kernel that ended last → the next one); under
    PDL overlap the one ending last is the one before the hole; the stretch after the last
    kernel has no boundary (it is in the kinds' gap row only)."""
    rows = tr.gap_boundaries(gap_trace())
    assert {(r["before"], r["after"]): (r["count"], r["us"]) for r in rows} == {
        ("embedding", "qkv_gemv"): (1, 5.0), ("qkv_gemv", "attn_decode"): (1, 5.0),
        ("attn_decode", "lm_head"): (1, 5.0)}
    assert all(r["share"] == pytest.approx(0.05) for r in rows)
    assert {(r["before"], r["largest_us"], r["at_us"]) for r in rows} == {
        ("embedding", 5.0, 10.0), ("qkv_gemv", 5.0, 45.0), ("attn_decode", 5.0, 70.0)}
    assert [(r["before"], r["after"], r["count"], r["us"]) for r in
            tr.gap_boundaries(pdl_trace())] == [("o_gemv", "residual_add", 1, 5.0)]
    assert tr.gap_boundaries(_trace(10.0, [])) == []


def test_kernel_families_group_by_what_launched_them():
    assert tr.family("kernel_cutlass_grouped_w4a16_kernel_tensorptrbf16gmemalign16o2048") == \
        "grouped_w4a16"
    assert tr.family("kernel_cutlass_rmsnorm_kernel_tensorptr") == "rmsnorm"
    assert tr.family("nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT") == "cuBLAS"
    assert tr.family("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor"
                     "_add<c10::BFloat16>>(int, float)") == "torch vectorized_elementwise_kernel"
    assert tr.family("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10"
                     "::BFloat16, float>(int, float)") == "torch vectorized_layer_norm_kernel"
    assert tr.family("moe_router") == "moe_router" and tr.family(None) == "?"


def test_kind_totals_overlap_uses_the_union():
    k = _by_kind(pdl_trace())
    # union [0, 40] + [45, 50] = 45 µs: gap 5 µs, not 50 − 55 (the summed durations)
    assert k["gap"]["us"] == pytest.approx(5.0) and k["gap"]["count"] == 1
    assert (k["gemv"]["count"], k["gemv"]["us"]) == (2, 30.0)
    assert k["gemv"]["floor_us"] == pytest.approx(12.0)
    assert k["attention"]["bytes"] is None and k["attention"]["floor_us"] is None
    assert k["total"]["bytes"] == pytest.approx(1.22e7)  # the known bytes only
    assert sum(r["share"] for r in k.values() if r["kind"] != "total") > 1.0  # overlap
    # kernels covering more than the (median) step time: the gap clamps at 0
    tight = pdl_trace() | {"step_us": 30.0}
    assert _by_kind(tight)["gap"]["us"] == 0.0
    # a kind outside the vocabulary counts as "other"
    odd = gap_trace()
    odd["kernels"][3]["kind"] = "mystery"
    assert _by_kind(odd)["other"]["us"] == 20.0 and "lm_head" not in _by_kind(odd)


def test_time_by_kind_splits_overlaps_evenly():
    parts = tr._time_by_kind(pdl_trace()["kernels"])
    # 15-20: gemv + attention, 30-35: attention + gemv: each half of the overlap
    assert parts["gemv"] == pytest.approx(15 + 2.5 + 2.5 + 5)
    assert parts["attention"] == pytest.approx(2.5 + 10 + 2.5)
    assert sum(parts.values()) == pytest.approx(45.0)  # the covered time


def test_layer_totals():
    rows = tr.layer_totals(pdl_trace())
    assert [r["layer"] for r in rows] == [0, 1]
    assert rows[0]["us"] == 50.0 and rows[0]["bytes"] is None  # attention's bytes unknown
    assert rows[1] | {"share": None} == {"layer": 1, "count": 2, "us": 5.0, "bytes": 2e5,
                                         "share": None, "frac_bw": pytest.approx(0.04),
                                         "floor_us": pytest.approx(0.2)}
    step = tr.layer_totals(gap_trace())[-1]
    assert (step["layer"], step["count"], step["us"]) == ("step", 2, 30.0)


def test_chrome_trace_structure():
    trace = pdl_trace()
    ct = tr.chrome_trace(trace)
    assert json.loads(json.dumps(ct)) == ct and ct["displayTimeUnit"] == "ns"
    ev = ct["traceEvents"]
    kernels = [e for e in ev if e["ph"] == "X" and e["cat"] != "step"]
    assert [(e["name"], e["ts"], e["dur"]) for e in kernels] == \
           [(k["name"], k["start_us"], k["us"]) for k in trace["kernels"]]
    assert kernels[1]["tid"] == tr.KINDS.index("attention")
    assert kernels[0]["args"] == {"layer": 0, "kind": "gemv", "bytes": 1e7,
                                  "frac_bw": pytest.approx(0.5), "index": 0}
    names = {e["tid"]: e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {e["tid"] for e in ev if e["ph"] == "X"} == set(names)  # every track named
    assert names[tr.KINDS.index("other")] == "other"
    step = next(e for e in ev if e["ph"] == "X" and e["cat"] == "step")
    assert (step["ts"], step["dur"], names[step["tid"]]) == (0.0, 50.0, "step")
    proc = next(e for e in ev if e["name"] == "process_name")
    assert proc["args"]["name"] == "flint-graph decode step (graph, nvfp4, B=1, ctx=1024)"


def test_file_json_round_trip_and_load_errors(tmp_path):
    trace = gap_trace()
    body = tr.to_file_json(trace)
    assert {"traceEvents", "displayTimeUnit", "schema", "kernels", "step_us"} <= set(body)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(body))
    assert tr.load(path) == trace
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"schema": "flint-graph-bench", "version": 1}))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    for p, why in ((bench, "this file is from flint-graph bench --json"), (bad, "not valid JSON"),
                   (tmp_path / "none.json", "no such file")):
        with pytest.raises(InvalidRequestError) as e:
            tr.load(p)
        assert str(p) in str(e.value) and why in str(e.value)
        assert "flint-graph-trace" in str(e.value)


def test_compare_matches_by_layer_name_and_occurrence():
    a, b = pdl_trace(), pdl_trace()
    b["kernels"][4]["us"] = 1.0  # the second residual_add of layer 1: −1 µs
    b["kernels"][0]["us"] = 26.0  # qkv_gemv: +6 µs
    b["kernels"][2]["us"] = 8.0  # o_gemv: −2 µs
    b["kernels"].append(_k(5, "sample_tokens", None, "sampling", 50.0, 4.0, 1e3))
    b["step_us"] = 55.0
    c = tr.compare(a, b)
    assert c["step"] == {"a_us": 50.0, "b_us": 55.0, "change": pytest.approx(0.1)}
    ks = c["kernels"]
    assert [(k["name"], k["layer"], k["delta_us"]) for k in ks[:3]] == \
           [("qkv_gemv", 0, pytest.approx(6.0)), ("o_gemv", 0, pytest.approx(-2.0)),
            ("residual_add", 1, pytest.approx(-1.0))]
    assert ks[2]["a_us"] == 2.0  # matched with the second occurrence, not the first
    assert ks[-1] == {"name": "sample_tokens", "layer": None, "kind": "sampling",
                      "a_us": None, "b_us": 4.0, "delta_us": None}
    kinds = {r["kind"]: r for r in c["kinds"]}
    assert list(kinds) == ["attention", "gemv", "sampling", "other", "gap"]
    assert kinds["gemv"]["change"] == pytest.approx(34 / 30 - 1)
    assert kinds["sampling"]["a_us"] is None and kinds["sampling"]["change"] is None


def test_print_compare_warns_and_colours():
    a, b = pdl_trace(), pdl_trace()
    b["kernels"][0]["us"] = 26.0
    b["kernels"][2]["us"] = 8.0
    b["context"] = 8192
    b["machine"] = H200 | {"gpu": "NVIDIA B200"}
    b["kernels"].append(_k(5, "sample_tokens", None, "sampling", 50.0, 4.0, 1e3))
    console = Console(record=True, width=160)
    tr.print_compare(a, b, console)
    text = console.export_text()
    assert "unmatched: 0 kernels only in A, 1 only in B" in text
    assert "warning: different GPU: A NVIDIA H200, B NVIDIA B200" in text
    assert "warning: different context: A 1024, B 8192: compared anyway" in text
    assert "step: A 50.0 µs → B 50.0 µs" in text
    slower, faster = text.index("got slower"), text.index("got faster")
    assert slower < text.index("+6.00") < faster < text.index("-2.00")


def test_print_trace_numbers():
    trace = gap_trace()
    trace["kernels"][2]["name"] = "attn[bold]x"  # printed as is, not as rich markup
    console = Console(record=True, width=160)
    tr.print_trace(trace, console, top=2)
    text = console.export_text()
    for want in ("graph engine, nvfp4, B=1, context 1024 tokens; the median-length step of 5",
                 "graph nodes: kernel 4, memcpy 1; kernels per step: 4; copy BW 1.00 TB/s",
                 "step 100.0 µs; floor 30.0 µs (bytes / copy BW) = 30.0% of the step",
                 "the 2 slowest kernels", "attn[bold]x", "all 4 kernels are in the trace JSON"):
        assert want in text, want
    gap = next(line for line in text.splitlines() if line.startswith("│ gap"))
    assert [c.strip() for c in gap.strip("│").split("│")][:4] == ["gap", "4", "20.0", "20.0"]
    table = text.split("slowest kernels")[1].split("start µs: from")[0]
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert [r.split("│")[2].strip() for r in rows] == ["qkv_gemv", "attn[bold]x"]
    assert "where the gap is: the largest boundaries" in text
    assert any("qkv_gemv" in line and "attn[bold]x" in line and "5.0" in line
               for line in text.split("where the gap is")[1].splitlines()), text


def test_terminal_and_html_list_the_same_slowest_kernels():
    # The terminal listed the 20 slowest and the HTML page 15 of the same step.
    many = _trace(500.0, [_k(i, f"k{i}", 0, "gemv", 20.0 * i, 1.0 + i, 1e6) for i in range(25)])
    console = Console(record=True, width=160)
    tr.print_trace(many, console)
    page = tr.html_plot(many)
    want = f"the {TOP_KERNELS} slowest kernels"
    assert want in console.export_text() and f"<h4>{want}</h4>" in page
    console = Console(record=True, width=160)
    tr.print_trace(many, console, top=3)
    assert "the 3 slowest kernels" in console.export_text()
    assert "<h4>the 3 slowest kernels</h4>" in tr.html_plot(many, top=3)


def test_piped_trace_tables_break_no_word(monkeypatch, capsys):
    piped(monkeypatch)
    trace = gap_trace()
    trace["kernels"][2]["name"] = "attn_decode_sm90_pdl_b1"
    tr.print_trace(trace, report_console())
    out = capsys.readouterr().out
    rows = table_rows(out)
    # one line per kind, per gap boundary and per kernel: nothing folded onto a second
    assert len(rows) == 6 + 3 + 4
    assert ["2", "attn_decode_sm90_pdl_b1", "0", "attention"] == rows[10][:4]
    assert all(r[0] for r in rows)


def test_trace_in_a_terminal_keeps_its_width(monkeypatch):
    in_terminal(monkeypatch, 80)
    assert report_console().width == 80


def test_html_plot_is_self_contained_and_escaped():
    trace = pdl_trace()
    trace["kernels"][0]["name"] = "<script>alert(1)</script>"
    trace["git_rev"] = "a&b"
    page = tr.html_plot(trace)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "a&amp;b" in page and "git a&b" not in page
    assert page.count("<svg") == 2 and "<table>" in page
    assert "http" not in page and "src=" not in page and "<link" not in page
    assert "graph engine, nvfp4, B=1, context 1024 tokens" in page and "NVIDIA H200" in page
    assert tr.COLOURS["gemv"] in page and tr.COLOURS["gap"] in page
    assert "floor: 12.2 µs" in page  # 1.22e7 known bytes at 1 TB/s


def test_an_empty_trace_does_not_crash():
    empty = _trace(0.0, [], graph_nodes=None, kernels_per_step=None)
    assert [r["kind"] for r in tr.kind_totals(empty)] == ["gap", "total"]
    assert "<svg" in tr.html_plot(empty)
    assert len(tr.chrome_trace(empty)["traceEvents"]) == 4  # process, step track, step event
    console = Console(record=True, width=160)
    tr.print_trace(empty, console)
    assert "graph nodes: -; kernels per step: -" in console.export_text()


def test_compare_cells_stay_short_for_huge_values():
    """A compared file's 1e308 µs printed a 309-digit Δ µs cell (the A and B columns were
    already short) and would have printed a 309-digit change: every difference goes through
    `num`'s powers of ten (a bad-input trial)."""
    from flint_graph.perf.bench_report import change_pct, signed

    a, b = pdl_trace(), pdl_trace()
    b["kernels"][0]["us"] = 1e308
    b["step_us"] = 1e308
    console = Console(file=io.StringIO(), width=300)
    tr.print_compare(a, b, console)
    out = console.file.getvalue()
    assert "1.000e+308" in out and not re.search(r"\d{20}", out), out
    assert signed(-1e308) == "-1.000e+308" and signed(2.5) == "+2.50"
    assert change_pct(0.029) == "+2.9%" and change_pct(-0.5) == "-50.0%"
    assert change_pct(5.8e300) == "+5.800e+302%"


def test_a_kernel_longer_than_its_step_is_refused(tmp_path):
    trace = pdl_trace()
    trace["kernels"][1]["us"] = trace["step_us"] * 10
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tr.to_file_json(trace)))
    with pytest.raises(InvalidRequestError, match=r"kernels\[1\]\.us is .*expected at most the step"):
        tr.load(path)
