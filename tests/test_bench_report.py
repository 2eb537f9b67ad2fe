"""perf/bench_report.py on hand-made results: the decode and summary tables' arithmetic (ratios,
tokens/s, % of floor), missing fields printed as "-", markdown, comparing two runs and its
warnings, and load()'s errors. CPU only, no torch."""

from __future__ import annotations

import copy
import io
import json
import re

import pytest
from report_console import piped, table_rows
from rich.console import Console

from flint_graph.errors import InvalidRequestError
from flint_graph.perf import bench_report as br
from flint_graph.perf.cli import report_console

H200 = {"device": "cuda", "gpu": "NVIDIA H200", "driver": "580.1", "torch": "2.11.0",
        "cuda": "13.0", "cuda_bindings": "13.0.1", "cutlass_dsl": "4.8.1", "python": "3.12.3",
        "cpu": "x86_64 (16 threads)"}
CPU = {"device": "cpu", "gpu": None, "driver": None, "torch": "2.11.0", "cuda": None,
       "cuda_bindings": None, "cutlass_dsl": None, "python": "3.12.3", "cpu": "x86_64 (8 threads)"}


def _decode(engine, fmt, b, ctx, median_ms, floor_ms=0.459, **kw) -> dict:
    """A decode record with tokens/s and fraction derived as perf/bench.py derives them."""
    return {"engine": engine, "format": fmt, "B": b, "context": ctx, "median_ms": median_ms,
            "p90_ms": median_ms + 0.05, "steps": 50, "tokens_per_s": b / median_ms * 1e3,
            "bytes": floor_ms * 4.28e9, "floor_ms": floor_ms, "fraction": floor_ms / median_ms,
            **kw}


def cuda_result() -> dict:
    """A full CUDA run: graph + reference + compiled, two formats, cold start, kernels."""
    return {
        "schema": "flint-graph-bench", "version": 1, "created": "2026-11-30T21:00:00Z",
        "command": "flint-graph bench --preset tiny --compiled", "machine": dict(H200),
        "git_rev": "22dcfba+dirty",
        "model": {"source": "preset tiny (synthetic, in memory)", "config_hash": "3f2a9c1b0d4e",
                  "layers": 49, "hidden": 2048},
        "copy_bw": 4.28e12, "kv_fill": "synthetic: random KV values, timing only",
        "cold_start": {"format": "nvfp4", "total_s": 12.1,
                       "phases": {"checkpoint_read_s": 6.0, "repack_s": 1.2, "kv_alloc_s": 0.1,
                                  "kernel_cache_s": 0.5, "capture_s": 1.1,
                                  "first_token_s": 3.2}, "note": "from the CLI's entry"},
        "kernels_per_step": {"nvfp4": {"1": 347, "2": 347}, "bf16": {"1": 340}},
        "decode": [_decode("graph", "nvfp4", 1, 1024, 1.75),
                   _decode("graph", "nvfp4", 2, 1024, 1.80, floor_ms=0.47),
                   _decode("graph", "bf16", 1, 1024, 3.0, floor_ms=1.2),
                   _decode("reference", "nvfp4", 1, 1024, 329.0),
                   _decode("reference", "nvfp4", 2, 1024, 340.0, floor_ms=0.47),
                   _decode("compiled", "nvfp4", 1, 1024, 10.5)],
        "e2e": [{"engine": "graph", "format": "nvfp4", "B": 1, "prompt_tokens": 30,
                 "tokens": 64, "ms_per_token": 1.81, "ttft_ms": 40.2},
                {"engine": "reference", "format": "nvfp4", "B": 1, "prompt_tokens": 30,
                 "tokens": 4, "ms_per_token": 330.0, "ttft_ms": 900.0}],
        "prefill": [{"engine": "graph", "format": "nvfp4", "tokens": 8192, "ms": 3900.0,
                     "tokens_per_s": 2100.5},
                    {"engine": "torch-ops", "format": "nvfp4", "tokens": 8192, "ms": 1099.7,
                     "tokens_per_s": 7449.3, "tflops": 40.7, "mfu": 0.0529}],
        "errors": ["compiled nvfp4 B=2 context 1024: [Errno 12] out of memory"],
    }


def cpu_result() -> dict:
    """A CPU run: reference records only, no cold start, optional fields missing or None."""
    return {
        "schema": "flint-graph-bench", "version": 1, "created": "2026-11-30T22:00:00Z",
        "command": "flint-graph bench --device cpu", "machine": dict(CPU), "git_rev": None,
        "model": {"source": "preset tiny (synthetic, in memory)", "config_hash": "3f2a9c1b0d4e",
                  "layers": 2, "hidden": 64},
        "copy_bw": 2.5e10, "kv_fill": "synthetic: random KV values, timing only",
        "cold_start": None, "kernels_per_step": {},
        # the second record lacks p90 / floor / tokens/s / fraction: derived or "-"
        "decode": [_decode("reference", "bf16", 1, 128, 20.0, floor_ms=0.5),
                   {"engine": "reference", "format": "bf16", "B": 4, "context": 128,
                    "median_ms": 25.0, "p90_ms": None, "steps": 3}],
        "e2e": [{"engine": "reference", "format": "bf16", "B": 1, "prompt_tokens": 30,
                 "tokens": 8, "ms_per_token": None, "ttft_ms": 55.0}],
        "prefill": [], "errors": [],
    }


def _text(*renderables) -> str:
    console = Console(record=True, width=160)
    for r in renderables:
        console.print(r)
    return console.export_text()


def _row(text: str, *starts: str) -> list[str]:
    """The cells of the first table row whose leading cells are `starts`."""
    for line in text.splitlines():
        cells = [c.strip() for c in re.split("[│┃]", line.strip("│┃ "))]
        if cells[:len(starts)] == list(starts):
            return cells
    raise AssertionError(f"no row starting {starts} in\n{text}")


def test_decode_table_ratios_and_floor():
    text = _text(br.decode_table(cuda_result()))
    head = _row(text, "format", "B", "context")
    row = dict(zip(head, _row(text, "nvfp4", "1", "1024")))
    assert row["engine"] == "graph"
    assert (row["median ms"], row["floor ms"]) == ("1.750", "0.459")
    assert row["% of floor"] == "26.2"  # 0.459 / 1.75
    assert row["tokens/s"] == "571.4"  # 1 / 1.75 ms
    assert row["reference ms"] == "329.000" and row["×ref"] == "188×"  # 329 / 1.75
    assert row["compiled ms"] == "10.500" and row["×comp"] == "6.00×"  # 10.5 / 1.75
    # no compiled record for B=2: "-", and the reference ratio 340 / 1.8
    row2 = dict(zip(head, _row(text, "nvfp4", "2", "1024")))
    assert (row2["×ref"], row2["compiled ms"], row2["×comp"]) == ("189×", "-", "-")
    # bf16 has the graph engine only: its baseline cells are "-"
    assert _row(text, "bf16", "1", "1024")[-4:] == ["-", "-", "-", "-"]
    assert "copy BW 4.28 TB/s" in text and "random KV values" in text
    assert "floor ms = bytes the step must move / copy BW" in " ".join(text.split())


def test_decode_table_cpu_run_shows_the_reference():
    text = _text(br.decode_table(cpu_result()))
    head = _row(text, "format", "B", "context")
    # the reference fills median … tokens/s: no columns of its own to repeat them
    assert head[-1] == "tokens/s" and "reference ms" not in head
    row = dict(zip(head, _row(text, "bf16", "1", "128")))
    assert (row["engine"], row["median ms"], row["% of floor"]) == ("reference", "20.000", "2.5")
    bare = dict(zip(head, _row(text, "bf16", "4", "128")))
    # tokens/s derived (4 / 25 ms); the missing p90 / floor / fraction print "-"
    assert bare["tokens/s"] == "160.0"
    assert (bare["p90 ms"], bare["floor ms"], bare["% of floor"]) == ("-", "-", "-")
    assert "copy BW 25.0 GB/s" in text
    # torch.compile on the CPU: its own columns, no ratio without the graph engine
    res = cpu_result()
    res["decode"].append(_decode("compiled", "bf16", 1, 128, 8.0))
    text = _text(br.decode_table(res))
    row = _row(text, "bf16", "1", "128")
    assert row[3] == "reference" and row[-2:] == ["8.000", "-"]
    assert _row(text, "bf16", "4", "128")[-2:] == ["-", "-"]


def test_summary_table():
    text = _text(br.summary_table(cuda_result()))
    assert "1.81 ms/token, TTFT 40.2 ms" in text
    assert "330.00 ms/token, TTFT 900.0 ms" in text
    assert "prefill 8192 tokens" in text and "3900.0 ms, 2100.5 tokens/s" in text
    assert "1099.7 ms, 7449.3 tokens/s, 41 TFLOP/s, MFU 5.3%" in text  # the baseline row
    assert _row(text, "cold start")[1:] == ["-", "nvfp4", "12.10 s"]
    assert _row(text, "checkpoint read")[-1] == "6.000 s"
    assert _row(text, "first token")[-1] == "3.200 s"
    assert "B=1: 347, B=2: 347" in text and "B=1: 340" in text
    cpu = _text(br.summary_table(cpu_result()))
    assert "-, TTFT 55.0 ms" in cpu and "│ cold start" not in cpu


def test_markdown_header_and_tables():
    md = br.markdown(cuda_result())
    first = md.splitlines()[0]
    for want in ("NVIDIA H200", "driver 580.1", "git 22dcfba+dirty", "config 3f2a9c1b0d4e",
                 "2026-11-30T21:00:00Z"):
        assert want in first
    assert "| nvfp4 | 1 | 1024 | graph | 1.750 | 1.800 | 0.459 | 26.2 | 571.4 | 329.000 | 188× " \
           "| 10.500 | 6.00× |" in md
    assert "| cold start | - | nvfp4 | 12.10 s |" in md
    assert md.rstrip().endswith("- compiled nvfp4 B=2 context 1024: [Errno 12] out of memory")
    cpu = br.markdown(cpu_result())
    assert "CPU x86_64 (8 threads)" in cpu.splitlines()[0] and "git -" in cpu.splitlines()[0]
    assert "Did not run" not in cpu


def test_print_report():
    console = Console(record=True, width=160)
    br.print_report(cuda_result(), console)
    text = console.export_text()
    assert text.startswith("NVIDIA H200 (driver 580.1, CUDA 13.0), torch 2.11.0")
    assert "188×" in text and "12.10 s" in text
    # an error's "[Errno 12]" is printed as text, not taken for rich markup
    assert "did not run: compiled nvfp4 B=2 context 1024: [Errno 12] out of memory" in text
    console = Console(record=True, width=160)
    br.print_report(cpu_result() | {"decode": [], "e2e": []}, console)
    assert "no decode figures" in console.export_text()


def test_piped_bench_tables_break_no_word(monkeypatch, capsys):
    # At 80 columns the decode table's 13 columns folded "tokens/s" and "reference ms" mid-word.
    piped(monkeypatch)
    br.print_report(cuda_result(), report_console())
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("┃ format"))
    assert [c.strip() for c in head.strip("┃").split("┃")] == [
        "format", "B", "context", "engine", "median ms", "p90 ms", "floor ms", "% of floor",
        "tokens/s", "reference ms", "×ref", "compiled ms", "×comp"]
    rows = table_rows(out)
    assert len(rows) == 3 + 13 and all(r[0] for r in rows)  # one line a row
    # the cold start's note is a line below the table: as a cell it made the value column
    # (and every row) about 220 columns wide when piped (a new user's trial)
    assert "cold start: from the CLI's entry" in out.splitlines()
    assert max(len(line) for line in out.splitlines() if line.startswith("│ end to end")) < 140
    assert _row(out, "prefill 8192 tokens", "torch-ops")[3] == (
        "1099.7 ms, 7449.3 tokens/s, 41 TFLOP/s, MFU 5.3%")


def test_compare_matches_records_and_signs():
    a, b = cuda_result(), cuda_result()
    b["decode"][0].update(median_ms=1.70, tokens_per_s=1 / 1.70 * 1e3)
    b["decode"] = [r for r in b["decode"] if r["engine"] != "compiled"]
    b["decode"].append(_decode("graph", "nvfp4", 4, 1024, 2.0))
    b["cold_start"]["phases"]["repack_s"] = 0.0
    a["cold_start"]["phases"]["repack_s"] = 0.0
    b["kernels_per_step"]["nvfp4"]["1"] = 300
    got = {e["what"]: e for e in br.compare(a, b)}
    med = got["decode graph nvfp4 B=1 ctx=1024 median_ms"]
    assert (med["a"], med["b"], med["better"], med["note"]) == (1.75, 1.70, "lower", "")
    assert med["change"] == pytest.approx(1.70 / 1.75 - 1)  # −2.86%: faster
    tps = got["decode graph nvfp4 B=1 ctx=1024 tokens_per_s"]
    assert tps["change"] == pytest.approx(1.75 / 1.70 - 1) and tps["better"] == "higher"
    only_a = got["decode compiled nvfp4 B=1 ctx=1024 median_ms"]
    assert (only_a["a"], only_a["b"], only_a["change"], only_a["note"]) == \
           (10.5, None, None, "only in A")
    only_b = got["decode graph nvfp4 B=4 ctx=1024 median_ms"]
    assert (only_b["a"], only_b["b"], only_b["note"]) == (None, 2.0, "only in B")
    assert got["cold_start nvfp4 repack_s"]["change"] is None  # a is 0
    assert got["cold_start nvfp4 total_s"]["change"] == 0.0
    k = got["kernels_per_step nvfp4 B=1"]
    assert (k["a"], k["b"], k["better"]) == (347, 300, None)
    assert got["e2e graph nvfp4 B=1 ttft_ms"]["better"] == "lower"
    assert got["prefill graph nvfp4 tokens=8192 tokens_per_s"]["better"] == "higher"
    # identical runs: every change 0, nothing only on one side
    same = br.compare(a, copy.deepcopy(a))
    assert same and all(e["change"] in (0.0, None) and not e["note"] for e in same)


def test_compare_warns_about_other_settings():
    a, b = cuda_result(), cuda_result()
    a["settings"], b["settings"] = {"buckets": [1, 8]}, {"buckets": [1, 4]}
    assert br.compare_warnings(a, b) == ["different buckets: A [1, 8], B [1, 4]: only the "
                                         "figures both runs have are compared"]


def test_compare_warnings():
    a = cuda_result()
    assert br.compare_warnings(a, copy.deepcopy(a)) == []
    b = copy.deepcopy(a) | {"copy_bw": 4.28e12 * 1.04}  # within 5%
    assert br.compare_warnings(a, b) == []
    b = cpu_result()
    b["model"]["config_hash"] = "ffffffffffff"
    w = br.compare_warnings(a, b)
    assert len(w) == 4 and "different weight formats" in w[3]  # the CPU run has BF16 only
    assert "different GPU: A NVIDIA H200, B none (CPU)" in w[0]
    assert "3f2a9c1b0d4e" in w[1] and "ffffffffffff" in w[1]
    assert "copy bandwidth differs by -99.4%" in w[2] and "25.0 GB/s" in w[2]


def test_print_compare_colours_and_warnings():
    a, b = cuda_result(), cuda_result()
    b["decode"][0]["median_ms"] = 1.60  # 8.6% faster: green
    b["decode"][1]["median_ms"] = 1.98  # 10% slower: red
    b["decode"][2]["median_ms"] = 3.03  # 1%: below the threshold, dim
    b["decode"][0]["tokens_per_s"] = 625.0  # more tokens/s: green
    b["machine"]["gpu"] = "NVIDIA B200"
    console = Console(record=True, width=160, force_terminal=True, color_system="standard")
    br.print_compare(a, b, console)
    styled = console.export_text(styles=True)
    plain = _strip(styled)
    assert plain.index("warning: different GPU") < plain.index("median_ms")
    assert "git 22dcfba+dirty" in plain and "2026-11-30T21:00:00Z" in plain
    def style_of(change: str) -> str:  # the ANSI code the change cell is printed in
        return re.search(r"\x1b\[([0-9;]+)m *" + re.escape(change), styled).group(1)

    assert style_of("-8.6%") == "32" and style_of("+9.4%") == "32"  # green; 625 / 571.4
    assert style_of("+10.0%") == "31"  # red
    assert style_of("+1.0%") == "2"  # dim


def _strip(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def test_load_ok_and_errors(tmp_path):
    good = tmp_path / "bench.json"
    good.write_text(json.dumps(cuda_result()))
    assert br.load(good) == cuda_result()
    cases = {"missing.json": (None, "no such file"),
             "not.json": ("{'schema': oops", "not valid JSON"),
             "list.json": ("[1, 2]", "a JSON array, not an object"),
             "null.json": ("null", "a JSON null, not an object"),  # was "NoneType" (a trial)
             "schema-null.json": ('{"schema": null}', "schema null"),
             "noschema.json": ('{"version": 1}', 'no "schema" field'),
             "trace.json": (json.dumps({"schema": "flint-graph-trace", "version": 1}),
                            "this file is from flint-graph trace --out"),
             "v2.json": (json.dumps(cuda_result() | {"version": 2}), "version 2")}
    for name, (body, why) in cases.items():
        p = tmp_path / name
        if body is not None:
            p.write_text(body)
        with pytest.raises(InvalidRequestError) as e:
            br.load(p)
        msg = str(e.value)
        assert str(p) in msg and why in msg and "flint-graph-bench" in msg, msg


def test_formatting_helpers():
    assert [br.ratio(x) for x in (188.04, 18.84, 1.884, None)] == ["188×", "18.8×", "1.88×", "-"]
    assert br.bandwidth(4.28e12) == "4.28 TB/s" and br.bandwidth(9.5e11) == "950.0 GB/s"
    assert br.bandwidth(None) == "-"
    assert [br.num(x, 2, " ms") for x in (1.234, 0.01234, 7, None)] == \
           ["1.23 ms", "0.0123 ms", "7 ms", "-"]
    assert br.rel_change(2.0, 1.0) == -0.5 and br.rel_change(0, 1.0) is None


def test_huge_figures_print_as_powers_of_ten():
    """A compared trace file's `step_us: 1e308` printed as 309 digits in a table hundreds of
    columns wide (a hostile-input trial)."""
    assert [br.num(1e308, 1, " µs"), br.num(10**400), br.num(-10**13), br.num(12.345),
            br.num(4096), br.num(0.001234)] == [
        "1.000e+308 µs", "1.000e+400", "-1.000e+13", "12.35", "4096", "0.00123"]


@pytest.mark.parametrize("schema", [[], {}, 3, None])
def test_a_schema_field_of_another_type_is_named_not_a_crash(tmp_path, schema):
    """A bad-input trial (2026-12-06): `bench --compare` of a file whose "schema" was a list
    or an object was `internal error: TypeError: unhashable type`."""
    from flint_graph.perf.bench_report import read_json

    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema": schema, "version": 1}))
    with pytest.raises(InvalidRequestError,
                       match=r"b\.json: schema .*; expected a flint-graph-bench JSON"):
        read_json(path, "flint-graph-bench")


def test_saved_strings_cannot_drive_the_terminal(tmp_path):
    """Every string of a saved bench or trace JSON is shown, not obeyed, in --compare: a
    bad-input trial put a window title and an OSC 52 clipboard write in an engine name (and
    in `machine.cpu`, and in trace kernel names) and both reached the terminal whole."""
    from flint_graph.perf import trace_report as tr
    from test_trace_report import gap_trace

    esc = "ref\x1b]0;PWNED\x1b\\\x1b]52;c;ZWNobw==\x07\x9b31m"
    res = cuda_result()
    res["decode"][0]["engine"] = esc
    res["machine"] = {**(res.get("machine") or {}), "cpu": esc}
    a = tmp_path / "a.json"
    a.write_text(json.dumps(res))
    trace = gap_trace()
    trace["kernels"][0]["name"] = esc
    t = tmp_path / "t.json"
    t.write_text(json.dumps(tr.to_file_json(trace)))
    for loaded in (br.load(a), tr.load(t)):
        text = json.dumps(loaded, ensure_ascii=False)
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert br.load(a)["decode"][0]["engine"] == "ref\\x1b]0;PWNED\\x1b\\\\x1b]52;c;ZWNobw==\\x07\\x9b31m"
    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    br.print_compare(br.load(a), br.load(a), console)
    tr.print_compare(tr.load(t), tr.load(t), console)
    out = console.file.getvalue()
    assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out
    # format characters (a bidi override, a zero-width space) are shown escaped too, and a
    # ":thumbs_up:" stays text in the report console (a re-trial)
    res["decode"][0]["engine"] = "ref\u202eevil\u200b :thumbs_up:"
    a.write_text(json.dumps(res))
    assert br.load(a)["decode"][0]["engine"] == "ref\\u202eevil\\u200b :thumbs_up:"
    from flint_graph.perf.cli import report_console

    rc = report_console()
    assert rc._emoji is False


def test_wrote_lines_show_the_path_as_typed(capsys):
    """The "wrote PATH" line shows control characters and rich markup of the user's own
    output name, as error messages do (`wrote esc^[[31mfile` recoloured the terminal)."""
    from flint_graph.perf.cli import _finish

    console = Console(file=io.StringIO(), force_terminal=True, width=200)
    assert _finish(console, ["--json x\x1b[31m: cannot write"], ["wrote esc\x1b[31m[bold]f"]) == 2
    out = console.file.getvalue()
    assert "esc\\x1b[31m[bold]f" in _strip(out) and "\x1b[31m" not in out
    assert "x\\x1b[31m: cannot write" in capsys.readouterr().err


def test_a_sealed_report_quoting_undecodable_argv_is_written_and_recognised(tmp_path):
    """A report quotes the command line, where a byte no encoding decodes arrives as a
    surrogate (`--markdown $'s\\xff.md'`): the seal's strict encode was an internal error that
    lost the run's tables (a re-trial). The file holds that byte back and is ours next time."""
    from flint_graph.perf.cli import seal, sealed_as, write_outputs

    text = seal("**flint-graph bench** — x\n\n`flint-graph bench --markdown s\udcff.md`\n",
                "bench markdown")
    out = tmp_path / "s.md"
    assert write_outputs([("--markdown", out, text)]) == []
    assert b"s\xff.md" in out.read_bytes()
    assert sealed_as("bench markdown")(out) and not sealed_as("trace html")(out)
