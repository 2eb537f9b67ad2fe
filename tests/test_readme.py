"""The README's examples, checked (issue 25: a newcomer copies them verbatim): every
`flint-graph` command line in its shell blocks parses with today's flags, the files and scripts
it names exist, and the Python API example runs as written with the embedded flint-nano on the
CPU and prints what the README says it prints."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    """Bodies of the README's fenced blocks whose info string is `lang` ("" = plain)."""
    return [m.group(2) for m in re.finditer(r"^```(\w*)\n(.*?)^```", README, re.M | re.S)
            if m.group(1) == lang]


def _cli_lines() -> list[list[str]]:
    """argv of every flint-graph command in the plain blocks (after a pipe, without the
    comment)."""
    out = []
    for block in _blocks(""):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if "|" in argv:
                argv = argv[len(argv) - argv[::-1].index("|"):]
            if argv and Path(argv[0]).name == "flint-graph":
                out.append(argv)
    return out


def test_the_readme_starts_with_its_two_commands():
    first = _blocks("")[0].splitlines()
    assert [shlex.split(x, comments=True) for x in first] == [
        ["./scripts/chat.sh", "--tools", "examples/tools.json"], ["./scripts/test.sh"]]
    for script in ("scripts/chat.sh", "scripts/test.sh"):
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"
    assert (ROOT / "examples" / "tools.json").is_file()


def test_chat_script_reads_paths_from_where_it_is_run(tmp_path):
    """scripts/chat.sh ran the chat from the repository's root, so `--tools mytools.json` from
    another directory was "not found" and `/save` wrote into the clone (a new user's trial).
    A stub stands in for the venv's flint-graph: it reports the directory and arguments."""
    import shutil
    import subprocess

    repo, work = tmp_path / "repo", tmp_path / "work"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "chat.sh", repo / "scripts" / "chat.sh")
    stub = repo / ".venv" / "bin" / "flint-graph"
    stub.parent.mkdir(parents=True)
    stub.write_text('#!/bin/sh\npwd\necho "$@"\n')
    stub.chmod(0o755)
    work.mkdir()
    out = subprocess.run([str(repo / "scripts" / "chat.sh"), "--tools", "my tools.json"],
                         cwd=work, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(work), "chat --tools my tools.json"]


@pytest.mark.parametrize("argv", _cli_lines(), ids=lambda a: " ".join(a[1:4]))
def test_every_cli_line_parses(argv):
    """A flag renamed or removed since the README was written fails here, not for a user."""
    from flint_graph.cli_args import build_parser

    try:
        args = build_parser().parse_args(argv[1:])
    except SystemExit as e:  # argparse's usage error
        pytest.fail(f"README line {' '.join(argv)!r} no longer parses (exit {e.code})")
    assert args.command == argv[1]


def test_the_python_api_example_runs_verbatim():
    (code,) = [b for b in _blocks("python") if "LLM()" in b]
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    # generate(): flint-nano's answer to 457 + 368 and why it stopped
    assert "825" in lines[0] and " stop " in lines[0], lines
    # chat() with the README's tools: a convert_units call
    assert "convert_units" in lines[1] and "ToolCall" in lines[1], lines
    # stream_chat(): the answer streamed, then the newline
    assert lines[-1].strip().endswith("165"), lines
