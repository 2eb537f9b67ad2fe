"""The `flint-graph` CLI: outputs, one-line errors with non-zero exit, help text, chat session."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from conftest_ckpt import scripted_sampler
from rich.console import Console

from flint_graph import SamplingParams
from flint_graph.terminal.chat_cli import ChatSession, save_transcript
from flint_graph.cli import build_parser, main
from flint_graph.errors import FlintError


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json(capsys, tiny_ckpt):
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", 5,
                          "--seed", 3, "--json", "--device", "cpu")
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) >= {"token_ids", "text", "reasoning_content", "tool_calls", "finish_reason",
                        "ttft_ms", "ms_per_token", "prompt_tokens", "cached_tokens"}
    assert 1 <= len(obj["token_ids"]) <= 5
    assert obj["engine"] == "reference"  # the CPU has no graph engine
    assert obj["cached_tokens"] == 0  # one request per process: nothing retained to reuse
    again = json.loads(_run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", 5,
                            "--seed", 3, "--json", "--device", "cpu")[1])
    assert again["token_ids"] == obj["token_ids"]


def test_generate_reads_stdin_and_raw(capsys, monkeypatch, tiny_ckpt):
    monkeypatch.setattr("sys.stdin", io.StringIO("from a pipe"))
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--raw", "--max-tokens", 4,
                          "--temperature", 0, "--json", "--device", "cpu")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["reasoning_content"] is None  # raw: no chat parsing
    from flint_graph import LLM

    ref = LLM(tiny_ckpt, device="cpu", progress=False).generate(
        "from a pipe", SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert obj["token_ids"] == ref.token_ids  # the piped text, untemplated, was the prompt


@pytest.mark.parametrize("piped", ["from a pipe\n", "from a pipe\r\n", "\ufefffrom a pipe\n"])
def test_a_piped_prompt_loses_its_one_trailing_line_end(capsys, monkeypatch, tiny_ckpt, piped):
    """`echo 'What is 250 minus 750?' | flint-graph generate` is the prompt `--prompt` gives
    (issue 25: the newline echo adds changed the answer); only one line end goes. A leading
    byte-order mark (some editors write one) goes too (a bad-input trial, 2026-12-05)."""
    def ids(source):
        monkeypatch.setattr("sys.stdin", io.StringIO(source))
        code, out, err = _run(capsys, "generate", tiny_ckpt, "--raw", "--max-tokens", 4,
                              "--temperature", 0, "--json", "--device", "cpu")
        assert code == 0, err
        return json.loads(out)["token_ids"]

    want = json.loads(_run(capsys, "generate", tiny_ckpt, "--raw", "--prompt", "from a pipe",
                           "--max-tokens", 4, "--temperature", 0, "--json", "--device",
                           "cpu")[1])["token_ids"]
    assert ids(piped) == want


def test_generation_config_max_new_tokens_bounds_the_default(tiny_ckpt):
    """A checkpoint's generation_config.json max_new_tokens is the default max_tokens
    (flint-nano ships 512, so an answer that never ends stops); an explicit one wins."""
    from flint_graph.runtime.sampling import SamplingParams as SP

    assert SP().with_defaults({"max_new_tokens": 7}).max_tokens == 7
    assert SP(max_tokens=3).with_defaults({"max_new_tokens": 7}).max_tokens == 3
    # without one, DEFAULT_MAX_TOKENS rather than the context end (262K tokens for Flint)
    assert SP().with_defaults({}).max_tokens == 4096
    with pytest.raises(Exception, match="max_new_tokens"):
        SP().with_defaults({"max_new_tokens": 0})
    from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint
    from pathlib import Path

    gen = json.loads((Path(ensure_default_checkpoint(progress=False))
                      / "generation_config.json").read_text())
    assert gen["max_new_tokens"] == 512


@pytest.mark.parametrize("extra, match", [
    (["--temperature", "-1"], "argument --temperature: expected"),
    (["--top-p", "1.5"], "argument --top-p: expected"),
    (["--top-k", "-1"], "argument --top-k: expected"),
    (["--stop-on-repeat", "3"], "argument --stop-on-repeat: expected"),
    (["--prompt", "   "], "only whitespace"),
])
def test_generate_bad_values_one_line(capsys, tiny_ckpt, extra, match):
    argv = ["generate", tiny_ckpt, "--device", "cpu"]
    argv += extra if "--prompt" in extra else ["--prompt", "x", *extra]
    code, out, err = _run(capsys, *argv)
    assert code != 0
    assert match in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_errors_are_one_line(capsys, tmp_path, tiny_ckpt):
    code, _, err = _run(capsys, "generate", tmp_path / "missing", "--prompt", "x")
    assert code != 0 and "missing" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "tools.json"
    for text, match in [("{not json", "not valid JSON"), ('{"a": 1}', "list"),
                        ('[{"type": "function"}]', "tools[0]")]:
        bad.write_text(text)
        code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "x", "--tools", bad)
        assert code != 0 and match in err and "Traceback" not in err


def test_help_says_which_model_runs_without_one(capsys):
    # It read "Run the Flint 40B MoE LLM", and the demo model that runs by default was easy to
    # miss.
    code, out, _ = _run(capsys, "--help")
    text = " ".join(out.split())
    assert code == 0
    assert ("Without a MODEL argument, chat, generate, serve and eval run the embedded "
            "flint-nano: a small demo model" in text and "not the 40B model" in text)
    # bench and trace default to synthetic weights, not flint-nano: the top level says so
    assert "bench and trace run synthetic weights of their --preset" in text
    for command in ("chat", "generate"):
        text = " ".join(_run(capsys, command, "--help")[1].split())
        assert "default: the embedded flint-nano, a small demo model" in text, command


def test_a_request_without_max_tokens_stops_at_the_default(tiny_ckpt, monkeypatch):
    """A checkpoint whose generation_config.json sets no max_new_tokens (the synthetic and,
    possibly, the real 40B ones) bounds every request at DEFAULT_MAX_TOKENS, not at the
    context end; a shorter context still caps it (issue 25)."""
    from flint_graph import LLM
    from flint_graph.runtime.sampling import DEFAULT_MAX_TOKENS, SamplingParams

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    monkeypatch.setattr(llm, "generation_config", {})
    req = llm._request([5, 6, 7], SamplingParams(), None)
    assert req.params.max_tokens == DEFAULT_MAX_TOKENS
    assert req.max_new_tokens == min(DEFAULT_MAX_TOKENS, llm.engine.context_limit - 3)
    assert llm._request([5, 6, 7], SamplingParams(max_tokens=9), None).max_new_tokens == 9


def test_every_help_fits_80_columns(capsys, monkeypatch):
    """In an 80-column terminal every --help line we write fits (a piped `bench --help` broke
    its hand-wrapped figures list at 83–85 columns; new-user trial). The usage synopsis is
    argparse's own: it keeps a mutually exclusive group on one line."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    top = _run(capsys, "--help")[1]
    commands = re.findall(r"^    ([a-z][a-z-]+) ", top, re.M)
    assert {"chat", "generate", "bench", "trace", "eval"} <= set(commands)
    for argv in [["--help"]] + [[c, "--help"] for c in commands]:
        code, out, _ = _run(capsys, *argv)
        assert code == 0, argv
        usage, rest = out.split("\n\n", 1)
        wide = [line for line in rest.splitlines() if len(line) > 80]
        assert not wide, f"{' '.join(argv)}: {wide}"


def test_every_option_has_help():
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subs.choices) >= {"chat", "generate", "make-checkpoint"}
    for name, sub in subs.choices.items():
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def _session(llm, inputs, max_tokens=6, **kw):
    console = Console(file=io.StringIO(), width=100, force_terminal=False)
    it = iter(inputs)
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=max_tokens, seed=0)
    return ChatSession(llm, params, console=console, **kw), console


def test_chat_session_save_reset_exit(tiny_llm, tmp_path):
    path = tmp_path / "t.json"
    s, console = _session(tiny_llm, ["hello", f"/save {path}",
                                     f"/save {tmp_path / 'no' / 'x.json'}", "/reset",
                                     f"/save {path}", "/exit"])
    assert s.run() == 0
    saved = json.loads(path.read_text())["messages"]
    assert [m["role"] for m in saved] == ["user", "assistant"]
    assert s.messages == []
    out = console.file.getvalue()
    assert "does not exist" in out and "nothing to save yet" in out
    assert not tiny_llm.engine.has_work


def test_chat_tool_loop_asks_for_result(tiny_llm, monkeypatch):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    call = tiny_llm.tokenizer.encode(
        "x</think><tool_call>lookup<arg_key>q</arg_key><arg_value>flint</arg_value>"
        "</tool_call><|observation|>")
    answer = tiny_llm.tokenizer.encode("y</think>done<|user|>")
    scripts = iter([call, answer])

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        nonlocal current
        if int(positions[0]) == 0:
            current = scripted_sampler(next(scripts))
        return current(logits, temperature, top_k, top_p, seeds, positions)

    current = None
    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    s, console = _session(tiny_llm, ["find it", "42 results", "/exit"], tools=tools,
                          max_tokens=100)
    s.run()
    roles = [m["role"] for m in s.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert s.messages[1]["tool_calls"][0]["function"] == {"name": "lookup",
                                                          "arguments": {"q": "flint"}}
    assert s.messages[2]["content"] == "42 results"
    assert s.messages[3]["content"] == "done"
    assert "tool call: lookup" in console.file.getvalue()


def test_save_transcript_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "chat.json"
    save_transcript(path, [{"role": "user", "content": "keep me"}])
    monkeypatch.setattr("os.replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(FlintError, match="chat.json"):
        save_transcript(path, [{"role": "user", "content": "new"}])
    assert json.loads(path.read_text())["messages"][0]["content"] == "keep me"
    assert [p.name for p in tmp_path.iterdir()] == ["chat.json"]


def test_a_saved_transcript_is_the_openai_messages_format(tmp_path, tiny_llm):
    """Tool-call arguments are saved as the JSON string the OpenAI API uses (a new-user trial
    found mappings, 2026-12-05); a transcript saved before with mappings is still replaced by
    its own continuation, and `LLM.chat` takes the saved messages back."""
    call = {"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}}}
    msgs = [{"role": "user", "content": "weather in Oslo"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": '{"high": 12}', "tool_call_id": "call_0"}]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"messages": msgs[:2]}))  # the format saved before
    for path in (tmp_path / "new.json", old):
        save_transcript(path, msgs)
        saved = json.loads(path.read_text())["messages"]
        args = saved[1]["tool_calls"][0]["function"]["arguments"]
        assert isinstance(args, str) and json.loads(args) == {"city": "Oslo", "days": 3}
        assert saved[0] == msgs[0] and saved[2] == msgs[2]
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "days": 3}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
    from flint_graph.runtime.sampling import SamplingParams
    tiny_llm.chat(saved, tools=tools, params=SamplingParams(max_tokens=1))


def test_chat_unknown_command_ctrl_c_at_prompt_and_control_chars(tiny_llm):
    from flint_graph.terminal.chat_cli import printable

    assert printable("a\x1b[31mb\rc\n\td\x7f") == "a\u241b[31mb\u240dc\n\td\u2421"
    inputs = iter(["/frobnicate", KeyboardInterrupt, "/exit"])

    def fake_input(prompt=""):
        item = next(inputs)
        if item is KeyboardInterrupt:
            raise KeyboardInterrupt
        return item

    s, console = _session(tiny_llm, [])
    console.input = fake_input  # type: ignore[method-assign]
    assert s.run() == 0  # Ctrl-C at the prompt did not end the session; /exit did
    text = console.file.getvalue()
    assert "unknown command /frobnicate" in text and "Ctrl-D quits" in text
    assert "/help lists the commands" in text


@pytest.mark.parametrize("argv, match", [
    (["--device", "nonsense"], "device 'nonsense'"),
    (["--device", "mps"], "device 'mps'"),
    (["--hf-config-path", "/nonexistent/dir"], "does not exist"),
])
def test_model_option_errors_one_line(capsys, tiny_ckpt, argv, match):
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "x", *argv)
    assert code == 2 and match in err and "Traceback" not in err


def test_make_checkpoint_refuses_config_too_big_for_memory(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("os.sysconf", lambda name: 1024)  # a machine with 1 MiB of memory
    code, _, err = _run(capsys, "make-checkpoint", "--preset", "tiny", "--out", tmp_path / "x",
                        "--device", "cpu")
    assert code == 2 and "GB" in err and not (tmp_path / "x").exists()


def test_overwrite_never_deletes_user_files(capsys, tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("thesis")
    code, _, err = _run(capsys, "make-checkpoint", "--out", precious, "--overwrite",
                        "--device", "cpu", "--no-progress")
    assert code == 2 and "left alone" in err
    assert (precious / "notes.txt").read_text() == "thesis"


@pytest.mark.parametrize("added", ["notes.txt", "finetune/data.bin"])
def test_overwrite_never_deletes_files_added_to_a_checkpoint(capsys, tmp_path, added):
    """--overwrite replaced a checkpoint make-checkpoint wrote together with files the user
    had put in it since (bad-input trial, 2026-12-03): it now refuses, naming them, and
    leaves everything as it was."""
    ck = tmp_path / "ck"
    args = ("make-checkpoint", "--preset", "tiny", "--out", ck, "--device", "cpu",
            "--no-progress")
    assert _run(capsys, *args)[0] == 0
    mine = ck / added
    mine.parent.mkdir(exist_ok=True)
    mine.write_text("mine")
    code, _, err = _run(capsys, *args, "--overwrite")
    assert code == 2 and added.split("/")[0] in err and "did not write" in err, err
    assert mine.read_text() == "mine"
    mine.unlink()
    if mine.parent != ck:
        mine.parent.rmdir()
    assert _run(capsys, *args, "--overwrite")[0] == 0  # a checkpoint alone is replaced


@pytest.mark.parametrize("fault", ["sigint", "second rename fails"])
def test_overwrite_interrupted_between_its_renames_keeps_a_checkpoint(capsys, tmp_path,
                                                                      monkeypatch, fault):
    """--overwrite moves the old checkpoint aside, then the new one in: a Ctrl-C between the two
    (simulated by a trial) left no checkpoint at --out and the old one under a hidden name. Now
    the signal waits for both renames (the new checkpoint is in place, exit 130), and a failed
    second rename puts the old one back."""
    import os
    import signal
    from pathlib import Path

    ck = tmp_path / "ck"
    args = ("make-checkpoint", "--preset", "tiny", "--out", ck, "--device", "cpu",
            "--no-progress")
    assert _run(capsys, *args)[0] == 0
    first = (ck / "config.json").read_text()
    real_rename, calls = Path.rename, []

    def rename(self, target):
        calls.append(str(target))
        if len(calls) == 2 and fault == "second rename fails":
            raise OSError(28, "No space left on device")
        out = real_rename(self, target)
        if len(calls) == 1 and fault == "sigint":
            os.kill(os.getpid(), signal.SIGINT)  # lands between the two renames
        return out

    monkeypatch.setattr(Path, "rename", rename)
    code, _, err = _run(capsys, *args, "--seed", "7", "--overwrite")
    monkeypatch.undo()
    assert calls[0].endswith(".old"), calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"], list(tmp_path.iterdir())
    if fault == "sigint":
        assert code == 130 and (ck / "config.json").is_file()
        assert (ck / "model-nvfp4.gguf").is_file() or (ck / "model.safetensors").is_file() \
            or any(ck.glob("*.safetensors"))
    else:
        assert code == 2 and "No space left" in err, err
        assert (ck / "config.json").read_text() == first  # the old checkpoint, back in place


def test_overwrite_of_the_current_directory_works(capsys, tmp_path, monkeypatch):
    """`make-checkpoint --out . --overwrite` inside a checkpoint made its temporary directory
    inside the one it replaced, then refused it as a file it did not write (a trial)."""
    ck = tmp_path / "ck"
    args = ("--preset", "tiny", "--device", "cpu", "--no-progress")
    assert _run(capsys, "make-checkpoint", "--out", ck, *args)[0] == 0
    monkeypatch.chdir(ck)
    code, _, err = _run(capsys, "make-checkpoint", "--out", ".", *args, "--seed", "3",
                        "--overwrite")
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]
    assert '"seed": 3' in (ck / ".flint-checkpoint-complete.json").read_text()


def test_overwrite_through_a_symlink_is_refused_cleanly(capsys, tmp_path):
    """--overwrite on a symlink to a checkpoint ended in "internal error: OSError: Cannot call
    rmtree on a symbolic link" with the link replaced by a directory and a stray link left
    (bad-input trial, 2026-12-03): now one error naming the directory to pass."""
    ck = tmp_path / "ck"
    args = ("--preset", "tiny", "--device", "cpu", "--no-progress")
    assert _run(capsys, "make-checkpoint", "--out", ck, *args)[0] == 0
    link = tmp_path / "link"
    link.symlink_to(ck)
    code, _, err = _run(capsys, "make-checkpoint", "--out", link, *args, "--overwrite")
    assert code == 2 and "symbolic link" in err and str(ck) in err, err
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["ck", "link"]


def test_save_transcript_through_symlink_keeps_mode_and_refuses_dirs(tmp_path):
    target = tmp_path / "real.json"
    target.write_text('{"messages": []}')  # an earlier transcript
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    save_transcript(link, [{"role": "user", "content": "hi"}])
    assert link.is_symlink() and json.loads(target.read_text())["messages"][0]["content"] == "hi"
    assert target.stat().st_mode & 0o777 == 0o640
    with pytest.raises(FlintError, match="not a regular file"):
        save_transcript(tmp_path, [])


@pytest.mark.parametrize("make", ["long name", "symlink loop", "file as directory"])
def test_save_transcript_refuses_unusable_names_with_one_error(tmp_path, make):
    """/save with a name the OS refuses raised OSError / RuntimeError before the write's own
    error handling and ended the chat, losing the conversation (bad-input trial, 2026-12-02);
    each is a FlintError naming the path now, which the chat shows before going on."""
    if make == "long name":
        path = tmp_path / ("x" * 300 + ".json")
    elif make == "symlink loop":
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        path = tmp_path / "a"
    else:
        (tmp_path / "f").write_text("")
        path = tmp_path / "f" / "t.json"
    with pytest.raises(FlintError, match="cannot save transcript|is a file, not a directory"):
        save_transcript(path, [{"role": "user", "content": "hi"}])


def test_chat_goes_on_after_a_save_the_os_refuses(tiny_llm, tmp_path):
    good = tmp_path / "ok.json"
    s, console = _session(tiny_llm, ["hello", f"/save {tmp_path / ('x' * 300)}.json",
                                     f"/save {good}", "/exit"])
    assert s.run() == 0
    # the console wraps the long path at 100 columns, wherever the temporary directory puts it
    assert "cannot save transcript" in " ".join(console.file.getvalue().split())
    assert [m["role"] for m in json.loads(good.read_text())["messages"]] == ["user", "assistant"]


def test_chat_survives_internal_error_and_keeps_transcript(tiny_llm, tmp_path, monkeypatch):
    real = tiny_llm.stream_chat
    calls = iter([ZeroDivisionError("boom"), None])

    def flaky(*a, **kw):
        err = next(calls)
        if err:
            raise err
        return real(*a, **kw)

    monkeypatch.setattr(tiny_llm, "stream_chat", flaky)
    path = tmp_path / "t.json"
    s, console = _session(tiny_llm, ["first", "second", f"/save {path}", "/exit"])
    assert s.run() == 0
    assert "internal error: ZeroDivisionError" in console.file.getvalue()
    assert [m["content"] for m in json.loads(path.read_text())["messages"]][:1] == ["second"]


def test_raw_refuses_chat_only_flags(capsys, tiny_ckpt, tmp_path):
    tools = tmp_path / "t.json"
    tools.write_text('[{"type": "function", "function": {"name": "f"}}]')
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--raw", "--prompt", "x", "--tools", tools)
    assert code == 2 and "--raw" in err


def test_context_limit_note_names_the_context_not_max_tokens(capsys, tiny_ckpt):
    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False)
    limit = llm.cfg.max_position_embeddings
    word = "hello world "
    per = len(llm.tokenizer.encode(word * 100)) / 100
    prompt = word * int((limit - 40) / per)
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--raw", "--prompt", prompt,
                          "--max-tokens", 1000, "--temperature", 0, "--device", "cpu")
    assert code == 0 and "context limit" in err and "--max-tokens" not in err
    # --json says it too: "length_cause" in the object, the note on stderr (a new user's trial)
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--raw", "--prompt", prompt,
                          "--max-tokens", 1000, "--temperature", 0, "--device", "cpu", "--json")
    got = json.loads(out)
    assert code == 0 and got["finish_reason"] == "length" and "context limit" in err
    assert got["length_cause"] == "context_limit" and got["context_limit"] == limit
    code, out, _ = _run(capsys, "generate", tiny_ckpt, "--raw", "--prompt", "hello",
                        "--max-tokens", 3, "--temperature", 0, "--device", "cpu", "--json")
    got = json.loads(out)
    assert got["finish_reason"] == "length" and got["length_cause"] == "max_tokens"


def test_cpu_index_and_unwritable_output_are_clean(capsys, tiny_ckpt, tmp_path):
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "x", "--max-tokens", 2,
                          "--device", "cpu:0", "--json")
    assert code == 0, err
    blocker = tmp_path / "afile"
    blocker.write_text("")
    code, _, err = _run(capsys, "make-checkpoint", "--out", blocker / "x", "--device", "cpu",
                        "--no-progress")
    assert code == 2 and "cannot write there" in err and "Traceback" not in err


def test_tool_call_finish_reason_in_json_and_chat_footer(capsys, monkeypatch, tiny_llm,
                                                         tiny_ckpt, tmp_path):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    text = ("x</think><tool_call>lookup<arg_key>q</arg_key><arg_value>flint</arg_value>"
            "</tool_call><|observation|>")
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode(text)))
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "find", "--tools", path,
                          "--max-tokens", 100, "--json", "--device", "cpu")
    obj = json.loads(out)
    assert code == 0 and obj["finish_reason"] == "tool_calls", err
    assert obj["tool_calls"] == [{"id": "call_0", "name": "lookup", "arguments": {"q": "flint"}}]
    scripts = iter([text, "y</think>done<|user|>"])

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        nonlocal current
        if int(positions[0]) == 0:
            current = scripted_sampler(tiny_llm.tokenizer.encode(next(scripts)))
        return current(logits, temperature, top_k, top_p, seeds, positions)

    current = None
    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    s, console = _session(tiny_llm, ["find it", "the result", "/exit"], tools=tools,
                          max_tokens=100)
    s.run()
    footers = [line for line in console.file.getvalue().splitlines() if " tokens · " in line]
    assert [f.split(" · ")[-1] for f in footers] == ["tool_calls", "stop"], footers


def test_generate_without_tools_prints_no_tool_call_warnings(capsys, monkeypatch, tiny_llm,
                                                             tiny_ckpt):
    text = "x</think>Try <tool_call>grep<arg_key>q</arg_key></tool_call>.<|user|>"
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode(text)))
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "find", "--max-tokens", 100,
                          "--device", "cpu")
    assert code == 0 and "warning" not in err, err
    assert "Try <tool_call>grep<arg_key>q</arg_key></tool_call>." in out


def test_generate_without_tools_hints_at_tools_when_the_answer_is_a_call(capsys, monkeypatch,
                                                                       tiny_llm, tiny_ckpt):
    # flint-nano answers "Convert 120 km to mi." with a call; without --tools it reached stdout
    # as markup with no word of --tools.
    call = "<tool_call>convert_units<arg_key>value</arg_key><arg_value>120</arg_value></tool_call>"
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode(f"x</think>{call}<|user|>")))
    argv = ("generate", tiny_ckpt, "--prompt", "Convert 120 km to mi.", "--max-tokens", 100,
            "--device", "cpu")
    code, out, err = _run(capsys, *argv)
    assert code == 0 and out == f"{call}\n"  # stdout as before: the answer, markup and all
    assert [line for line in err.splitlines() if "--tools" in line] == [
        "flint-graph: note: the answer holds a tool call (<tool_call>), shown as text since no "
        "tools were declared; pass --tools TOOLS.json (e.g. examples/tools.json) to have it "
        "parsed"]
    # --raw cannot take --tools, and an answer without a call needs no hint
    assert "--tools" not in _run(capsys, *argv, "--raw")[2]
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode("x</think>74.56 mi<|user|>")))
    code, out, err = _run(capsys, *argv)
    assert out == "74.56 mi\n" and "--tools" not in err


def test_generate_without_tools_names_tools_when_the_model_declines(capsys, monkeypatch,
                                                                     tiny_llm, tiny_ckpt):
    # flint-nano, asked "Convert 120 km to mi." with no tools declared, declines and lists the
    # very skills it declined, with no word of --tools (issue 25 audit)
    from flint_graph.cli import DECLINED
    from flint_graph.nano.phrasings import REFUSAL

    assert REFUSAL.startswith(DECLINED)  # the note keys on the trained refusal's opening
    monkeypatch.setattr("flint_graph.runtime.engine.sample", scripted_sampler(
        tiny_llm.tokenizer.encode(f"x</think>{REFUSAL}<|user|>")))
    argv = ("generate", tiny_ckpt, "--prompt", "Convert 120 km to mi.", "--max-tokens", 100,
            "--device", "cpu")
    code, out, err = _run(capsys, *argv)
    assert code == 0 and out == f"{REFUSAL}\n"
    # conditional: "Write a poem" is declined in the same words, and tools would not help it
    assert [line for line in err.splitlines() if "--tools" in line] == [
        "flint-graph: note: the model declined; if you asked for the weather, a unit "
        "conversion, a calculation or a table lookup, those are tool calls, offered with "
        "--tools TOOLS.json (e.g. examples/tools.json)"]
    tools = Path(__file__).resolve().parents[1] / "examples" / "tools.json"
    assert "--tools" not in _run(capsys, *argv, "--tools", tools)[2]  # tools offered: no note


def test_an_empty_tools_file_is_named_in_the_hint_and_refused_with_raw(capsys, monkeypatch,
                                                                      tiny_llm, tiny_ckpt,
                                                                      tmp_path):
    none = tmp_path / "none.json"
    none.write_text("[]")
    call = "<tool_call>convert_units<arg_key>value</arg_key><arg_value>120</arg_value></tool_call>"
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode(f"x</think>{call}<|user|>")))
    argv = ("generate", tiny_ckpt, "--prompt", "Convert 120 km to mi.", "--max-tokens", 100,
            "--device", "cpu", "--tools", none)
    code, out, err = _run(capsys, *argv)
    assert code == 0 and f"shown as text since {none} declares none" in err
    code, _, err = _run(capsys, *argv, "--raw")  # [] is still --tools: refused with --raw
    assert code == 2 and "--tools applies to the chat template; --raw sends the prompt " \
        "without it" in err
    code, _, err = _run(capsys, *argv[:-2], "--raw", "--no-think")  # names only what was given
    assert code == 2 and "error: --no-think applies to the chat template" in err


def test_deeply_nested_tools_file_is_one_line(capsys, tmp_path, tiny_ckpt):
    # json.loads raised RecursionError: "internal error", exit 1.
    deep = tmp_path / "tools.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "x", "--tools", deep)
    assert code == 2 and "tools.json: not valid JSON (nested too deeply" in err
    assert len(err.strip().splitlines()) == 1


def test_chat_system_that_is_not_utf8_is_refused_at_start(capsys, tiny_ckpt):
    code, _, err = _run(capsys, "chat", tiny_ckpt, "--system", "be \udcff brief")
    assert code == 2 and err.strip() == (
        "flint-graph: error: --system: not valid UTF-8 text: a lone surrogate U+DCFF at "
        "character 3 (an undecodable input byte 0xFF reads as one)")


def test_chat_input_that_is_not_utf8_is_asked_again(tiny_llm, monkeypatch):
    # A tool result holding an undecodable byte (read as a lone surrogate) stayed in the
    # history and failed every later turn until /reset, quoting a position in the template.
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    call = tiny_llm.tokenizer.encode("x</think><tool_call>lookup</tool_call><|observation|>")
    answers = iter([call] + [tiny_llm.tokenizer.encode("y</think>done<|user|>")] * 2)

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        nonlocal current
        if int(positions[0]) == 0:
            current = scripted_sampler(next(answers))
        return current(logits, temperature, top_k, top_p, seeds, positions)

    current = None
    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    s, console = _session(tiny_llm, ["find \udcff", "find it", "bad \udcff", "42", "more",
                                     "/exit"], tools=tools, max_tokens=100)
    s.run()
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant", "user",
                                               "assistant"]
    assert s.messages[2]["content"] == "42"
    shown = console.file.getvalue()
    assert "the message is not valid UTF-8 text: a lone surrogate U+DCFF at character 5" in shown
    assert "the result is not valid UTF-8 text: a lone surrogate U+DCFF at character 4" in shown
    assert "error: prompt" not in shown


def test_generate_json_reports_what_was_generated_when_interrupted(capsys, monkeypatch,
                                                                   tiny_ckpt):
    # Ctrl-C mid-answer printed no JSON at all, so --json could never show the documented
    # finish_reason "abort" and the tokens generated so far were lost.
    script = scripted_sampler([100, 101, 102, 103])

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        if int(positions[0]) == 3:
            raise KeyboardInterrupt
        return script(logits, temperature, top_k, top_p, seeds, positions)

    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--json",
                          "--device", "cpu")
    assert code == 130 and err.strip().splitlines()[-1] == "flint-graph: interrupted", err
    obj = json.loads(out)
    assert obj["finish_reason"] == "abort" and obj["token_ids"] == [100, 101, 102]


def test_generate_json_reports_what_was_generated_when_terminated(capsys, monkeypatch,
                                                                  tiny_ckpt):
    # A bad-input trial (2026-12-06): SIGTERM (`timeout`, `kill`) during `generate --json`
    # ended the process with nothing on stdout. It now ends as Ctrl-C does: the request
    # aborts, its JSON is printed, "flint-graph: terminated", exit 143; and the handler is
    # given back afterwards.
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    script = scripted_sampler([100, 101, 102, 103])

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        if int(positions[0]) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # delivered at the next bytecode, in here
        return script(logits, temperature, top_k, top_p, seeds, positions)

    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--json",
                          "--device", "cpu", "--max-tokens", 50)
    assert code == 143 and err.strip().splitlines()[-1] == "flint-graph: terminated", err
    obj = json.loads(out)
    assert obj["finish_reason"] == "abort" and obj["token_ids"][:3] == [100, 101, 102]
    assert len(obj["token_ids"]) <= 4
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("value", ["", "1,x", "0", "2,-1", "1,,2"])
def test_build_kernels_bad_buckets_are_one_clear_line(capsys, value):
    # Was "invalid <lambda> value", or (0, -1) a DSL layout TypeError after the progress bar.
    code, _, err = _run(capsys, "build-kernels", "--buckets", value)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"argument --buckets: expected comma-separated batch sizes >= 1 (e.g. 1,2,4,8), " \
           f"found {value!r}" in err


def test_stats_prints_the_start_up_report(capsys, tiny_ckpt):
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", 2,
                        "--device", "cpu", "--stats")
    assert code == 0, err
    line = next(t for t in err.splitlines() if t.startswith("flint-graph: start-up "))
    report = json.loads(line.removeprefix("flint-graph: start-up "))
    assert report["engine"] == "reference" and "needs CUDA" in report["fallback_reason"]
    assert report["checkpoint_s"] >= 0 and report["weights_bytes"] > 0
    assert report["checkpoint_read_s"] + report["repack_s"] == pytest.approx(
        report["checkpoint_s"], abs=2e-3)


def test_max_context_caps_a_sequence_on_the_reference_engine_too(capsys, tiny_ckpt):
    """--max-context is tokens per sequence on either engine (a bad-input trial, 2026-12-07:
    the reference engine ignored EngineConfig(max_context=...)): a prompt past it is refused
    naming it, and an answer it cuts says so."""
    base = ["generate", tiny_ckpt, "--device", "cpu", "--raw", "--temperature", "0"]
    code, _, err = _run(capsys, *base, "--prompt", "hi " * 20, "--max-context", 10)
    assert code == 2 and "the context limit is 10 tokens (max_context" in err, err
    code, out, err = _run(capsys, *base, "--prompt", "hi", "--max-context", 10, "--json",
                          "--max-tokens", 50)
    out = json.loads(out)
    assert code == 0 and out["context_limit"] == 10, err
    assert out["prompt_tokens"] + len(out["token_ids"]) <= 10
    assert out["finish_reason"] == "length" and "or raise --max-context" in err, err


def test_stop_on_repeat_cuts_the_answer_where_it_starts_to_loop(capsys, tiny_ckpt):
    """--stop-on-repeat N: the answer is the free answer cut at the token that completes N
    tokens of one block said four times or more (RepeatDetector), with finish reason "repeat";
    an answer that never loops is left whole."""
    from flint_graph.cli import sampling_params
    from flint_graph.cli_args import build_parser
    from flint_graph.runtime.stopping import RepeatDetector

    for cmd in ("generate", "chat"):
        args = build_parser().parse_args([cmd, "--stop-on-repeat", "64"])
        assert sampling_params(args).stop_on_repeat == 64
    # on by default in the terminal chat only (a looping answer to a plain-text tool result
    # ran to the limit every time); 0 turns it off there; generate keeps it off
    assert sampling_params(build_parser().parse_args(["chat"])).stop_on_repeat == 64
    assert sampling_params(build_parser().parse_args(["chat", "--stop-on-repeat", "0"])) \
        .stop_on_repeat == 0
    assert sampling_params(build_parser().parse_args(["generate"])).stop_on_repeat == 0
    for prompt in ("count with me", "hello hello hello"):  # neither loops on this checkpoint
        base = ["generate", tiny_ckpt, "--device", "cpu", "--prompt", prompt, "--raw",
                "--temperature", "0", "--max-tokens", "200", "--json"]
        _, free, _ = _run(capsys, *base)
        code, out, err = _run(capsys, *base, "--stop-on-repeat", "8")
        assert code == 0, err
        free, out = json.loads(free), json.loads(out)
        det = RepeatDetector(8)
        cut = next((i for i, t in enumerate(free["token_ids"]) if det.push(t)), None)
        if cut is None:
            assert out["token_ids"] == free["token_ids"]
        else:
            assert out["finish_reason"] == "repeat"
            assert out["token_ids"] == free["token_ids"][:cut + 1]


def test_no_command_is_a_one_line_usage_error(capsys):
    code, out, err = _run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("flint-graph: error: no command given") and "chat" in err
    assert len(err.strip().splitlines()) == 1


def test_generate_ends_the_reasoning_line_before_the_answer(monkeypatch, tiny_llm, tiny_ckpt):
    """On a terminal stderr (reasoning) and stdout (answer) share the screen: the reasoning's
    line must end before the answer starts (a new user saw "So it is 165.165"), and once only."""
    monkeypatch.setattr("flint_graph.runtime.engine.sample", scripted_sampler(
        tiny_llm.tokenizer.encode("So it is 165.</think>165<|user|>")))
    screen = io.StringIO()
    monkeypatch.setattr("sys.stdout", screen)
    monkeypatch.setattr("sys.stderr", screen)
    code = main(["generate", str(tiny_ckpt), "--prompt", "What is 120 plus 45?",
                 "--max-tokens", "40", "--device", "cpu"])
    assert code == 0, screen.getvalue()
    assert screen.getvalue().endswith("So it is 165.\n165\n"), screen.getvalue()


@pytest.mark.parametrize("bad", ["0", "-3"])
def test_max_tokens_below_one_names_the_flag(capsys, bad):
    """The error names the flag the user typed, not SamplingParams' field 'max_tokens'."""
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "--max-tokens", bad)
    assert code == 2 and "argument --max-tokens" in err and ">= 1" in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("content", [
    "precious notes\n", "{}", '{"messages": 3}', "[1, 2]",
    # an OpenAI request body, and a file with settings beside an empty list: "messages" alone
    # made them transcripts, and /save dropped their other keys (a bad-input trial, 2026-12-06)
    '{"model": "flint-nano", "messages": [{"role": "user", "content": "hi"}], '
    '"max_tokens": 64, "note": "my curl body"}',
    '{"messages": [], "settings": {"theme": "dark"}}'])
def test_save_transcript_never_replaces_a_file_that_is_not_one(tmp_path, content):
    """/save onto an existing file that is not a chat transcript is refused and the file kept
    (bad-input trial: /save precious.txt replaced it and said so afterwards)."""
    path = tmp_path / "precious.txt"
    path.write_text(content)
    with pytest.raises(FlintError, match="not a chat transcript"):
        save_transcript(path, [{"role": "user", "content": "hi"}])
    assert path.read_text() == content
    replaced = []
    save_transcript(tmp_path / "t.json", [{"role": "user", "content": "a"}])
    save_transcript(tmp_path / "t.json", [{"role": "user", "content": "a"},
                                          {"role": "assistant", "content": "b"}], replaced)
    assert replaced == [True]  # its own transcript, grown, is replaced, and reported


@pytest.mark.parametrize("later", [[], [{"role": "user", "content": "b"}]],
                         ids=["empty", "another"])
def test_save_never_replaces_a_transcript_it_would_lose_messages_of(tmp_path, later):
    """Bad-input trial: a new chat's /save (no messages yet) through a symlink to an earlier
    transcript replaced its 2 messages with none, and said "replaced the existing file". A
    transcript is now replaced only by one that begins with all its messages."""
    path = tmp_path / "t1.json"
    first = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    save_transcript(path, first)
    (tmp_path / "link.json").symlink_to(path)
    for name in ("t1.json", "link.json"):
        with pytest.raises(FlintError, match="holds a transcript of 2 messages that this chat's"):
            save_transcript(tmp_path / name, later)
    assert json.loads(path.read_text())["messages"] == first


TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("before, now", [([TOOL], None), (None, [TOOL]),
                                          ([TOOL], [TOOL, {**TOOL, "function": {"name": "b"}}])],
                         ids=["tools-dropped", "tools-added", "tools-changed"])
def test_save_never_replaces_a_transcript_of_a_chat_with_other_tools(tmp_path, before, now):
    """Bad-input trial (2026-12-06): `Hi` then `/save tt.json` in a chat with --tools, then the
    same in a chat without tools, replaced the file and dropped its 4 tools. The tools are part
    of the conversation: a transcript is replaced only by one declaring the same tools."""
    path = tmp_path / "tt.json"
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    save_transcript(path, msgs, tools=before)
    kept = path.read_text()
    with pytest.raises(FlintError, match="a chat with other tools"):
        save_transcript(path, msgs, tools=now)
    assert path.read_text() == kept
    replaced = []
    save_transcript(path, msgs + [{"role": "user", "content": "more"}], replaced, tools=before)
    assert replaced == [True]  # the same tools, grown: still replaced


def test_save_never_replaces_a_file_whose_tools_are_not_a_list(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"messages": [], "tools": 5}')
    with pytest.raises(FlintError, match="not a chat transcript"):
        save_transcript(path, [{"role": "user", "content": "hi"}])
    assert path.read_text() == '{"messages": [], "tools": 5}'


def test_huge_tool_definitions_are_named_not_the_prompt(tiny_llm):
    """A short message with a huge tool description: the error says the tool definitions are
    what does not fit (bad-input trial: it blamed a 2-character prompt)."""
    from flint_graph.errors import ContextLengthError

    limit = tiny_llm.engine.context_limit * tiny_llm.tokenizer.max_token_chars
    big = [{"type": "function", "function": {"name": "big", "description": "x" * (limit + 1)}}]
    with pytest.raises(ContextLengthError, match="its messages 2, the tool definitions about"):
        tiny_llm.chat([{"role": "user", "content": "hi"}], tools=big)


@pytest.mark.parametrize("tool, found", [(1, "found int"), ("a", "found str"),
                                         (None, "found null")])
def test_a_tool_that_is_no_object_is_named_as_such(tool, found):
    from flint_graph.chat.chat_messages import validate_tools
    from flint_graph.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match=rf"tools\[0\]: expected a tool object.*{found}"):
        validate_tools([tool])


@pytest.mark.parametrize("host, url", [("127.0.0.1", "http://127.0.0.1:8000"),
                                       ("::1", "http://[::1]:8000"), ("::", "http://[::]:8000"),
                                       ("localhost", "http://localhost:8000")])
def test_serve_logs_a_url_an_ipv6_host_can_be_reached_at(host, url):
    from flint_graph.cli import base_url

    assert base_url(host, 8000) == url


@pytest.mark.parametrize("flag", ["--api-key", "--served-model-name"])
def test_serve_refuses_an_empty_key_or_name(flag, capsys):
    """An empty --api-key started a server that answered 401 to every request."""
    code, _, err = _run(capsys, "serve", flag, " ")
    assert code == 2 and f"argument {flag}: expected a non-empty value" in err


@pytest.mark.parametrize("name,found", [("a\nb", "'\\n'"), ("tab\there", "'\\t'"),
                                        ("x\x7f", "'\\x7f'"), ("c1\x85", "'\\x85'")])
def test_serve_refuses_a_name_with_a_control_character(name, found, capsys):
    """A bad-input trial (2026-12-06): `--served-model-name $'a\\nb'` was served, but
    `GET /v1/models/a%0Ab` found no route. Names with spaces, slashes and non-ASCII letters
    stay allowed."""
    code, _, err = _run(capsys, "serve", "--served-model-name", name)
    assert code == 2 and "argument --served-model-name: a control character" in err
    assert found in err, err


@pytest.mark.parametrize("key,found", [("sk-ключ", "'к'"), ("sk 1", "' '"), ("sk\t1", "'\\t'")])
def test_serve_refuses_a_key_no_header_can_carry(key, found, capsys):
    """A non-ASCII --api-key started a server whose key no request could send (headers are
    read as Latin-1; OpenAI's client refuses non-ASCII ones): every request got 401."""
    code, _, err = _run(capsys, "serve", "--api-key", key)
    assert code == 2 and "argument --api-key: expected printable ASCII" in err and found in err


def test_chat_refuses_a_tools_file_with_a_bad_type_at_start(capsys, tmp_path, tiny_ckpt):
    """The bad-input trial: the banner said "1 tool", then every message failed on the schema,
    without naming the file."""
    bad = tmp_path / "badtools.json"
    bad.write_text(json.dumps([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "int"}}}}}]))
    for cmd in (["chat"], ["generate", "--prompt", "hi"]):
        code, _, err = _run(capsys, *cmd, tiny_ckpt, "--tools", bad)
        assert code == 2 and "badtools.json: tools[0] 'f': parameters.properties.a.type is " \
            '"int"' in err, err


def test_chat_refuses_tools_that_leave_no_room_at_start(capsys, tmp_path, tiny_ckpt):
    """60 long tools overflowed the context: every message failed, and the chat told the user
    to shorten their "hi". Now chat refuses the file at start-up with both numbers."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "word " * 200,
                                                "parameters": {"type": "object"}}}
             for i in range(30)]
    big = tmp_path / "bigtools.json"
    big.write_text(json.dumps(tools))
    code, _, err = _run(capsys, "chat", tiny_ckpt, "--tools", big)
    assert code == 2 and "bigtools.json: the tool definitions take at least" in err, err
    assert "4,096-token context, leaving no room for a conversation" in err
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--tools", big)
    assert code == 2 and "the tool definitions about 3" in err, err


def test_tools_file_errors_speak_json_and_a_bom_is_read(capsys, tmp_path, tiny_ckpt):
    """A bad-input trial (2026-12-05): a tools file holding one tool object said "found dict",
    `null` "found NoneType", a NaN maximum "nan is not a JSON number", and a file beginning
    with a UTF-8 byte-order mark (as Windows editors save) was refused with Python's hint."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = {"one.json": (json.dumps(tool), "found object (one tool: put it in a list)"),
             "null.json": ("null", "found null"),
             "nan.json": ('[{"type": "function", "function": {"name": "f", "parameters": '
                          '{"type": "object", "properties": {"a": {"type": "number", '
                          '"maximum": NaN}}}}}]', "NaN is not a JSON number")}
    for name, (text, want) in cases.items():
        (tmp_path / name).write_text(text)
        code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi",
                            "--tools", tmp_path / name)
        assert code == 2 and want in err and "NoneType" not in err and "dict" not in err, err
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps([tool]).encode())
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", "1",
                        "--tools", bom)
    assert code == 0, err


def test_a_key_given_twice_in_a_tools_file_is_named(capsys, tmp_path, tiny_ckpt):
    """A bad-input trial (2026-12-06): a second "name" inside tools[0] silently replaced the
    first, and the clash was reported as "tools[3].function.name: duplicate tool name"."""
    path = tmp_path / "dup.json"
    path.write_text('[{"type": "function", "function": {"name": "a", "name": "lookup", '
                    '"parameters": {"type": "object"}}}, {"type": "function", "function": '
                    '{"name": "lookup", "parameters": {"type": "object"}}}]')
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--tools", path)
    assert code == 2 and "the key 'name' appears twice in one object" in err, err
    assert "duplicate tool name" not in err


def test_a_prompt_given_as_model_says_so(capsys, monkeypatch):
    """A new user's trial (2026-12-05): `generate "What is 2 plus 2?"` from a script (empty
    stdin) said "prompt: expected non-empty text", on a terminal "no prompt: pass --prompt";
    the words had been read as MODEL. The missing checkpoint is now named first, with the
    hint; a path-like MODEL gets no hint."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    code, _, err = _run(capsys, "generate", "What is 2 plus 2?")
    assert code == 2 and "What is 2 plus 2?: no such checkpoint" in err, err
    assert "if that was the prompt, pass it with --prompt TEXT" in err
    code, _, err = _run(capsys, "generate", "models/flint.gguf", "--prompt", "hi")
    assert code == 2 and "no such checkpoint" in err and "if that was the prompt" not in err


def test_serve_without_its_extra_names_this_interpreters_pip(capsys, monkeypatch):
    """A new user's trial (2026-12-05): the hint said `pip install -e '.[serve]'`, which on a
    usual shell installs outside .venv; it now names this interpreter's pip."""
    import builtins
    import sys

    real = builtins.__import__

    def no_uvicorn(name, *a, **k):
        if name == "uvicorn":
            err = ImportError("No module named 'uvicorn'")
            err.name = "uvicorn"
            raise err
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_uvicorn)
    code, _, err = _run(capsys, "serve")
    assert code == 2 and f"{sys.executable} -m pip install -e '.[serve]'" in err, err


def test_generate_prints_a_tool_call_on_its_own_line_without_blank_ones(
        capsys, monkeypatch, tiny_llm, tiny_ckpt, tmp_path):
    """A new user's trial (2026-12-05): stdout was "\\n[tool call] convert_units {...}\\n\\n",
    an empty first line for a script to skip. Now one line per call, after any text on a line
    of its own, and one line end at the end."""
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {
        "name": "convert_units", "parameters": {"type": "object", "properties": {
            "value": {"type": "number"}}}}}]))
    call = "<tool_call>convert_units<arg_key>value</arg_key><arg_value>120</arg_value></tool_call>"
    argv = ("generate", tiny_ckpt, "--prompt", "Convert 120 km to mi.", "--max-tokens", 100,
            "--device", "cpu", "--tools", tools)
    for text, want in ((f"x</think>{call}<|observation|>",
                        '[tool call] convert_units {"value": 120}\n'),
                       (f"x</think>Sure.{call}<|observation|>",
                        'Sure.\n[tool call] convert_units {"value": 120}\n'),
                       ("x</think>74.56 mi<|user|>", "74.56 mi\n")):
        monkeypatch.setattr("flint_graph.runtime.engine.sample",
                            scripted_sampler(tiny_llm.tokenizer.encode(text)))
        code, out, err = _run(capsys, *argv)
        assert code == 0 and out == want, (out, err)


def test_interrupted_writes_no_empty_line_where_stderr_is_not_a_terminal(capsys, monkeypatch,
                                                                          tiny_ckpt):
    """A new user's trial (2026-12-05): Ctrl-C in a piped `generate` printed an empty line on
    stderr before "flint-graph: interrupted" (the line end is for a terminal's echoed ^C)."""
    import flint_graph.cli as cli

    def interrupt(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "load_llm", interrupt)
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi")
    assert code == 130 and err == "flint-graph: interrupted\n", repr(err)


def test_dir_of_the_package_lists_its_lazy_names():
    import flint_graph

    assert {"LLM", "SamplingParams", "ChatMessage", "GenerationOutput"} <= set(dir(flint_graph))


@pytest.mark.parametrize("text", ["٣", "1_0", "", "-", "+-3", "3.0", "0x10"])
def test_integer_flags_take_plain_ascii_digits(text):
    """A bad-input trial (2026-12-05): `--seed ٣` and `--max-tokens 1_0` were accepted (int()
    reads Unicode digits and underscores). Plain digits with an optional sign only."""
    from flint_graph.cli_args import integer

    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer, got"):
        integer(text)
    assert integer(" +12 ") == 12 and integer("-3") == -3


def test_the_console_script_freezes_start_ups_objects_and_callers_do_not(tiny_ckpt, monkeypatch,
                                                                         capsys):
    """`flint-graph` (main() with argv None) moves start-up's objects out of the collector's
    reach once the LLM is loaded (flint_graph/runtime/gc_policy.py: a full collection took
    125 ms mid-load otherwise); main(argv) from a test or a program changes nothing."""
    import flint_graph.runtime.gc_policy as policy

    calls = []
    monkeypatch.setattr(policy, "freeze_startup_objects", lambda: calls.append(1))
    argv = ["generate", str(tiny_ckpt), "--prompt", "hi", "--max-tokens", "2", "--device", "cpu"]
    assert main(argv) == 0 and calls == []
    monkeypatch.setattr("sys.argv", ["flint-graph", *argv])
    assert main() == 0 and calls == [1]
    capsys.readouterr()


def test_freeze_startup_objects_moves_the_survivors_to_the_permanent_generation():
    import gc

    from flint_graph.runtime.gc_policy import freeze_startup_objects

    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()


def test_ctrl_c_after_half_a_line_starts_the_message_on_its_own_line(capsys, monkeypatch,
                                                                     tiny_llm, tiny_ckpt):
    """A bad-input trial (2026-12-05): with stderr not a terminal, Ctrl-C after part of the
    reasoning (stderr) printed "457 + 3flint-graph: interrupted"."""
    script = scripted_sampler(tiny_llm.tokenizer.encode("457 + 3 is"))

    def sampler(logits, temperature, top_k, top_p, seeds, positions):
        if int(positions[0]) == 3:
            raise KeyboardInterrupt
        return script(logits, temperature, top_k, top_p, seeds, positions)

    monkeypatch.setattr("flint_graph.runtime.engine.sample", sampler)
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--device", "cpu")
    assert code == 130 and err.endswith("\nflint-graph: interrupted\n"), repr(err)
    assert err.count("\n") == 2 and not err.startswith("\n"), repr(err)


def test_no_pipeline_on_the_reference_engine_says_it_changes_nothing(capsys, tiny_ckpt):
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", 2,
                        "--device", "cpu", "--no-pipeline")
    assert code == 0
    assert ("flint-graph: note: --no-pipeline concerns the graph engine's decode steps; the "
            "reference engine running here decodes one step at a time anyway") in err, err


def test_no_prefill_dense_bf16_on_the_reference_engine_says_it_changes_nothing(capsys,
                                                                              tiny_ckpt):
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--max-tokens", 2,
                        "--device", "cpu", "--no-prefill-dense-bf16")
    assert code == 0
    assert ("flint-graph: note: --no-prefill-dense-bf16 concerns the graph engine's prefill "
            "of NVFP4 checkpoints; the reference engine running here keeps no such copy, so it "
            "changes nothing") in err, err


@pytest.mark.parametrize("option", ["--tools", "--max-tokens", "--seed"])
def test_an_option_given_as_double_dash_is_refused(capsys, option):
    """`--tools=--` reached the code as an empty list (argparse drops the `--` unchecked) and
    ended in an internal error (a bad-input trial, 2026-12-06): refused, naming the option."""
    code, _, err = _run(capsys, "generate", "--prompt", "hi", f"{option}=--")
    assert code == 2 and f"{option}: expected a value, found '--'" in err, err


def test_missing_tools_and_config_paths_say_what_was_expected(capsys, tmp_path):
    """A new user's trial (2026-12-06): a missing tools file or --hf-config-path named only
    what was missing; both now say what the path should hold."""
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "--tools", tmp_path / "no.json")
    assert code == 2 and "tools file not found; a tools file is a JSON list" in err, err
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "--hf-config-path",
                        tmp_path / "nodir")
    assert code == 2 and "does not exist; expected a directory with config.json" in err, err


def test_a_relative_tools_path_says_where_it_was_looked_for(capsys, tmp_path, monkeypatch):
    """A new user's trial (2026-12-06): `scripts/chat.sh --tools examples/tools.json` from
    another directory suggested the very path that had failed."""
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "--tools", "examples/tools.json")
    assert code == 2 and f"looked for {tmp_path / 'examples/tools.json'}" in err, err
    assert "relative path is taken from the current directory" in err, err


def test_an_answer_cut_by_max_tokens_is_noted(capsys, tiny_ckpt):
    """A new user's trial (2026-12-06): an answer (not reasoning) cut off by --max-tokens
    ended mid-line with nothing on stderr; only --json said finish_reason "length"."""
    code, out, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--raw",
                          "--max-tokens", "3", "--temperature", "0",
                          "--device", "cpu")
    assert code == 0 and "max tokens (3) ended the answer early; raise --max-tokens" in err, err


def test_an_unreadable_checkpoint_file_is_a_clean_error(capsys, tiny_ckpt, monkeypatch):
    """A bad-input trial (2026-12-06): a mode-000 safetensors shard (or index, or directory)
    ended in "internal error: PermissionError", exit 1. Root reads any file, so the reader is
    made to fail as it does for another user."""
    from flint_graph.checkpoints import hf_checkpoint

    def denied(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(hf_checkpoint, "read_safetensors_header", denied)
    code, _, err = _run(capsys, "generate", tiny_ckpt, "--prompt", "hi", "--device", "cpu")
    assert code == 2 and "cannot read it (permission denied)" in err, err
    assert "internal error" not in err and ".safetensors" in err, err


def test_hf_config_path_without_a_model_is_refused(capsys, tmp_path):
    """A bad-input trial (2026-12-06): `generate --hf-config-path DIR` without MODEL put DIR's
    config on the embedded flint-nano and failed on a tensor shape, not naming the flag."""
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "--hf-config-path", tmp_path)
    assert code == 2 and "--hf-config-path" in err and "give MODEL too" in err, err


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "eval", "bench", "trace"])
@pytest.mark.parametrize("argv, words", [
    ([""], "argument MODEL: expected a BF16 checkpoint directory or an NVFP4 .gguf file"),
    (["--hf-config-path", "", "x.gguf"],
     "argument --hf-config-path: expected a directory holding config.json")],
    ids=["model", "hf-config-path"])
def test_empty_paths_are_refused_by_the_flag_they_came_from(capsys, monkeypatch, tmp_path,
                                                             command, argv, words):
    """A bad-input trial (2026-12-06): `eval ''` read '' as the working directory and evaluated
    the GGUF that sat there, `generate ''` answered "(or None for the embedded default)" and
    `--hf-config-path ''` named the API's hf_config_path."""
    if argv[0] == "--hf-config-path" and command in ("bench", "trace"):
        pytest.skip("bench and trace take no --hf-config-path")
    monkeypatch.chdir(tmp_path)
    assert main([command, *argv]) == 2
    assert words in capsys.readouterr().err


def test_an_empty_model_file_is_called_empty(tmp_path, capsys):
    empty = tmp_path / "model.gguf"
    empty.write_bytes(b"")
    assert main(["generate", str(empty), "--prompt", "hi"]) == 2
    assert f"{empty}: not a GGUF file (empty, expected b'GGUF')" in capsys.readouterr().err


@pytest.mark.parametrize("columns", ["0", "-3", " ", "abc", "9" * 5000, "１２０"])
def test_a_terminal_width_that_is_no_positive_number_is_ignored(capsys, tmp_path, monkeypatch,
                                                                columns):
    """COLUMNS=0 made rich print nothing at all: the chat's prompt and answers, eval's report,
    make-checkpoint's summary (a bad-input trial, 2026-12-06). Unset instead, as shutil does."""
    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = _run(capsys, "make-checkpoint", "--preset", "tiny", "--out",
                          tmp_path / "ck", "--device", "cpu", "--no-progress")
    assert code == 0, err
    assert "wrote" in out and "config.json" in out, out


@pytest.mark.parametrize("text, want", [
    ("12", 12), (" 7 ", 7), ("0", 0), ("9" * 18, int("9" * 18)), ("9" * 19, None),
    ("9" * 5000, None), ("１２", None), ("1_0", None), ("٣", None), ("-1", None), ("", None),
    ("+3", None), ("0x10", None)])
def test_plain_int_takes_plain_bounded_digits_only(text, want):
    """The tools' integer rule (a bad-input trial, 2026-12-07: 5,000 digits made int() itself
    raise, a traceback, in tools that had checked the text was digits)."""
    from flint_graph.cli_args import plain_int, plain_int_or_none

    assert plain_int_or_none(text) == want
    if want is None:
        with pytest.raises(ValueError) as e:
            plain_int(text)
        assert len(str(e.value)) < 200  # the value cut short, not echoed whole


def test_shown_cuts_long_values_and_names_their_length():
    from flint_graph.cli_args import shown

    assert shown("abc") == "'abc'"
    long = shown("x" * 30_000)
    assert long.startswith("'xxxx") and "(30,000 characters)" in long and len(long) < 80


@pytest.mark.parametrize("model, want", [
    (None, "flint-nano"), ("/ck/flint-40b", "flint-40b"), ("/ck/flint.gguf", "flint"),
    ("/ck/bad\nname\x1b[31mRED", "bad_name_[31mRED"), ("/ck/\x07", "flint-nano"),
    ("/ck/caf\u00e9\u0085x", "caf\u00e9_x"),
])
def test_the_default_served_name_has_no_control_character(model, want):
    """serve's default model id came from the directory name as it was: a newline and an
    escape reached /v1/models, which --served-model-name refuses (a bad-input trial,
    2026-12-06)."""
    from flint_graph.cli import default_served_name
    from flint_graph.cli_args import served_name

    assert default_served_name(model) == want
    assert served_name(want) == want


LONG = "x" * 300  # a name part past the file systems' 255 bytes


@pytest.mark.parametrize("argv, flag", [
    (["generate", LONG, "--prompt", "hi"], "MODEL"),
    (["generate", f"/tmp/{LONG}/x", "--prompt", "hi"], "MODEL"),
    (["serve", LONG], "MODEL"),
    (["eval", LONG], "MODEL"),
    (["bench", LONG], "MODEL"),
    (["generate", "--hf-config-path", LONG, "--prompt", "hi"], "--hf-config-path"),
    (["chat", "--tools", f"/tmp/{LONG}"], "--tools"),
    (["make-checkpoint", "--out", f"/tmp/{LONG}"], "--out"),
    (["make-checkpoint", "--config", LONG, "--out", "/tmp/x"], "--config"),
    (["bench", "--json", f"/tmp/{LONG}.json"], "--json"),
    (["trace", "--html", f"/tmp/{LONG}.html"], "--html"),
    (["eval", "--compare", LONG], "--compare"),
    # a missing directory before it: the lookup said "no such file" first, so an eval ran an
    # hour and then could not write its figures (a re-trial, 2026-12-07)
    (["eval", "--json", f"/tmp/missing-dir/{LONG}", "--n", "1"], "--json"),
    (["trace", "--out", f"/tmp/missing-dir/{LONG}.json"], "--out"),
    (["make-checkpoint", "--out", f"/tmp/missing-dir/{LONG}"], "--out"),
    (["generate", "/tmp/x/" + "y/" * 2100, "--prompt", "hi"], "MODEL"),  # 4,206 bytes
])
def test_a_path_no_file_system_takes_is_a_one_line_error_naming_its_flag(capsys, argv, flag):
    """A bad-input trial (2026-12-07): a 300-character name (and a NUL, and a directory that
    may not be searched) was "internal error: OSError: [Errno 36] File name too long" from
    Path.exists() in seven places. Every path flag refuses it, naming the flag."""
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    assert f"argument {flag}: " in err and "too long for the file system" in err, err
    assert "internal error" not in err and err.count("\n") == 1


def test_a_nul_or_an_unsearchable_directory_in_a_path_is_named(capsys):
    from flint_graph.paths import name_problem

    assert "NUL" in name_problem("ba\0se")
    if name_problem("/proc/1/root") is None:  # a machine where this user may look it up
        return
    code, _, err = _run(capsys, "generate", "/proc/1/root", "--prompt", "hi")
    assert code == 2 and "argument MODEL: /proc/1/root: permission denied looking it up" in err


@pytest.mark.parametrize("command", ["chat", "generate", "serve"])
def test_help_lists_the_engine_flags_last(capsys, command):
    """A new user's trial (2026-12-07): ~100 lines of help with the GPU engine's flags before
    --tools, --no-think and sampling. Those come first now, the engine's group last."""
    code, text, _ = _run(capsys, command, "--help")
    assert code == 0
    engine = text.index("\nengine:")
    assert engine > text.index("--device") and "--prefill-chunk" in text[engine:]
    for flag in (["--tools", "--no-think", "--max-tokens"] if command != "serve" else
                 ["--host", "--port", "--api-key"]):
        assert text.index(flag) < engine, flag


_TERM_DURING_START_UP = """
import importlib, os, signal, sys
from flint_graph import cli, cli_args
when = sys.argv.pop(1)
def term():
    os.kill(os.getpid(), signal.SIGTERM)
if when == "imports":  # a command's start-up imports
    real = importlib.import_module
    def import_module(name, *a):
        if name == "flint_graph.api":
            term()
        return real(name, *a)
    cli.importlib.import_module = import_module
elif when == "parser":  # before its arguments are parsed
    real_parser = cli_args.build_parser
    def build_parser():
        term()
        return real_parser()
    cli_args.build_parser = build_parser
else:  # the model's load (chat: tens of seconds for a real checkpoint)
    def load_llm(args):
        term()
        raise AssertionError("SIGTERM did not end the load")
    cli.load_llm = load_llm
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("when, command, code, line", [
    ("imports", "serve", 0, "flint-graph: stopped (SIGTERM) while starting"),
    ("parser", "serve", 0, "flint-graph: stopped (SIGTERM) while starting"),
    ("imports", "generate", 143, "flint-graph: terminated"),
    ("imports", "chat", 143, "flint-graph: terminated"),
    ("load", "chat", 143, "flint-graph: terminated"),
])
def test_sigterm_during_start_up_ends_with_a_word(tmp_path, when, command, code, line):
    # A bad-input trial (2026-12-07): SIGTERM in serve's first second (its imports, before
    # its own handler) killed the process by the signal without a word; serve treats SIGTERM
    # as a stop request (exit 0) once running, so it does while starting too. Its re-trial:
    # before the arguments were parsed serve said "terminated" (143), and chat died silently
    # during its model's load.
    import subprocess
    import sys

    model = [] if when == "load" else [str(tmp_path / "missing.gguf")]
    p = subprocess.run([sys.executable, "-c", _TERM_DURING_START_UP, when, command, *model,
                        *(["--device", "cpu"] if when == "load" else [])],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == code, p.stderr[-800:]
    assert p.stderr.strip().splitlines()[-1] == line, p.stderr[-800:]


def test_a_stray_word_read_as_model_is_named_so(capsys):
    # A new user's trial (2026-12-07): `generate --prompt hi extra` said "extra: no such
    # checkpoint …", correct but puzzling; a bare word is now said to be read as MODEL
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "extra")
    assert code == 2 and "extra: no such checkpoint" in err and "read as MODEL" in err, err
    code, _, err = _run(capsys, "generate", "--prompt", "hi", "/no/such/model.gguf")
    assert code == 2 and "read as MODEL" not in err, err
    for command in ("chat", "serve", "eval"):  # their words too (a re-trial: eval had none)
        code, _, err = _run(capsys, command, "extra")
        assert code == 2 and "extra: no such checkpoint" in err and "read as MODEL" in err \
            and "--prompt" not in err, (command, err)


def test_trace_engine_graph_on_the_cpu_is_refused_without_the_reference_note(capsys):
    """A bad-input trial (2026-12-07): `trace --engine graph` on a CPU first noted that the
    trace was the reference engine's, then refused to run the graph engine; bench refused at
    once. Both refuse before any note now."""
    code, _, err = _run(capsys, "trace", "--engine", "graph", "--device", "cpu")
    assert code == 2, err
    assert "the graph engine needs CUDA" in err and "note:" not in err, err
