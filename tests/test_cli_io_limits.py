"""The CLI's own input and output streams under hostile conditions (a bad-input trial of
2026-12-02): stdin read with a cap and refused when closed, output paths that are pipes or
devices refused before any work, a file that cannot be written after a run keeping the printed
figures, flags named as the user gave them, seeds checked at the argument, and control
characters of quoted values escaped in error messages."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from flint_graph.cli import main, terminal_safe


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


class _Endless(io.RawIOBase):
    """A stdin like /dev/zero: reading never ends (only a capped read returns)."""

    def readable(self):
        return True

    def readinto(self, b):
        b[:] = b"\0" * len(b)
        return len(b)

    def isatty(self):
        return False


def test_stdin_is_read_with_a_cap(capsys, monkeypatch, tiny_ckpt):
    """`flint-graph generate < /dev/zero` read until 10 GB; the read now stops past the cap."""
    monkeypatch.setattr("flint_graph.cli.STDIN_MAX_BYTES", 1 << 16)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(_Endless())))
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--max-tokens", 2, "--device", "cpu")
    assert code == 2 and "stdin holds more than" in err and "Traceback" not in err, err


@pytest.mark.parametrize("stdin", [None, "closed"])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_closed_stdin_is_one_clear_error(capsys, monkeypatch, tiny_ckpt, stdin, command):
    """`… <&-` gave "internal error: AttributeError" (generate) and "lost sys.stdin" (chat)."""
    if stdin == "closed":
        stdin = io.StringIO("")
        stdin.close()
    monkeypatch.setattr("sys.stdin", stdin)
    code, _, err = _run(capsys, command, tiny_ckpt, "--max-tokens", 2, "--device", "cpu")
    assert code == 2 and "stdin" in err and "closed" in err and "internal" not in err, err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
@pytest.mark.parametrize("flag", ["--json", "--markdown"])
def test_an_output_that_is_a_pipe_or_device_is_refused_before_any_work(capsys, tmp_path, flag):
    """A FIFO with no reader made the write probe block forever; /dev/full passed it and failed
    only after the run."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (fifo, Path("/dev/full")):
        if not target.exists():
            continue
        code, _, err = _run(capsys, "bench", "--preset", "tiny", "--device", "cpu", flag, target)
        assert code == 2 and f"{flag} {target}: not a regular file" in err, err


def test_dev_null_still_discards(capsys, monkeypatch):
    from argparse import Namespace

    from flint_graph.perf.cli import check_outputs

    check_outputs(Namespace(json=Path(os.devnull), compare=None, model=None), ("--json",))


def test_a_file_that_cannot_be_written_after_the_run_keeps_the_figures(capsys, tmp_path,
                                                                       monkeypatch):
    """`bench --json /dev/full` printed nothing after 10 s of measuring. Now the tables are
    printed, the other file is written, and the error names the flag."""
    from flint_graph.perf import cli as perf_cli

    bad, good = tmp_path / "bad.json", tmp_path / "trace.html"
    real = perf_cli.replace_file

    def replace_file(path, text, *a):
        if path == bad:
            raise OSError(28, "No space left on device")
        return real(path, text, *a)

    monkeypatch.setattr(perf_cli, "replace_file", replace_file)
    code, out, err = _run(capsys, "trace", "--preset", "tiny", "--device", "cpu", "--context",
                          128, "--steps", 1, "--no-progress", "--out", bad, "--html", good)
    assert code == 2, err
    assert f"--out {bad}: cannot write the file (No space left on device)" in err
    assert f"wrote {good}" in out and good.exists() and f"wrote {bad}" not in out
    assert "kernel" in out.lower()  # the breakdown table was printed


def test_trace_prefill_out_of_range_names_prefill(capsys):
    code, _, err = _run(capsys, "trace", "--preset", "tiny", "--device", "cpu", "--context",
                        128, "--steps", 1, "--prefill", 99999999)
    assert code == 2 and err.startswith("flint-graph: error: --prefill 99999999:"), err


@pytest.mark.parametrize("argv", [["eval", "--n", "1"], ["bench", "--preset", "tiny"],
                                  ["make-checkpoint", "--out", "unused"]])
def test_a_negative_seed_is_refused_at_the_argument(capsys, argv):
    """`eval --seed -1` wrote a report that `--compare` then refused."""
    code, _, err = _run(capsys, *argv, "--seed", -1)
    assert code == 2 and "argument --seed: expected an integer in [0, 2**63), got -1" in err


def test_control_characters_in_errors_are_escaped(capsys):
    assert terminal_safe("a\x1b[31mb\x9bc\td\ne") == "a\\x1b[31mb\\x9bc\td\ne"
    code, _, err = _run(capsys, "eval", "--n", 1, "--compare", "/nonexistent/a\x1b[2Jb")
    assert code == 2 and "\x1b" not in err and "a\\x1b[2Jb" in err, err


def test_a_symlink_loop_is_named(tmp_path):
    from flint_graph.checkpoints.jsonfile import read_capped

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(ValueError, match="symbolic link loop"):
        read_capped(tmp_path / "a", 1 << 20)
    with pytest.raises(FileNotFoundError):
        read_capped(tmp_path / "missing", 1 << 20)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.json")
    with pytest.raises(ValueError, match="symbolic link to .*gone.json, which does not exist"):
        read_capped(tmp_path / "dangling", 1 << 20)


def test_a_gzipped_json_file_is_named(tmp_path):
    """The shipped reports in docs/ are .json.gz: 'not UTF-8 text (... byte 0x8b ...)' said
    nothing of why (bad-input trial, 2026-12-03)."""
    import gzip

    from flint_graph.checkpoints.jsonfile import read_capped

    (tmp_path / "r.json.gz").write_bytes(gzip.compress(b'{"groups": {}}'))
    with pytest.raises(ValueError, match="gzip-compressed; decompress it first"):
        read_capped(tmp_path / "r.json.gz", 1 << 20)


def test_memory_of_a_parsed_json_is_bounded_not_only_its_size(tmp_path, monkeypatch, capsys):
    """40 MiB of `[{},{},…]` passed every file-size cap and parsed into 1.3 GB of objects, in
    eval --compare, eval --json's own-file check and bench --compare (a bad-input trial):
    read_capped estimates the parsed size first (an upper bound, `parsed_size`) and refuses
    past PARSED_MAX_BYTES. Scaled down here by lowering the bound."""
    from flint_graph.checkpoints import jsonfile

    big = tmp_path / "big.json"
    big.write_bytes(b"[" + b"{}," * 200_000 + b"{}]")  # 600 KB -> ~24 MB of objects
    real = json.dumps({"schema": "flint-graph-bench", "version": 1,
                       "rows": [{"name": f"k{i}", "us": i * 1.5} for i in range(5_000)]})
    assert jsonfile.parsed_size(big.read_bytes()) > 20 * big.stat().st_size
    assert jsonfile.parsed_size(real.encode()) < 30 * len(real)
    # at or above what parsing takes for other shapes too (a re-trial: a string holding one
    # character beyond the BMP is stored 4 bytes a character)
    import tracemalloc

    for body in (b'["ab",' + b'"ab",' * 20_000 + b'"a"]', '"' + "a" * 200_000 + '\U0001F600"',
                 b"{" + b",".join(b'"k%d":1' % i for i in range(20_000)) + b"}"):
        raw = body if isinstance(body, bytes) else body.encode()
        tracemalloc.start()
        parsed = json.loads(raw.decode())
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del parsed
        assert jsonfile.parsed_size(raw) >= peak + len(raw), raw[:20]
    monkeypatch.setattr(jsonfile, "PARSED_MAX_BYTES", 8 << 20)
    with pytest.raises(ValueError, match=r"up to about \d+ MB of memory parsed \(an upper estimate\); expected at most 8 MB"):
        jsonfile.read_capped(big, 1 << 30)
    (tmp_path / "real.json").write_text(real)
    assert len(jsonfile.read_capped(tmp_path / "real.json", 1 << 30)["rows"]) == 5_000
    for argv in (["bench", "--compare", str(big), str(big)],
                 ["eval", "--suite", "arith", "--n", "1", "--compare", str(big)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "of memory parsed (an upper estimate)" in err and str(big) in err and "Traceback" not in err, err


def test_save_under_a_file_says_it_is_a_file(tmp_path):
    """`/save /tmp/ok.json/x` said "directory /tmp/ok.json does not exist"."""
    from flint_graph.errors import FlintError
    from flint_graph.terminal.chat_cli import save_transcript

    (tmp_path / "ok.json").write_text("{}")
    with pytest.raises(FlintError, match="ok.json is a file, not a directory"):
        save_transcript(tmp_path / "ok.json" / "x", [])
    with pytest.raises(FlintError, match="does not exist"):
        save_transcript(tmp_path / "nodir" / "x", [])


@pytest.mark.parametrize("err, words", [
    (OSError(28, "No space left on device"), "cannot write the output (standard output or a "
                                             "file): No space left on device"),
    (OSError(5, "Input/output error", "/mnt/x/report.json"),
     "cannot write /mnt/x/report.json: Input/output error")])
def test_a_full_output_is_an_error_not_an_internal_one(capsys, monkeypatch, err, words):
    """A bad-input trial (2026-12-06): `generate > /dev/full` (and a full disk under --json)
    ended with `internal error: OSError: [Errno 28] No space left on device`, exit 1."""
    from flint_graph import cli

    def fails(args):
        raise err

    monkeypatch.setitem(cli.COMMANDS, "generate", (fails, ()))
    code = main(["generate", "--prompt", "hi"])
    out = capsys.readouterr().err
    assert code == 2 and f"flint-graph: error: {words}" in out and "internal" not in out, out


def test_a_closed_stdout_is_refused_before_any_work(capsys, monkeypatch):
    """`generate --prompt Hi >&-` was `AttributeError: 'NoneType' object has no attribute
    'write'` after the whole run; a closed stderr (`2>&-`) now discards the messages."""
    import sys

    monkeypatch.setattr(sys, "stdout", None)
    assert main(["generate", "--prompt", "hi"]) == 2
    assert "standard output is closed" in capsys.readouterr().err


def test_a_failed_write_keeps_the_earlier_report(tmp_path, monkeypatch):
    """A bad-input trial (2026-12-06): `eval --json prev.json` on a full disk truncated the
    earlier report and left 40 KB of invalid JSON, which the next --json then refused as not a
    report. Outputs are written beside and renamed over: the old file stays whole, no
    temporary file is left, and its permission bits carry over to a replacement."""
    from flint_graph import paths
    from flint_graph.perf.cli import write_outputs

    prev = tmp_path / "prev.json"
    prev.write_text('{"old": true}')
    prev.chmod(0o640)

    def no_room(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "fsync", no_room)
    failed = write_outputs([("--json", prev, '{"new": true}')])
    assert failed and "cannot write the file (No space left on device)" in failed[0]
    assert prev.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prev.json"]
    monkeypatch.undo()
    assert write_outputs([("--json", prev, '{"new": true}')]) == []
    assert prev.read_text() == '{"new": true}' and prev.stat().st_mode & 0o777 == 0o640


def test_unusable_output_names_are_refused_by_flag(tmp_path):
    """A bad-input trial (2026-12-06): a 300-character --json name and a symlink loop ended in
    `internal error` (OSError / RuntimeError from the path checks), and a hard link to the
    --compare report was overwritten with the new run (only resolved paths were compared)."""
    from argparse import Namespace

    from flint_graph.errors import InvalidRequestError
    from flint_graph.perf.cli import check_outputs

    def check(path, compare=None):
        check_outputs(Namespace(json=path, compare=compare, model=None), ("--json",),
                      compare_runs=True)

    with pytest.raises(InvalidRequestError, match="--json .*: cannot write there"):
        check(tmp_path / ("a" * 300 + ".json"))
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for target in (loop, loop / "x.json"):
        with pytest.raises(InvalidRequestError, match="--json .*loop"):
            check(target)
    ref = tmp_path / "ref.json"
    ref.write_text("{}")
    os.link(ref, tmp_path / "hl.json")
    with pytest.raises(InvalidRequestError, match="is the --compare report"):
        check(tmp_path / "hl.json", compare=ref)
    check(tmp_path / "new.json", compare=ref)


def test_replace_file_keeps_a_read_only_file_and_applies_the_umask(tmp_path):
    """A bad-input trial (2026-12-06) on the write-then-rename: a 0444 transcript was replaced
    (a write in place is refused), and a new file was 0644 under `umask 077` (chat
    transcripts readable by everyone)."""
    from flint_graph.paths import replace_file

    old = os.umask(0o077)
    try:
        replace_file(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o600
    ro = tmp_path / "ro.json"
    ro.write_text("keep")
    ro.chmod(0o444)
    if os.geteuid() != 0:  # root writes any file: the refusal is for everyone else
        with pytest.raises(PermissionError):
            replace_file(ro, "new")
        assert ro.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json", "ro.json"]


def test_output_flags_refuse_a_directory_name_and_standard_output(tmp_path, monkeypatch):
    """`--json newdir/` wrote a file named newdir; `--json /dev/stdout > out.txt` renamed the
    report over out.txt and the tables printed after it went to a file without a name; two
    flags discarding to /dev/null were "the same file" (a bad-input trial, 2026-12-06). And a
    missing target is not created by the check (another run's report renamed there meanwhile
    was deleted by the probe's unlink)."""
    from argparse import Namespace

    from flint_graph.errors import InvalidRequestError
    from flint_graph.perf.cli import check_outputs

    def check(**flags):
        check_outputs(Namespace(compare=None, model=None, **flags), tuple(
            "--" + f for f in flags))

    import argparse

    from flint_graph.perf.cli import _path

    with pytest.raises(argparse.ArgumentTypeError, match="names a directory"):
        _path(f"{tmp_path}/newdir/")
    # `eval --json -` wrote a file named "-" (a bad-input trial, 2026-12-06)
    with pytest.raises(argparse.ArgumentTypeError, match="'-' is not taken for stdout"):
        _path("-")
    out = tmp_path / "out.txt"
    out.write_text("")
    with open(out, "w") as f:
        monkeypatch.setattr(os, "fstat", lambda fd, real=os.fstat: real(
            f.fileno() if fd == 1 else fd))
        with pytest.raises(InvalidRequestError, match="is where this command's output goes"):
            check(json=out)
    monkeypatch.undo()
    check(json=Path(os.devnull), markdown=Path(os.devnull))
    created = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: created.append(str(p)) or
                        real_open(p, *a, **k))
    check(json=tmp_path / "missing.json")
    assert str(tmp_path / "missing.json") not in created
    assert not (tmp_path / "missing.json").exists()


@pytest.mark.parametrize("how", ["reader-left", "full"])
def test_stderr_that_cannot_be_written_keeps_the_answer(tmp_path, how):
    """A bad-input trial (2026-12-06): `generate --prompt … 2>&1 >ans.txt | head -c 5` exited 0
    with ans.txt empty (the BrokenPipeError of a reasoning write on stderr ended the command as
    if stdout's reader had left), and `2>/dev/full` exited 1 with no answer. stderr now goes
    quiet when it cannot be written; the answer still reaches stdout."""
    import subprocess
    import sys

    ans = tmp_path / "ans.txt"
    cmd = [sys.executable, "-m", "flint_graph.cli", "generate", "--prompt",
           "What is 457 plus 368?", "--engine", "reference", "--device", "cpu"]
    with open(ans, "w") as out:
        if how == "full":
            with open("/dev/full", "w") as full:
                code = subprocess.run(cmd, stdout=out, stderr=full, timeout=300).returncode
        else:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)
            p.stderr.read(5)  # `| head -c 5`: a few bytes, then the reader leaves
            p.stderr.close()
            code = p.wait(timeout=300)
    assert code == 0 and ans.read_text().strip() == "825"


def test_the_quiet_stderr_drops_text_only_after_a_failed_write():
    from flint_graph.terminal.stderr_stream import QuietWhenReaderLeaves

    class Breaks(io.StringIO):
        def write(self, s):
            raise BrokenPipeError("reader left")

    ok = QuietWhenReaderLeaves(io.StringIO())
    ok.write("kept\n")
    assert ok.getvalue() == "kept\n" and not ok.reader_left
    gone = QuietWhenReaderLeaves(Breaks())
    assert gone.write("lost") == 4 and gone.reader_left  # no exception: the work goes on


def test_an_answer_stdout_cannot_encode_is_escaped_not_an_internal_error(monkeypatch, capsys):
    """A bad-input trial (2026-12-06): PYTHONIOENCODING=ascii with a non-ASCII answer ended in
    `internal error: UnicodeEncodeError` after the whole run."""
    import sys

    from flint_graph import cli

    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)

    def prints(args):
        print("caf\u00e9 \u4e2d")
        return 0

    monkeypatch.setitem(cli.COMMANDS, "generate", (prints, ()))
    assert main(["generate", "--prompt", "hi"]) == 0
    out.flush()
    assert raw.getvalue() == b"caf\\xe9 \\u4e2d\n"
