"""tools/bench_prefill.py's --processes aggregate (the GPU part of the tool runs on a GPU
machine only): each row the median over the processes, every process's value kept, the rates
rescaled to the median, and the table's spread column; its option checks and those of
tools/probe_grouped_w4a16.py, which stop a malformed value before any work."""

import json
from pathlib import Path

import pytest
from tool_module import tool_module


@pytest.fixture(scope="module")
def bench():
    return tool_module("bench_prefill")


def _refused(monkeypatch, capsys, tool, argv) -> str:
    """stderr of tools/TOOL.py's main() on `argv`, which must stop it with exit code 2 (an
    argument error) and no traceback."""
    monkeypatch.setattr("sys.argv", [f"{tool.__name__}.py", *argv])
    with pytest.raises(SystemExit) as e:
        tool.main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err


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


# Each malformed value stops the tool at once with a message naming the option, before the
# CUDA check and before the minutes of making weights (a bad-input trial, 2026-12-06: these got
# tracebacks after the weights, or were read as something else).
BAD = [
    (["--side-max-rows=abc"], "--side-max-rows 'abc'"), (["--side-max-rows=0"], "--side-max-rows"),
    (["--nt=x"], "--nt 'x'"), (["--overlap=yes"], "--overlap 'yes'"),
    (["--moe=foo"], "--moe 'foo'"), (["--depth=9"], "--depth '9'"),
    (["--row-moe-max=x"], "--row-moe-max 'x'"), (["--paths=foo"], "--paths 'foo'"),
    (["--formats=fp8"], "--formats 'fp8'"), (["--tokens="], "--tokens ''"),
    (["--tokens=abc"], "--tokens 'abc'"), (["--kernel-tokens=x"], "--kernel-tokens 'x'"),
    (["--tokens=99999999999999"], "262144 positions"), (["--preset=nope"], "--preset 'nope'"),
    (["--out=/dev/full"], "--out '/dev/full'"), (["--out="], "--out ''"),
    (["--reps=0"], "--reps 0"), (["--processes=0"], "--processes 0"),
    (["--wg-values=SUB=2"], "SUB is one of 0, 1"), (["--wg-values=FOO=1"], "takes RS, SUB"),
    (["--wg-values=SUB=1:SUB=0"], "SUB given twice"),
    (["--wg-values=WS=1:SUB=0"], "takes RS, SUB"),  # WS and WP removed (twenty-eighth session)
    (["--wg-values=SUB=0:RS=1"], "no spec tools/build_gpu_cache.py builds"),
    (["--attn-kernel=attn_prefill_wg:WS=1:ST=3"], "WS=1 form takes ST=2"),
    # argparse hands `--OPT=--` an empty list unchecked (a bad-input trial, 2026-12-06)
    (["--side-max-rows=--"], "--side-max-rows: expected a value, found '--'"),
    (["--reps=--"], "--reps: expected a value, found '--'"),
    (["--wg-values=--"], "--wg-values: expected a value, found '--'"),
    (["--out=" + "x" * 300], "File name too long"), (["--wg-values=SUB=١"], "expected K=V"),
    (["--wg-values=SUB=²"], "expected K=V"), (["--attn-kernel=attn_prefill_wg:ST=7"],
                                               "ST is one of 2, 3"),
    (["--attn-kernel=attn_prefill:ST=3"], "attn_prefill takes no K=V values"),
    # one W4A16 variant per run, PF only where it is built (a bad-input trial, 2026-12-06:
    # these reached a missing kernel after the weights were made, or timed PF = 0 as PF)
    (["--pf=0,2", "--ws=1"], "--ws, --pf: each builds a variant"),
    (["--pf=4", "--depth=4"], "--depth, --pf: each builds a variant"),
    (["--ws=1", "--depth=3"], "--depth, --ws: each builds a variant"),
    (["--pf=2", "--nt=64"], "PF is built for NT 16 and 32 only"),
    (["--ws=1", "--nt=16,64"], "WS is built for NT 16 and 32 only"), (["--pf=3"], "--pf '3'"),
    (["--graph-buckets=5120,x"], "--graph-buckets '5120,x': expected comma-separated token"),
    (["--graph-buckets=0"], "--graph-buckets '0'"), (["--graph-max=0"], "--graph-max 0"),
    # a bad-input trial, 2026-12-07: the key it does not take named; the default that a
    # smaller preset cannot hold said to be the default
    (["--attn-kernel=attn_prefill_wg:fc=1"], "no 'fc'; attn_prefill_wg takes FC, ST, WS"),
    (["--preset=nano", "--tokens=512"], "--kernel-tokens 100000 (the default --kernel-tokens"),
    (["--attn-kernel=attn_prefill_wg:FC=2"], "FC is one of 0, 1"),
]


def test_empty_token_items_are_skipped_throughout(bench, monkeypatch, capsys, tmp_path):
    """`--tokens=,512` passed the checks and then broke main()'s own parse (a bad-input
    trial, 2026-12-07): empty items are skipped everywhere, as the checks skip them."""
    monkeypatch.setattr("sys.argv", ["bench_prefill.py", "--tokens=,512,,8", "--out",
                                     str(tmp_path), "--kernel-tokens="])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main()
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["prefill.json", "prefill.md"])
def test_out_never_replaces_a_users_file(bench, monkeypatch, capsys, tmp_path, name):
    """--out may hold earlier reports of this tool, which a run replaces; any other file of
    those names is the user's and stops the run before any work (a bad-input trial,
    2026-12-07: a folder's prefill.json and prefill.md were replaced unasked)."""
    (tmp_path / name).write_text("my notes\n")
    err = _refused(monkeypatch, capsys, bench, ["--out", str(tmp_path)])
    assert f"{tmp_path / name} exists and is not a report this tool wrote" in err
    assert (tmp_path / name).read_text() == "my notes\n"


def test_out_replaces_its_own_reports(bench, monkeypatch, capsys, tmp_path):
    bench.write_report(_report({512: 16.0}), tmp_path, 0)
    assert bench._own_json(tmp_path / "prefill.json")
    assert bench._own_markdown(tmp_path / "prefill.md")
    md = tmp_path / "prefill.md"
    md.write_text(md.read_text().replace("16.0", "15.0"))  # edited since: the user's now
    assert not bench._own_markdown(md)


@pytest.mark.parametrize("argv,message", BAD, ids=[a[0] for a, _ in BAD])
def test_bad_values_stop_before_any_work(bench, monkeypatch, capsys, argv, message):
    err = _refused(monkeypatch, capsys, bench, argv)
    assert message in err and "CUDA" not in err, err


def test_good_values_reach_the_cuda_check(bench, monkeypatch, capsys):
    """The documented variants parse (attn_prefill_wg:WS=1 is one of its bench specs)."""
    monkeypatch.setattr("sys.argv", ["bench_prefill.py", "--wg-values=-,SUB=0,RS=0",
                                     "--attn-kernel=attn_prefill_wg:WS=1,attn_prefill_wg:ST=3",
                                     "--side-max-rows=-,2048", "--tokens=512,8192",
                                     "--graph-max=8192", "--graph-buckets=5120,6144,7168",
                                     "--formats=nvfp4", "--paths=graph", "--out", "x"])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit):
        bench.main()
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--values=SUB=2", "--kernel=grouped_w4a16_wg"], "--values 'SUB=2'"),
    (["--values=FOO"], "--values 'FOO'"), (["--values=PF=1"], "--values 'PF=1'"),
    (["--kernel=grouped_w4a16_wg", "--values=SUB=1,SUB=0"], "SUB given twice"),
    (["--kernel=grouped_w4a16_wg", "--values=WS=1,SUB=0"], "--values 'WS=1'"),  # removed
    (["--kernel=grouped_w4a16_wg", "--tokens=8192", "--values=SUB=0,RS=1"], "no spec"),
    (["--values=WS=1", "--nt=64"], "no such grouped_w4a16 spec is built"),
    (["--values=WS=1", "--depth=3"], "no such grouped_w4a16 spec is built"),
    (["--values=PF=4", "--nt=64"], "no such grouped_w4a16 spec is built"),
    (["--values=PF=4,WS=1"], "no such grouped_w4a16 spec is built"),
    (["--tokens=99999999999"], "from 1 to 262144"), (["--tokens=--"], "found '--'"),
    (["--kernel=--"], "--kernel: expected a value, found '--'"),
    (["--nt=7"], "--nt 7"), (["--kernel=grouped_w4a16_wg", "--nt=16"], "64, 128"),
    (["--tokens=abc"], "--tokens 'abc'"), (["--kinds=2"], "--kinds '2'"),
    (["--reps=0"], "--reps 0")])
def test_probe_bad_values_stop_before_any_work(monkeypatch, capsys, argv, message):
    err = _refused(monkeypatch, capsys, tool_module("probe_grouped_w4a16"), argv)
    assert message in err, err


@pytest.mark.parametrize("argv", [
    ["--kernel=grouped_w4a16_wg", "--tokens=8192", "--values=SUB=0,RS=0"],
    ["--values=WS=0"], ["--depth=3"], ["--values=PF=4", "--tokens=512,1024"]])
def test_probe_good_variant_reaches_the_cuda_check(monkeypatch, capsys, argv):
    """Valid variants get as far as the GPU check: grouped_w4a16_wg's SUB=0 at 8,192 tokens
    (NT = 128, where SUB is 1 by default) with RS=0 spelled out (built as the specs without
    it), grouped_w4a16's default spelled out (WS=0), another depth."""
    probe = tool_module("probe_grouped_w4a16")
    monkeypatch.setattr("sys.argv", ["probe_grouped_w4a16.py", *argv])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit):
        probe.main()
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.fixture(scope="module")
def attn_probe():
    return tool_module("probe_attn_speed")


# tools/probe_attn_speed.py checked none of its options: each of these ended in a traceback,
# some only after the GPU work (a bad-input trial, 2026-12-07)
ATTN_BAD = [(["--cases=8192+"], "--cases '8192+': expected T+S"),
            (["--cases=+5"], "--cases '+5'"), (["--cases=a+b"], "--cases 'a+b'"),
            (["--cases=8192"], "--cases '8192'"), (["--cases=1+2+3"], "--cases '1+2+3'"),
            (["--cases=-1+0"], "--cases '-1+0'"), (["--cases="], "--cases ''"),
            (["--variants=attn_prefill_wg:FC=x"], "'FC=x' is not a new K=V"),
            (["--variants=attn_prefill_wg:FC"], "'FC' is not a new K=V"),
            (["--variants=attn_prefill_wg:FC=1:ST=9"], "no such attn_prefill_wg spec"),
            (["--variants=attn_prefill_wg:FC=0:FC=1"], "'FC=1' is not a new K=V"),
            (["--variants=nosuch"], "'nosuch': expected attn_prefill or attn_prefill_wg"),
            (["--variants=attn_prefill:FC=0"], "attn_prefill takes no K=V values"),
            (["--variants="], "none empty"), (["--kinds=bogus"], "--kinds 'bogus'"),
            (["--kinds=full,full"], "each once"), (["--reps=0"], "--reps 0"),
            (["--sets=0"], "--sets 0")]


@pytest.mark.parametrize("argv,message", ATTN_BAD, ids=[a[0] for a, _ in ATTN_BAD])
def test_attn_probe_refuses_bad_values_first(attn_probe, monkeypatch, capsys, argv, message):
    assert message in _refused(monkeypatch, capsys, attn_probe, argv)


def test_attn_probe_never_replaces_a_users_file(attn_probe, monkeypatch, capsys, tmp_path):
    (tmp_path / "attn_speed.json").write_text('{"mine": 1}')
    err = _refused(monkeypatch, capsys, attn_probe, ["--out", str(tmp_path)])
    assert "exists and is not a report this tool wrote" in err
    assert (tmp_path / "attn_speed.json").read_text() == '{"mine": 1}'


def test_attn_probe_good_values_reach_the_cuda_check(attn_probe, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["probe_attn_speed.py", "--variants",
                                     "attn_prefill_wg:FC=0,attn_prefill_wg,attn_prefill_wg:WS=1,"
                                     "attn_prefill_wg:ST=3,attn_prefill", "--cases",
                                     "8192+0,512+8192"])
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit):
        attn_probe.main()
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_reports_are_sealed_and_an_edited_one_is_the_users(bench, tmp_path):
    """A re-trial (2026-12-07): a prefill.json with this tool's "tool" field but edited
    figures (or forged whole) passed as the tool's own. The JSON carries the sha256 of its
    text now; an aggregate of sealed per-process reports is sealed anew."""
    res = bench.aggregate([bench.write_report(_report({512: 16.0}), tmp_path, 0) or
                           json.loads((tmp_path / "prefill.json").read_text())] * 2)
    bench.write_report(res, tmp_path, 0)
    path = tmp_path / "prefill.json"
    assert bench._own_json(path)
    path.write_text(path.read_text().replace('"ms": 16.0', '"ms": 999.0'))
    assert not bench._own_json(path)
    path.write_text(json.dumps({"tool": bench.REPORT_TOOL, "rows": []}))
    assert not bench._own_json(path)


@pytest.mark.parametrize("make", ["fifo", "link", "dangling", "dir", "process_file"])
def test_out_refuses_what_is_no_regular_report_file(bench, monkeypatch, capsys, tmp_path,
                                                     make):
    """A re-trial (2026-12-07): a FIFO named prefill.json hung the check, a link to
    /dev/zero filled memory, a link would be written through, and a file named process-1
    failed only after process 0's GPU run."""
    import os

    argv = ["--out", str(tmp_path)]
    if make == "fifo":
        os.mkfifo(tmp_path / "prefill.json")
    elif make == "link":
        (tmp_path / "prefill.json").symlink_to("/dev/zero")
    elif make == "dangling":
        (tmp_path / "prefill.md").symlink_to(tmp_path / "nowhere")
    elif make == "dir":
        (tmp_path / "prefill.md").mkdir()
    else:
        (tmp_path / "process-1").write_text("mine")
        argv += ["--processes", "2"]
    err = _refused(monkeypatch, capsys, bench, argv)
    assert f"--out {str(tmp_path)!r}: " in err, err


@pytest.mark.parametrize("argv,message", [
    (["--processes=100000000"], "at most 64"), (["--reps=٣"], "--reps"),
    (["--reps= 3x"], "--reps"), (["--graph-buckets=٣"], "--graph-buckets"),
    (["--reps=99999999999999999999999"], "--reps"),
    (["--preset=tiny", "--kernel-tokens="], "(the default --tokens):"),
])
def test_counts_are_plain_bounded_digits(bench, monkeypatch, capsys, argv, message):
    assert message in _refused(monkeypatch, capsys, bench, argv)


@pytest.mark.parametrize("argv,message", [
    (["--reps=99999999999999999999999"], "--reps"), (["--reps=٣"], "--reps"),
    (["--sets=1000"], "--sets 1000: expected 1 to 64"),
    (["--cases=99999999999999999999999+0"], "T + S ≤ 262,144"),
    (["--cases=8+99999999999999999999"], "T + S ≤ 262,144"),
    (["--out=/tmp/" + "a" * 300], "File name too long"),
    (["--out=/proc/1/nope"], "--out '/proc/1/nope': "),
    (["--out= "], "expected a folder"),
])
def test_attn_probe_bounds_and_out_folders(attn_probe, monkeypatch, capsys, argv, message):
    assert message in _refused(monkeypatch, capsys, attn_probe, argv)


# Integer text the tools read: over 4,300 digits int() itself raised (a traceback), full-width
# digits and "2_0" passed `int`, and a huge value was echoed whole (a bad-input trial,
# 2026-12-07). Every such value is now plain ASCII digits, at most PLAIN_INT_DIGITS of them
# (cli_args.plain_int), with the value cut short in the message.
HUGE = "9" * 5000


@pytest.mark.parametrize("argv,message", [
    ([f"--tokens={HUGE}"], "--tokens '99"), ([f"--combine-norm={HUGE}"], "--combine-norm '99"),
    ([f"--side-max-rows={HUGE}"], "--side-max-rows '99"),
    ([f"--row-moe-max={HUGE}"], "--row-moe-max '99"),
    ([f"--wg-values=SUB={HUGE}"], "expected K=V"), ([f"--w4a16-wg={HUGE}"], "a row count"),
    ([f"--attn-kernel=attn_prefill_wg:FC={HUGE}"], "expected K=V"),
    (["--tokens=１２"], "--tokens '１２'"), (["--combine-norm=2"], "--combine-norm '2'"),
    (["--combine-norm=1", "--preset=tiny", "--tokens=25", "--kernel-tokens="],
     "the tiny config has no moe_combine NORM = 1"),
    (["--wg-values=W0=1"], "W0 = 1 needs RS = 1"), (["--wg-values=RS=0:W0=1"], "needs RS = 1"),
    (["--wg-values=W0=2"], "W0 is one of 0, 1"),
    (["--wg-values=SUB=1", "--formats=bf16"], "--wg-values: grouped_w4a16_wg runs only"),
    (["--wg-values=SUB=1", "--paths=kernel"], "--wg-values: grouped_w4a16_wg runs only"),
    (["--combine-norm=1", "--paths=sdpa"], "--combine-norm: moe_combine runs on the graph")])
def test_values_are_plain_bounded_and_used(bench, monkeypatch, capsys, argv, message):
    err = _refused(monkeypatch, capsys, bench, argv)
    assert message in err and "Traceback" not in err and "CUDA" not in err, err
    assert len(err) < 2000, f"{len(err)} characters: the value echoed whole"


@pytest.mark.parametrize("argv,message", [
    ([f"--tokens={HUGE}"], "--tokens '99"), (["--nt=１６"], "--nt"), (["--reps=2_0"], "--reps"),
    (["--layers=1000000000000"], "--layers"), (["--depth=３"], "--depth"),
    (["--kernel=grouped_w4a16_wg", f"--values=RS={HUGE}"], "--values 'RS=99"),
    (["--kernel=grouped_w4a16_wg", "--values=RS=1,W0=1,W0=1"], "W0 given twice"),
    (["--kernel=grouped_w4a16_wg", "--tokens=8192", "--values=W0=1"], "W0 = 1 needs RS = 1")])
def test_probe_integers_are_plain_and_bounded(monkeypatch, capsys, argv, message):
    err = _refused(monkeypatch, capsys, tool_module("probe_grouped_w4a16"), argv)
    assert message in err and "Traceback" not in err, err
    assert len(err) < 2000, f"{len(err)} characters: the value echoed whole"


def test_attn_probe_integers_are_bounded(attn_probe, monkeypatch, capsys):
    err = _refused(monkeypatch, capsys, attn_probe, [f"--variants=attn_prefill_wg:FC={HUGE}"])
    assert "is not a new K=V" in err and len(err) < 2000, err


def test_the_w0_variant_reaches_the_cuda_check(bench, monkeypatch, capsys):
    for tool, argv in ((bench, ["bench_prefill.py", "--wg-values=-,RS=1:W0=1",
                                "--combine-norm=1,0", "--out", "x"]),
                       (tool_module("probe_grouped_w4a16"),
                        ["probe_grouped_w4a16.py", "--kernel=grouped_w4a16_wg",
                         "--values=RS=1,W0=1", "--tokens=8192,2048"])):
        monkeypatch.setattr("sys.argv", argv)
        monkeypatch.setattr("torch.cuda.is_available", lambda: False)
        with pytest.raises(SystemExit):
            tool.main()
        assert "needs a CUDA GPU" in capsys.readouterr().err


LONG = "x" * 50_000


@pytest.mark.parametrize("tool,argv", [
    ("bench_prefill", [f"--graph-buckets={LONG}"]), ("bench_prefill", [f"--out={LONG}"]),
    ("bench_prefill", [f"--preset={LONG}"]), ("probe_grouped_w4a16", [f"--kernel={LONG}"]),
    ("probe_attn_speed", [f"--variants={LONG}"]), ("probe_attn_speed", [f"--cases={LONG}"]),
    ("probe_attn_speed", [f"--kinds={LONG}"]), ("probe_attn_speed", [f"--out={LONG}"]),
    ("probe_attn_speed", [f"--cases={HUGE}+0"])])
def test_long_values_are_cut_in_every_message(monkeypatch, capsys, tool, argv):
    """Each of these echoed its 50,000 characters whole, some twice (a re-trial, 2026-12-07):
    the tools' parser (`cli_args.ValueParser`) cuts every long word of an error."""
    err = _refused(monkeypatch, capsys, tool_module(tool), argv)
    assert "characters)" in err and len(err) < 2000, f"{len(err)} characters"


@pytest.mark.parametrize("argv", [["--variants=--"], ["--cases=--"], ["--kinds=--"],
                                  ["--out=--"]])
def test_attn_probe_refuses_a_bare_double_dash(attn_probe, monkeypatch, capsys, argv):
    """A traceback ('list' object has no attribute 'split') before it used ValueParser."""
    assert "expected a value, found '--'" in _refused(monkeypatch, capsys, attn_probe, argv)


@pytest.mark.parametrize("tool,flag", [("bench_prefill", "--reps"),
                                       ("probe_grouped_w4a16", "--layers"),
                                       ("probe_attn_speed", "--sets")])
@pytest.mark.parametrize("value", [" 3", "3 ", "3\n"])
def test_counts_refuse_blanks(monkeypatch, capsys, tool, flag, value):
    assert flag in _refused(monkeypatch, capsys, tool_module(tool), [f"{flag}={value}"])


def test_every_tool_parser_is_a_value_parser():
    """A tool on plain argparse takes `--X=--` as an empty list and echoes long values whole:
    every parser under tools/ is `cli_args.ValueParser` (or the CLI's ArgParser)."""
    tools = Path(__file__).resolve().parents[1] / "tools"
    plain = [p.name for p in sorted(tools.glob("*.py"))
             if "argparse.ArgumentParser(" in p.read_text(encoding="utf-8")]
    assert not plain, f"plain argparse parsers: {plain}"
