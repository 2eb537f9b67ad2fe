"""The `flint-graph` command: chat, generate, make-checkpoint, build-kernels, bench, trace,
eval.

Each subcommand parses its flags (`cli_args`), builds the public API objects and prints. Bad
input ends in one line on stderr and exit status 2, never a traceback (set FLINT_GRAPH_DEBUG=1
to see one for an unexpected internal error); Ctrl-C ends in `flint-graph: interrupted`, 130.
SIGTERM during generate, make-checkpoint, eval, bench, trace and build-kernels runs the same
cleanups (partial output removed, a request aborted and its `--json` output still printed) and
ends in `flint-graph: terminated`, 143.

Start-up is split in two. While the flags are parsed and the heavy modules (torch, ...) are
imported, Ctrl-C ends the process at once: a KeyboardInterrupt raised inside an import can be
swallowed by C code (the command then runs on) or leave an extension module half-initialised
(numpy then fails with "cannot load module more than once per process"). Once everything is
imported, Ctrl-C raises KeyboardInterrupt as usual, so partial checkpoints and requests are
cleaned up. This module imports nothing heavy itself, so `--version` and `--help` are instant
and the console script reaches `main` within a millisecond or so.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import signal
import shlex
import sys
import time

from flint_graph.errors import FlintError, InvalidRequestError, kind, not_utf8, terminal_safe
from flint_graph.terminal.stderr_stream import install as install_quiet_stderr

TYPE_CHECKING = False  # typing itself takes milliseconds to import; checkers know this name
if TYPE_CHECKING:
    import argparse
    from pathlib import Path
    from typing import Any

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
INTERRUPTED = "flint-graph: interrupted"
EXIT_TERMINATED = 128 + signal.SIGTERM


# commands whose SIGTERM (`timeout`, `kill`, a job scheduler) runs the cleanups Ctrl-C runs:
# partial checkpoints and unpacked directories removed, a request aborted and reported (a
# bad-input trial, 2026-12-06: SIGTERM left `.ck.tmp-*` and `.partial-*` directories behind);
# chat keeps the default (its Ctrl-C handling goes on chatting), serve has its own
TERM_ENDS_LIKE_CTRL_C = ("generate", "make-checkpoint", "eval", "bench", "trace",
                         "build-kernels")


class Terminated(KeyboardInterrupt):
    """SIGTERM while a TERM_ENDS_LIKE_CTRL_C command runs: ended as Ctrl-C ends it (partial
    output removed; a request aborted, `--json` still printing its output), then exit 128 + 15
    with `flint-graph: terminated`. Without it a `timeout` or `kill` left a `--json` caller
    nothing to read and partial directories behind (bad-input trials, 2026-12-06)."""


# a write that failed for the machine's state, not ours: no space, over quota, an I/O error
OUTPUT_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `flint-graph` console script; returns the exit code."""
    previous = previous_term = None
    if sys.stderr is None:  # `2>&-`: its messages go nowhere, as asked (input() needs one)
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # `>&-`: an answer would be lost after all the work
        print("flint-graph: error: standard output is closed; redirect it to a file or "
              "/dev/null", file=sys.stderr)
        return EXIT_BAD_INPUT
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure") \
            and "utf" not in (sys.stdout.encoding or "").lower():
        # an answer in characters stdout's encoding lacks (PYTHONIOENCODING=ascii, a C locale)
        # was an internal error after all the work (a bad-input trial, 2026-12-06): escaped
        # instead, as Python's stderr does
        sys.stdout.reconfigure(errors="backslashreplace")
    for name in ("COLUMNS", "LINES"):
        # rich takes COLUMNS=0 as a width of 0 and printed nothing (the chat's prompt and
        # answers, eval's report, make-checkpoint's summary: a bad-input trial, 2026-12-06);
        # a size that is not a positive number is unset, as shutil.get_terminal_size treats it
        value = os.environ.get(name)
        if value is not None:
            from flint_graph.cli_args import plain_int_or_none  # its digits rule and bound

            if not (plain_int_or_none(value) or 0) > 0:
                del os.environ[name]
    stack = contextlib.ExitStack()
    stderr = install_quiet_stderr()  # stderr's reader leaving must not end the command
    try:
        previous = _exit_on_sigint()  # first statement: Ctrl-C from here on ends cleanly
        # and SIGTERM; the command's first word names it before the parser is built (a
        # SIGTERM to serve 0.1 s in said "terminated", exit 143: a re-trial, 2026-12-07)
        _STARTING["command"] = next((a for a in (sys.argv[1:] if argv is None else argv)
                                     if not a.startswith("-")), "")
        previous_term = _exit_on_sigterm()
        _STARTING["previous"] = previous_term
        t_entry = time.perf_counter()  # bench measures cold start from here
        from flint_graph.cli_args import build_parser

        parser = build_parser()
        args = parser.parse_args(argv)
        from flint_graph.cli_args import given_dests

        args.given = given_dests(sys.argv[1:] if argv is None else list(argv))
        if getattr(args, "command", None) is None:
            # a usage error, one line as every other (README); --help prints the whole help
            print(f"flint-graph: error: no command given; expected one of "
                  f"{', '.join(COMMANDS)} (flint-graph --help explains them)", file=sys.stderr)
            return EXIT_BAD_INPUT
        run, modules = COMMANDS[args.command]
        _STARTING["command"] = args.command
        for name in modules:
            importlib.import_module(name)
        _restore_sigint(previous)  # from here Ctrl-C raises KeyboardInterrupt: cleanups run
        if args.command in TERM_ENDS_LIKE_CTRL_C:
            stack.enter_context(_sigterm_raises())
        # serve's start-up ends at once until it is listening, chat's until its model is
        # loaded (`start_up_over`: it died by the signal, without a word, during a load of
        # tens of seconds; a re-trial, 2026-12-07)
        args.t_entry = t_entry
        # the console script (argv None) owns its process; a caller passing argv (tests, a
        # program of its own) keeps its objects under the collector as they were
        args.freeze_gc = argv is None
        return run(args)
    except SystemExit as e:  # argparse: --help, --version (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 1
    except FlintError as e:
        print(f"flint-graph: error: {terminal_safe(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Terminated:
        print("flint-graph: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        # on a terminal the line holds the echoed ^C (and maybe half an answer); a log or a
        # pipe got an empty line (a new user's trial)
        print(("\n" if _isatty(sys.stderr) else "") + INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `flint-graph generate ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        if e.errno not in OUTPUT_FULL_ERRNOS or os.environ.get("FLINT_GRAPH_DEBUG"):
            return _internal_error(e)
        # `> /dev/full`, a full disk or quota: the machine's state, not a bug (it was
        # "internal error: OSError", a bad-input trial of 2026-12-06)
        where = f" {e.filename}" if e.filename else " the output (standard output or a file)"
        print(f"flint-graph: error: cannot write{where}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # a bug of ours: still one line unless asked for the traceback
        return _internal_error(e)
    finally:
        stack.close()
        _restore_sigint(previous)
        _restore_sigterm(previous_term)
        _STARTING.clear()
        sys.stderr = stderr


def _internal_error(e: Exception) -> int:
    """One line for a bug of ours (the traceback with FLINT_GRAPH_DEBUG=1); exit code 1."""
    if os.environ.get("FLINT_GRAPH_DEBUG"):
        raise e
    print(f"flint-graph: internal error: {type(e).__name__}: {terminal_safe(str(e))} "
          "(set FLINT_GRAPH_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1


def _exit_on_sigint():
    """Make Ctrl-C end the process at once (start-up phase); returns the handler to restore,
    or None when SIGINT is left alone (ignored, as for a background job, or not the main
    thread of an embedding program)."""
    return _start_up_handler(signal.SIGINT, _exit_interrupted)


def _start_up_handler(signum, handler):
    """Install `handler` for `signum` unless the signal is ignored or this is not the main
    thread; returns the handler to restore, or None where the signal is left alone."""
    try:
        previous = signal.getsignal(signum)
        if previous in (signal.SIG_IGN, None):
            return None
        signal.signal(signum, handler)
        return previous
    except ValueError:  # signal handlers can only be set from the main thread
        return None


# the command being started ("command", for the start-up SIGTERM handler's words and status)
# and the SIGTERM handler to give back when its start-up is over ("previous")
_STARTING: dict = {}


def start_up_over() -> None:
    """A command's start-up is over (chat: its model loaded): SIGTERM gets back the handler it
    had before `main` (Python's default: the chat keeps it while it chats)."""
    _restore_sigterm(_STARTING.get("previous"))


def _exit_on_sigterm():
    """Make SIGTERM end the process at once during start-up, as `_exit_on_sigint` does Ctrl-C:
    `flint-graph: terminated`, exit 143, or for `serve` (a stop request, as its own handler
    treats it later) `flint-graph: stopped (SIGTERM) while starting`, exit 0. Without it a
    SIGTERM in serve's first second (its imports, before its handler) killed the process by
    the signal, with no word (a bad-input trial, 2026-12-07). Returns the handler to restore,
    or None where SIGTERM is left alone (ignored, or not the main thread)."""
    return _start_up_handler(signal.SIGTERM, _exit_terminated)


def _restore_sigterm(previous) -> None:
    if previous is not None and signal.getsignal(signal.SIGTERM) is _exit_terminated:
        signal.signal(signal.SIGTERM, previous)


def _exit_terminated(signum, frame) -> None:
    # Nothing that needs cleaning up exists yet: end here rather than raise into an import.
    serve = _STARTING.get("command") == "serve"
    try:
        os.write(2, b"flint-graph: stopped (SIGTERM) while starting\n" if serve
                 else b"flint-graph: terminated\n")
    finally:
        os._exit(0 if serve else EXIT_TERMINATED)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


def _same_file(a, b) -> bool:
    """Whether two streams write to the same file or pipe (`2>&1`)."""
    try:
        x, y = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, OSError, ValueError):  # replaced (tests) or closed
        return False
    return (x.st_dev, x.st_ino) == (y.st_dev, y.st_ino)


def _exit_interrupted(signum, frame) -> None:
    # Nothing that needs cleaning up exists yet: end here rather than raise into an import.
    try:
        os.write(2, ("\n" if os.isatty(2) else "").encode() + f"{INTERRUPTED}\n".encode())
    finally:
        os._exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def _on_sigterm(handler):
    """`handler(signum, frame)` handles SIGTERM for the block, in the main thread (elsewhere,
    an embedding program's handling stays)."""
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame):
    raise Terminated


def _sigterm_raises():
    """SIGTERM raises `Terminated` for the block."""
    return _on_sigterm(_raise_terminated)


@contextlib.contextmanager
def _sigterm_deferred():
    """A SIGTERM during the block is held until its end, then raised as `Terminated` (a
    finished `--json` answer was cut or lost when the signal came as it was printed)."""
    got = []
    with _on_sigterm(lambda signum, frame: got.append(signum)):
        yield
    if got:
        raise Terminated


def _restore_sigint(previous) -> None:
    if previous is not None and signal.getsignal(signal.SIGINT) is _exit_interrupted:
        signal.signal(signal.SIGINT, previous)


def base_url(host: str, port: int) -> str:
    """The server's URL for `serve`'s log lines: an IPv6 address in brackets (RFC 3986 §3.2.2:
    http://[::1]:8000; `--host ::1` printed http://::1:8000, a bad-input trial, 2026-12-06)."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def build_parser():
    """The argument parser with every subcommand (`cli_args.build_parser`, imported when
    called so that importing this module stays light)."""
    from flint_graph.cli_args import build_parser as build

    return build()


def sampling_params(args: argparse.Namespace):
    """SamplingParams from the sampling flags (unset flags take the checkpoint defaults)."""
    from flint_graph.runtime.sampling import SamplingParams

    try:
        return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                              stop=list(args.stop or []), stop_on_repeat=args.stop_on_repeat)
    except InvalidRequestError as e:
        if e.field is None:
            raise
        # name the flag the user typed, not the API field behind it
        raise InvalidRequestError(f"argument --{e.field.replace('_', '-')}: {e.detail} (see "
                                  f"flint-graph {args.command} --help)") from None


TOOLS_MAX_BYTES = 16 << 20  # a tools.json is a few KB; the HTTP server's body cap alike


def load_tools(path: Path | None) -> list[dict[str, Any]] | None:
    """Read a tools.json (a JSON list of OpenAI function tools); InvalidRequestError if bad."""
    if path is None:
        return None
    from flint_graph.checkpoints.jsonfile import read_capped

    try:  # capped: `--tools /dev/zero` read until 6.7 GB; a key given twice is named (json
        # kept the last: a second "name" in tools[0] was reported as a clash with tools[3])
        tools = read_capped(path, TOOLS_MAX_BYTES, unique_keys=True)
    except FileNotFoundError:
        from pathlib import Path

        path = Path(path)
        where = "" if path.is_absolute() else f" (looked for {Path.cwd() / path}: a relative " \
            "path is taken from the current directory)"
        example = Path(__file__).resolve().parent.parent / "examples" / "tools.json"
        raise InvalidRequestError(
            f"{path}: tools file not found{where}; a tools file is a JSON list of a few function "
            f"tools (e.g. {example if example.is_file() else 'examples/tools.json'})") from None
    except ValueError as e:
        raise InvalidRequestError(f"{path}: {e}; a tools file is a JSON list of a few function "
                                  "tools") from None
    except OSError as e:
        raise InvalidRequestError(f"{path}: cannot read tools file ({e})") from None
    from flint_graph.chat.chat_template import validate_tools

    if not isinstance(tools, list):
        one = " (one tool: put it in a list)" if isinstance(tools, dict) and "type" in tools \
            else ""
        raise InvalidRequestError(f"{path}: expected a JSON list of tools, found "
                                  f"{kind(tools)}{one}")
    from flint_graph.chat.tool_schema import tool_schemas

    try:  # the schemas too (a type like "int"), or every message would fail on them
        validate_tools(tools)
        tool_schemas(tools)
    except InvalidRequestError as e:
        raise InvalidRequestError(f"{path}: {e}") from None
    return tools


def check_model_path(model: str | None) -> None:
    """Refuse a MODEL path that is not there before anything loads, saying what is there."""
    from pathlib import Path

    if model is not None and not Path(model).exists():
        from flint_graph.paths import why_not_a_file

        # `generate "What is 2 plus 2?"` reads the words as MODEL (a new user's trial)
        prompt_like = " " in model.strip() or model.rstrip().endswith(("?", "!"))
        # `generate --prompt hi extra` read "extra" as MODEL with no word of why (a new
        # user's trial, 2026-12-07): a bare word that is not a path is named as MODEL
        bare = not prompt_like and not any(c in model for c in "/\\.")
        hint = ("; if that was the prompt, pass it with --prompt TEXT or on stdin (the first "
                "word after the command is MODEL)") if prompt_like else (
                "; it was read as MODEL, the checkpoint (the one word a command takes "
                "outside its options; without it the embedded flint-nano runs)"
                if bare else "")
        raise InvalidRequestError(f"{model}: no such checkpoint, {why_not_a_file(Path(model))} "
                                  "(expected a BF16 checkpoint directory or an NVFP4 .gguf "
                                  f"file){hint}")


def check_tools_fit(llm, tools: list[dict[str, Any]] | None, path: Path | None,
                    system: str | None = None) -> None:
    """Refuse at start-up a tools file whose definitions (with the system prompt) leave no
    room in the context: the chat would otherwise fail every message, telling the user to
    shorten a "hi". Raises InvalidRequestError naming the file and both numbers."""
    if not tools:
        return
    from flint_graph.chat.tokenizer import TooManyTokens
    from flint_graph.errors import ContextLengthError

    limit = llm.engine.context_limit
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": "hi"}]
    try:
        llm.tokenizer.encode(llm.render(messages, tools), most=limit - 1)
        return
    except ContextLengthError as e:  # by its length alone
        raise InvalidRequestError(f"{path}: {e}") from None
    except TooManyTokens as e:
        raise InvalidRequestError(
            f"{path}: the tool definitions{' and --system' if system else ''} take "
            f"at least {e.counted:,} tokens of the model's {limit:,}-token "
            "context, leaving no room for a conversation: use fewer or shorter tools") from None


def load_llm(args: argparse.Namespace):
    """The LLM for MODEL / --hf-config-path / --device / --threads (embedded default without
    MODEL). CPU threads follow the API's policy (`engine_config.apply_cpu_threads`)."""
    from flint_graph.api import LLM
    from flint_graph.runtime.engine_config import EngineConfig

    check_model_path(args.model)
    if args.model is None and args.hf_config_path is not None \
            and os.path.exists(args.hf_config_path):  # a missing one: the loader says so
        # it replaced flint-nano's own config.json and failed on a tensor's shape, without
        # naming the flag (a bad-input trial, 2026-12-06)
        raise InvalidRequestError(f"--hf-config-path {args.hf_config_path}: it gives a GGUF "
                                  "checkpoint its config; the embedded default (no MODEL) has "
                                  "its own: give MODEL too, or leave the option out")
    llm = LLM(args.model, hf_config_path=args.hf_config_path, device=args.device,
              engine=EngineConfig(cpu_threads=args.threads, engine=args.engine,
                                  max_context=args.max_context, prefill=args.prefill,
                                  prefill_graphs=args.prefill_graphs,
                                  prefill_dense_bf16=args.prefill_dense_bf16,
                                  prefill_step_ms=args.prefill_step_ms,
                                  kv_reuse=args.kv_reuse,
                                  pipeline_decode=args.pipeline_decode,
                                  **({"prefill_chunk_tokens": args.prefill_chunk}
                                     if args.prefill_chunk else {})))
    if getattr(args, "stats", False):
        print("flint-graph: start-up " + json.dumps(llm.startup), file=sys.stderr)
    from flint_graph.runtime.sampling import unapplied_generation_keys

    unapplied = unapplied_generation_keys(llm.generation_config)
    if unapplied:
        print(f"flint-graph: note: {llm.checkpoint.config_dir / 'generation_config.json'} sets "
              f"{', '.join(unapplied)}, which flint-graph does not apply (it reads temperature, "
              "top_p, top_k, do_sample, max_new_tokens and eos_token_id)", file=sys.stderr)
    if not args.prefill_graphs and llm.engine.name == "reference":
        print("flint-graph: note: --no-prefill-graphs concerns the graph engine's kernel "
              "prefill; the reference engine running here has no graphs to turn off",
              file=sys.stderr)
    if not args.prefill_dense_bf16 and llm.engine.name == "reference":
        print("flint-graph: note: --no-prefill-dense-bf16 concerns the graph engine's prefill "
              "of NVFP4 checkpoints; the reference engine running here keeps no such copy, so "
              "it changes nothing", file=sys.stderr)
    if not args.pipeline_decode and llm.engine.name == "reference":
        print("flint-graph: note: --no-pipeline concerns the graph engine's decode steps; the "
              "reference engine running here decodes one step at a time anyway",
              file=sys.stderr)
    if args.prefill != "kernel" and llm.engine.name == "reference":
        print(f"flint-graph: note: --prefill {args.prefill} picks the graph engine's prompt "
              "path; the reference engine running here prefills with the plain model",
              file=sys.stderr)
    if llm.device.type == "cuda" and llm.engine.name == "reference" and args.engine == "auto":
        # On a GPU the slow path is a surprise worth one line; on the CPU it is the only one.
        print(f"flint-graph: note: decoding with the reference engine (slow): "
              f"{llm.engine.fallback_reason}", file=sys.stderr)
    if getattr(args, "freeze_gc", False):  # one LLM for the whole process
        from flint_graph.runtime.gc_policy import freeze_startup_objects

        freeze_startup_objects()  # no full-GC pause scanning start-up's objects mid-request
    return llm


# the most stdin a prompt is read from: far above what the largest context holds (the exact
# check, by characters against the model's context, follows once the model is loaded); `<
# /dev/zero` or `yes |` read until the machine ran out of memory
STDIN_MAX_BYTES = 64 << 20


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from --prompt or stdin (at most STDIN_MAX_BYTES). Raises InvalidRequestError
    for no prompt (stdin a terminal or closed), one larger than the cap, an empty one, or
    bytes that are not UTF-8 (naming the character's position in the prompt)."""
    prompt = args.prompt
    if prompt is None:
        if sys.stdin is None or sys.stdin.closed:
            raise InvalidRequestError("no prompt: stdin is closed; pass --prompt TEXT or pipe "
                                      "text on stdin")
        if sys.stdin.isatty():
            raise InvalidRequestError("no prompt: pass --prompt TEXT or pipe text on stdin")
        # Decode the bytes ourselves: the locale's decoder either raises on a bad byte or keeps
        # it as a surrogate that is only reported after templating, at a position that counts
        # the template's prefix. Checking here reports it as --raw does.
        raw = getattr(sys.stdin, "buffer", None)
        data = raw.read(STDIN_MAX_BYTES + 1) if raw else sys.stdin.read(STDIN_MAX_BYTES + 1)
        if len(data) > STDIN_MAX_BYTES:
            raise InvalidRequestError(f"prompt: stdin holds more than {STDIN_MAX_BYTES >> 20} "
                                      "MiB, more than any model's context; pass a shorter "
                                      "prompt")
        prompt = data.decode("utf-8", "surrogateescape") if raw else data
        # a byte-order mark some Windows editors write first is no part of the text either
        prompt = prompt.removeprefix("\ufeff")
        # the line end `echo` and editors add is not part of the prompt ("What is 250 minus
        # 750?\n" answered 9500 where --prompt answered 500)
        prompt = prompt[:-2] if prompt.endswith("\r\n") else prompt[:-1] \
            if prompt.endswith("\n") else prompt
    from flint_graph.api import check_prompt_text

    check_prompt_text(prompt)  # before templating, so a bad byte's position is the prompt's
    return prompt


def _cmd_generate(args: argparse.Namespace) -> int:
    from flint_graph.api import output_to_json

    check_model_path(args.model)  # before the prompt: a prompt given as MODEL says so
    prompt = read_prompt(args)
    tools = load_tools(args.tools)
    if args.raw and (args.tools is not None or not args.enable_thinking):
        given = " and ".join(f for f, on in (("--tools", args.tools is not None),
                                              ("--no-think", not args.enable_thinking)) if on)
        raise InvalidRequestError(f"{given} {'apply' if ' and ' in given else 'applies'} to "
                                  "the chat template; --raw sends the prompt without it")
    params = sampling_params(args)
    llm = load_llm(args)
    if args.raw:
        stream = llm.stream(prompt, params)
    else:
        stream = llm.stream_chat([{"role": "user", "content": prompt}], tools, params,
                                 enable_thinking=args.enable_thinking)
    from flint_graph.terminal.progress import prefill_bar

    shown_reasoning = reasoning_open = False
    line_open = False  # stdout's last line has text: a tool call or the end starts a new one
    try:
        with prefill_bar(llm.engine, True):  # a bar on a terminal, else plain lines
            for d in stream:
                if args.json:
                    continue
                if args.raw:
                    sys.stdout.write(d.text)
                    line_open = not d.text.endswith("\n") if d.text else line_open
                else:
                    if d.reasoning:
                        sys.stderr.write(d.reasoning)
                        sys.stderr.flush()
                        shown_reasoning = reasoning_open = True
                    if reasoning_open and (d.content or d.tool_calls):
                        # the reasoning's last line ends before the answer starts: on a
                        # terminal both streams share the screen ("So it is 165.165")
                        sys.stderr.write("\n")
                        sys.stderr.flush()
                        reasoning_open = False
                    sys.stdout.write(d.content)
                    line_open = not d.content.endswith("\n") if d.content else line_open
                    for c in d.tool_calls:
                        # no blank line around it: a script reading stdout got one first
                        sys.stdout.write(("\n" if line_open else "")
                                         + f"[tool call] {c.name} {c.arguments_json()}\n")
                        line_open = False
                sys.stdout.flush()
    except KeyboardInterrupt:
        stream.close()  # the request ends with finish_reason "abort"
        if args.json:  # the plain output already streamed it: --json reports it now
            print(output_to_json(stream.output, llm.engine.name, llm.engine.context_limit))
        elif not _isatty(sys.stderr) and (reasoning_open or line_open and _same_file(
                sys.stdout, sys.stderr)):
            # half a line of reasoning or answer where "flint-graph: interrupted" goes next
            # (`2>&1` into a pipe or a log: "457 + 3flint-graph: interrupted"); a terminal
            # gets its line end from main's handler
            sys.stderr.write("\n")
            sys.stderr.flush()
        raise
    out = stream.output
    limit = llm.engine.context_limit
    context_note = None  # said in --json mode too, beside its "length_cause" (a new user's trial)
    if out.finish_reason == "length" and len(out.token_ids) >= limit - len(out.prompt_token_ids):
        context_note = (f"flint-graph: note: the context limit ({limit} tokens) ended the answer "
                        f"after {len(out.token_ids)} tokens; shorten the prompt"
                        + (" or raise --max-context" if args.max_context is not None
                           and limit == args.max_context else ""))
    if args.json:
        with _sigterm_deferred():  # the finished answer is printed whole, then the signal
            print(output_to_json(out, llm.engine.name, limit))
        if context_note:
            print(context_note, file=sys.stderr)
        return 0
    if reasoning_open:
        sys.stderr.write("\n")
    if line_open:
        print()
    for err in out.errors:
        print(f"flint-graph: warning: {err}", file=sys.stderr)
    if context_note:
        print(context_note, file=sys.stderr)
    elif out.finish_reason == "length" and not args.raw and not out.content \
            and not out.tool_calls:
        print(f"flint-graph: note: max tokens ({len(out.token_ids)}) ran out while the model was "
              "still reasoning; raise --max-tokens for an answer", file=sys.stderr)
    elif out.finish_reason == "length":
        # the answer itself cut short: without this only --json said so (a new user's trial,
        # 2026-12-06: `generate --prompt Hi --no-think --max-tokens 60` ended mid-line)
        print(f"flint-graph: note: max tokens ({len(out.token_ids)}) ended the answer early; "
              "raise --max-tokens for the rest", file=sys.stderr)
    elif out.finish_reason == "repeat":
        print(f"flint-graph: note: the answer repeated itself; --stop-on-repeat ended it after "
              f"{len(out.token_ids)} tokens", file=sys.stderr)
    elif out.finish_reason == "stop" and not args.raw and out.reasoning_content \
            and not out.content and not out.tool_calls:
        # only a caller's stop cuts reasoning this way (the model's own end makes it content)
        print("flint-graph: note: a --stop string ended the output while the model was "
              "still reasoning, so there is no answer", file=sys.stderr)
    elif shown_reasoning and not out.reasoning_content and out.content:
        print("flint-graph: note: the model stopped without closing its reasoning (</think>), "
              "so that text is reported as the answer", file=sys.stderr)
    from flint_graph.chat.tool_call_reader import CALL_OPEN

    if not args.raw and not tools and CALL_OPEN in out.content:
        # Without tools nothing parses calls (as in vLLM), so flint-nano's trained answer to
        # "Convert 120 km to mi." reached stdout as markup with nothing saying why.
        print(f"flint-graph: note: {call_as_text_hint(args.tools)}", file=sys.stderr)
    elif not args.raw and not tools and out.content.lstrip().startswith(DECLINED):
        # flint-nano declines a tool request it was given no tool for, in words that list
        # the skills it just declined ("Convert 120 km to mi." without --tools)
        # ("Write a poem" is declined the same way, so the note says when tools would help)
        print(f"flint-graph: note: {DECLINED_HINT}", file=sys.stderr)
    return 0


def call_as_text_hint(tools_path: str | None) -> str:
    """The note for an answer holding a tool call that nothing parsed (no tools declared, as
    in vLLM): what `generate` prints on stderr and the chat under the answer. tools_path: the
    --tools file given (one declaring no tools), or None."""
    from flint_graph.chat.tool_call_reader import CALL_OPEN

    why = (f"{tools_path} declares none" if tools_path is not None else
           "no tools were declared; pass --tools TOOLS.json (e.g. examples/tools.json) to "
           "have it parsed")
    return f"the answer holds a tool call ({CALL_OPEN}), shown as text since {why}"


# how flint-nano begins declining a request (nano/phrasings.py REFUSAL), and what generate and
# the chat add when it declines with no tools declared
DECLINED = "I can't do that."
# the calculator was missing from the list, though "What is 12 times 13?" needs it (a new
# user's trial, 2026-12-06)
DECLINED_HINT = ("the model declined; if you asked for the weather, a unit conversion, a "
                 "calculation or a table lookup, those are tool calls, offered with --tools "
                 "TOOLS.json (e.g. examples/tools.json)")


def _cmd_chat(args: argparse.Namespace) -> int:
    from flint_graph.terminal.chat_cli import ChatSession

    if sys.stdin is None or sys.stdin.closed:  # input() would fail with "lost sys.stdin"
        raise InvalidRequestError("chat reads your messages from stdin, which is closed; run "
                                  "it in a terminal or pipe the messages in")
    tools = load_tools(args.tools)
    params = sampling_params(args)
    if args.system is not None:  # checked now: a bad --system would fail every turn
        try:
            args.system.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRequestError(f"--system: {not_utf8(args.system, e)}") from None
    llm = load_llm(args)
    check_tools_fit(llm, tools, args.tools, args.system)
    start_up_over()
    return ChatSession(llm, params, tools=tools, system=args.system,
                       enable_thinking=args.enable_thinking,
                       show_reasoning=args.show_reasoning, tools_path=args.tools).run()


def default_served_name(model: str | None) -> str:
    """The model id `serve` lists without --served-model-name: the checkpoint's file or
    directory name, its control characters (a newline, an escape: no client could send them
    back, and they reached /v1/models as they were, a bad-input trial 2026-12-06) each
    replaced by "_"; "flint-nano" for the embedded default or a name with nothing else."""
    from pathlib import Path

    from flint_graph.cli_args import is_control

    if not model:
        return "flint-nano"
    clean = "".join("_" if is_control(ch) else ch for ch in Path(model).stem)
    return clean if clean.strip("_ ") else "flint-nano"


def _cmd_make_checkpoint(args: argparse.Namespace) -> int:
    from flint_graph.checkpoints import make_checkpoint

    return make_checkpoint.run(args)


def _cmd_build_kernels(args: argparse.Namespace) -> int:
    from flint_graph.kernels.toolchain import build

    return build.run(args)


def _cmd_bench(args: argparse.Namespace) -> int:
    from flint_graph.perf.cli import run_bench_cmd

    return run_bench_cmd(args)


def _cmd_trace(args: argparse.Namespace) -> int:
    from flint_graph.perf.cli import run_trace_cmd

    return run_trace_cmd(args)


def _cmd_eval(args: argparse.Namespace) -> int:
    from flint_graph.nano.eval_cli import cmd_eval

    return cmd_eval(args)


def _check_address(host: str, port: int) -> None:
    """InvalidRequestError naming --host / --port when this process cannot listen there (the
    port taken, the address not this machine's)."""
    import socket

    if not host.strip():  # "--host  --port 8000: cannot listen there" hid the empty value
        raise InvalidRequestError(f"--host {host!r}: expected a host name or address (e.g. "
                                  "127.0.0.1, or 0.0.0.0 for every interface)")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(infos[0][4])
    except (OSError, OverflowError) as e:
        raise InvalidRequestError(f"--host {host} --port {port}: cannot listen there "
                                  f"({getattr(e, 'strerror', None) or e})") from None


def _cmd_serve(args: argparse.Namespace) -> int:
    """Serve the OpenAI HTTP API until Ctrl-C (flint_graph/server)."""
    import asyncio

    try:
        import uvicorn

        from flint_graph.server.app import create_app
    except ImportError as e:
        # this interpreter's pip: a bare `pip` on a new user's shell installed outside .venv
        pip = shlex.quote(sys.executable) + " -m pip"
        raise InvalidRequestError(f"flint-graph serve needs the serve extra ({e.name} is "
                                  f"missing): in the project's directory, {pip} install -e "
                                  "'.[serve]'") from None
    check_model_path(args.model)  # before listening
    name = args.served_model_name or default_served_name(args.model)
    _check_address(args.host, args.port)  # before loading: uvicorn would report it as a trace
    failed: list[str] = []

    def stop(message: str) -> None:  # the model did not load: say why and shut down
        failed.append(message)
        server.should_exit = True

    started = time.perf_counter()
    base = base_url(args.host, args.port)

    def ready(llm) -> None:  # a log line a user (or a script tailing it) can wait for
        kind = "graph" if llm.engine.runner else "reference"
        print(f"flint-graph: ready in {time.perf_counter() - started:.1f} s: {name!r} ({kind} "
              f"engine) answers POST {base}/v1/chat/completions",
              file=sys.stderr, flush=True)

    def log_request(line: str) -> None:
        print(f"flint-graph: {line}", file=sys.stderr, flush=True)

    app = create_app(lambda: load_llm(args), name, api_key=args.api_key, on_error=stop,
                     max_waiting=args.max_waiting, on_ready=ready,
                     request_log=None if args.no_request_log else log_request)

    class Server(uvicorn.Server):
        loop = None
        ended_requests = False

        async def startup(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)

        def handle_exit(self, sig, frame):
            if not self.should_exit:  # the log said nothing on SIGTERM (a hostile-input trial)
                n = app.state.open_requests()
                why = f"flint-graph: stopping ({signal.Signals(sig).name})"
                print(why + (f": {n} open request(s) get {args.shutdown_grace:g} s to finish, "
                             "then are aborted (send it again to abort them now)" if n else ""),
                      file=sys.stderr, flush=True)
            if self.should_exit and not self.ended_requests and self.loop is not None:
                # a second Ctrl-C / SIGTERM: end the open requests now, each handler
                # answering within an engine step, rather than uvicorn's forced exit cutting
                # them mid-response (tracebacks, before 2026-12-03); a third one forces
                self.ended_requests = True
                self.loop.call_soon_threadsafe(app.state.abort_all)
                return
            super().handle_exit(sig, frame)

        async def shutdown(self, sockets=None):
            # requests still open after the grace are aborted in the engine, so each handler
            # ends its response itself; uvicorn's own timeout, later, would cancel them
            # mid-write (a plain-text 500 and a CancelledError traceback, before 2026-12-03)
            later = asyncio.get_running_loop().call_later(args.shutdown_grace,
                                                          app.state.abort_all)
            try:
                await super().shutdown(sockets)
            finally:
                later.cancel()

    from flint_graph.server.connections import guarded_protocol

    # a time limit on request headers and a cap on open connections (server/connections.py)
    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                   timeout_graceful_shutdown=args.shutdown_grace + 5,
                                   http=guarded_protocol()))
    print(f"flint-graph: serving {name!r} on {base}/v1 (loading the "
          "model: GET /health answers 503 until it is ready)", file=sys.stderr)

    def _terminated(*_):  # a stop request, not a failure: exit 0 (systemd, docker stop)
        raise SystemExit(0)

    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler found here
    signal.signal(signal.SIGTERM, _terminated)
    try:
        server.run()
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    if failed:
        raise InvalidRequestError(f"the model did not load: {failed[0]}")
    # Every response has ended. A worker thread may still be inside the engine step it was
    # in (a long prompt's chunk on the CPU: seconds), which the interpreter's exit waits for
    # (it made `--shutdown-grace 0` exit slower than the default, and a Ctrl-C meanwhile
    # turned the status into 130; bad-input trial, 2026-12-05): the server holds nothing to
    # save, so the process leaves now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else 0)


# Each command and the modules it imports during start-up, where Ctrl-C exits at once (see the
# module docstring). The embedded default checkpoint needs make_checkpoint too.
COMMANDS = {
    "chat": (_cmd_chat, ("flint_graph.api", "flint_graph.checkpoints.make_checkpoint",
                         "flint_graph.terminal.chat_cli")),
    "generate": (_cmd_generate, ("flint_graph.api", "flint_graph.checkpoints.make_checkpoint")),
    "make-checkpoint": (_cmd_make_checkpoint, ("flint_graph.checkpoints.make_checkpoint",)),
    "build-kernels": (_cmd_build_kernels, ("flint_graph.kernels.toolchain.build",)),
    "bench": (_cmd_bench, ("flint_graph.perf.bench", "flint_graph.perf.bench_report")),
    "trace": (_cmd_trace, ("flint_graph.perf.trace", "flint_graph.perf.trace_report")),
    "eval": (_cmd_eval, ("flint_graph.api", "flint_graph.checkpoints.make_checkpoint",
                         "flint_graph.nano.evals")),
    "serve": (_cmd_serve, ("flint_graph.api", "flint_graph.checkpoints.make_checkpoint")),
}


if __name__ == "__main__":
    sys.exit(main())
