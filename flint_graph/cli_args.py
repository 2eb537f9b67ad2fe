"""The `flint-graph` argument parser: every subcommand's flags and help, one-line errors.

It imports nothing heavy (no torch), so `--version` and any `--help` answer at once; the
commands themselves live in `cli.py` and import what they need after parsing.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from flint_graph.checkpoints import make_checkpoint_args

EXIT_BAD_INPUT = 2


# What argparse should take as a (negative) number rather than a flag: its own pattern sees
# only -5 and -.5, so `--temperature -1e5` or `--top-p -inf` read as a flag ("expected one
# argument") instead of reaching the value's own check.
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.I)
SHOWN_CHARS = 60  # a longer word in an error message is cut, its length named


def _cut(word: re.Match) -> str:
    w = word.group()
    return f"{w[:SHOWN_CHARS // 2]}…{w[-8:]} ({len(w):,} characters)"


TOOL_WORD_CHARS = 400  # the tools' errors keep any real path whole, cut only longer words


def short_message(message: str, most: int = SHOWN_CHARS) -> str:
    """`message` on one line with every word longer than `most` characters cut to its first
    and last characters, its length named: an error quoting a 100,000-character value echoed
    it whole (bad-input trials, 2026-12-06 and 2026-12-07)."""
    return re.sub(rf"\S{{{most + 1},}}", _cut, " ".join(message.split()))


class ValueParser(argparse.ArgumentParser):
    """argparse that refuses `--OPTION=--` with an error naming the option. Python 3.11's
    argparse drops the `--` and hands the option an empty list without its type check or
    choices, which the code after it took for a value (a bad-input trial, 2026-12-06:
    tracebacks from ~20 options of tools/bench_prefill.py and tools/probe_grouped_w4a16.py,
    and `flint-graph generate --tools=--` an internal error). The bench tools use it as is;
    its errors cut words over TOOL_WORD_CHARS characters (`short_message`)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        super().error(short_message(message, TOOL_WORD_CHARS))

    def _get_values(self, action, arg_strings):
        if action.option_strings and action.nargs in (None, argparse.OPTIONAL) \
                and arg_strings == ["--"]:
            self.error(f"argument {'/'.join(action.option_strings)}: expected a value, "
                       "found '--'")
        return super()._get_values(action, arg_strings)


class ArgParser(ValueParser):
    """argparse with the CLI's error shape: one line `flint-graph: error: ...` naming the
    --help to read, exit status 2 (argparse prints a multi-line usage first); values it
    quotes are cut to SHOWN_CHARS, and negative numbers in exponent form or ±inf are values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if hasattr(self, "_negative_number_matcher"):  # argparse's private hook (3.8–3.13)
            self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> None:  # type: ignore[override]
        from flint_graph.cli import terminal_safe

        message = short_message(message)
        self.exit(EXIT_BAD_INPUT, f"flint-graph: error: {terminal_safe(message)} (see "
                                  f"{self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        # argparse reports a subcommand's unknown flags from the top parser, which would point
        # at `flint-graph --help`; report them from the subcommand's parser instead.
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            commands = getattr(self, "commands", {})
            commands.get(getattr(ns, "command", None), self).error(
                f"unrecognized arguments: {' '.join(extras)}")
        return ns


def tcp_port(text: str) -> int:
    """argparse type: a TCP port, 1 to 65535."""
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1 ... 65535, got {value}")
    return value


def non_empty(text: str) -> str:
    """argparse type: a string with something besides whitespace (an empty --api-key started a
    server that refused every request)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    return text


def model_path(text: str) -> str:
    """argparse type of MODEL: a non-empty path ('' read as the working directory: `eval ''`
    evaluated whatever GGUF sat there, a bad-input trial of 2026-12-06)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a BF16 checkpoint directory or an NVFP4 "
                                         ".gguf file; leave MODEL out for the default")
    return usable_name(text)


def usable_name(text: str) -> str:
    """`text`, a path flag's value, unless it cannot name a file at all (`paths.name_problem`:
    a NUL, a name too long for the file system, a directory on its way not searchable), which
    raises ArgumentTypeError saying so (argparse adds the flag's name)."""
    from flint_graph.paths import name_problem

    problem = name_problem(text)
    if problem:  # (ArgParser.error cuts a long name)
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return text


def hf_config_dir(text: str) -> str:
    """argparse type of --hf-config-path: a non-empty path (its error named the API's
    `hf_config_path`, not the flag)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a directory holding config.json (or that "
                                         "config.json); leave the option out to read them "
                                         "beside MODEL")
    return usable_name(text)


def is_control(ch: str) -> bool:
    """Whether `ch` is a C0 or C1 control character or DEL (Unicode category Cc)."""
    return ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0


def served_name(text: str) -> str:
    """argparse type of --served-model-name: non-empty, no control characters (a name with a
    newline was served, but no client could retrieve it by id: a bad-input trial,
    2026-12-06)."""
    text = non_empty(text)
    bad = next((ch for ch in text if is_control(ch)), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"a control character ({ascii(bad)}) in the name; "
                                         "clients send it in URLs and JSON")
    return text


def api_key(text: str) -> str:
    """argparse type of --api-key: printable ASCII without spaces, as an HTTP header carries it
    (a key with 'ключ' in it started a server whose key no request could send: headers are
    read as Latin-1, and OpenAI's client refuses non-ASCII ones)."""
    text = non_empty(text)
    bad = next((c for c in text if not "!" <= c <= "~"), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"expected printable ASCII without spaces (a header "
                                         f"value), found {bad!r}")
    return text


class RepeatedValue(argparse.ArgumentTypeError):
    """A value listed twice in a comma-separated flag (a parser that rewords other errors lets
    this one through)."""


def refuse_repeats(values, text: str, noun: str = "value") -> None:
    """Raise RepeatedValue naming the first value of `values` that occurs twice in the flag's
    `text` (as typed): `eval --contexts 1k,1024` ran its recall cases twice."""
    twice = sorted({v for v in values if list(values).count(v) > 1})
    if twice:
        raise RepeatedValue(f"{twice[0]} given twice in {text!r}; list each {noun} once")


PLAIN_INT_DIGITS = 18  # every count, size and switch a flag takes fits (seeds: `seed_int`)


def shown(text: str, most: int = 40) -> str:
    """repr(text) for an error message, cut to `most` characters with the length named (a
    30,000-character value was echoed whole: a bad-input trial, 2026-12-07)."""
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}… ({len(text):,} characters)"


def plain_int(text: str) -> int:
    """int(text) for plain ASCII digits only (surrounding blanks allowed), at most
    PLAIN_INT_DIGITS of them; raises ValueError otherwise: int() also reads "٣" and "1_0", a
    flag takes plain digits (bad-input trials: `--seed ١٢`, `eval --n ٣`, `--contexts ٣٠٠`),
    and over 4,300 digits int() itself raised, a traceback from the tools that checked the
    digits first (2026-12-07)."""
    t = text.strip()
    if not (t.isascii() and t.isdigit()):
        raise ValueError(f"not plain digits: {shown(text)}")
    if len(t) > PLAIN_INT_DIGITS:
        raise ValueError(f"more than {PLAIN_INT_DIGITS} digits: {shown(text)}")
    return int(t)


def plain_int_or_none(text: str) -> int | None:
    """`plain_int(text)`, or None where it raises: for checks that word their own error."""
    try:
        return plain_int(text)
    except ValueError:
        return None


def integer(text: str, expected: str = "an integer") -> int:
    """argparse type: an integer. One too long for Python to read (over 4,300 digits) is named
    by its length, not called invalid; `expected` words the error."""
    t = text.strip()
    body = t[1:] if t[:1] in ("+", "-") else t
    if not (body.isascii() and body.isdigit()):  # plain_int's rule, with a sign
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    try:
        return int(t)
    except ValueError:  # over 4,300 digits
        raise argparse.ArgumentTypeError(
            f"expected {expected} of at most 4,300 digits, got {len(body):,} digits") from None


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1 (the error names the flag through argparse)."""
    value = integer(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def thread_count(text: str) -> int:
    """argparse type of --threads: an integer from 1 to 4 per CPU of this machine (as
    EngineConfig.cpu_threads, whose own error would name the API field, not the flag)."""
    from flint_graph.runtime.engine_config import max_cpu_threads

    value = positive_int(text)
    if value > max_cpu_threads():
        raise argparse.ArgumentTypeError(f"expected at most {max_cpu_threads()} (4 per CPU of "
                                         f"this machine), got {value}")
    return value


def seed_int(text: str) -> int:
    """argparse type: a seed, an integer in [0, 2**63) (as SamplingParams' seed; an eval
    report with a negative seed could not be compared with later)."""
    value = integer(text, "an integer in [0, 2**63)")
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**63), got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def step_ms(text: str) -> float | None:
    """argparse type of --prefill-step-ms: a finite number of ms > 0, or "none" (no timed
    budget: every step prefills one chunk, so runs repeat bit for bit)."""
    if text.strip().lower() == "none":
        return None
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a finite number of ms > 0 or 'none', "
                                         f"got {text!r}") from None


def grace_seconds(text: str) -> float:
    """argparse type of --shutdown-grace: seconds, a finite number from 0 to 3,600."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to 3600, got {text}")
    return value


class _VersionAction(argparse.Action):
    """`--version`, reading the installed version only when asked (importlib.metadata is slow
    to import)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {version()}")
        parser.exit()


def version() -> str:
    """The installed flint-graph version ("unknown (not installed)" from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("flint-graph")
    except PackageNotFoundError:
        return "unknown (not installed)"


def given_dests(argv: list[str]) -> set[str]:
    """The dests of the options (and positionals) `argv` gives, whatever their values: parsed
    again with every default suppressed. What a flag that a run cannot use is checked by
    (`bench --compare A B --buckets 1,2,4,8`, the default typed out, was ignored without a word
    where `--buckets 1` was refused: a re-trial). `argv` must parse (it did once already)."""
    parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for p in [parser, *(c for s in subs for c in s.choices.values())]:
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand; `args.command` names the one chosen."""
    p = ArgParser(
        prog="flint-graph",
        description="Run Flint mixture-of-experts checkpoints (the 40B model, or any in its "
                    "formats): interactive chat, one-shot generation, synthetic checkpoints in "
                    "the real formats, latency benchmarks, traces and an accuracy suite. "
                    "Without a MODEL argument, chat, generate, serve and eval run the embedded "
                    "flint-nano: a small demo model (a miniature Flint trained on a few tasks, "
                    "unpacked on first use), not the 40B model; bench and trace run synthetic "
                    "weights of their --preset.")
    p.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    p.commands = sub.choices  # name -> subparser, for errors that argparse raises at the top

    chat = sub.add_parser("chat", help="interactive terminal chat (streams reasoning, content "
                                       "and tool calls)",
                          description="Chat with a Flint checkpoint in the terminal. Commands: "
                                      "/reset, /save FILE, /reasoning, /help, /exit. Ctrl-C "
                                      "stops the current answer; Ctrl-D, /exit or /quit quits.")
    _model_args(chat)
    _sampling_args(chat, repeat_default=CHAT_STOP_ON_REPEAT)
    _engine_args(chat)
    chat.add_argument("--system", metavar="TEXT", help="system message for the conversation")
    chat.add_argument("--show-reasoning", action="store_true",
                      help="keep reasoning expanded after each answer (default: collapsed to "
                           "one line; /reasoning shows the last one)")
    chat.set_defaults(command="chat")

    gen = sub.add_parser("generate", help="one-shot generation for scripts and pipes",
                         description="Generate one answer. The prompt goes through the chat "
                                     "template as one user message unless --raw. Reasoning "
                                     "goes to stderr, the answer to stdout.")
    _model_args(gen)
    gen.add_argument("--prompt", metavar="TEXT",
                     help="prompt text; stdin is then not read (default: read from stdin, "
                          "as UTF-8, less one trailing line end and a leading byte-order "
                          "mark)")
    gen.add_argument("--raw", action="store_true",
                     help="send the prompt as raw text, without the chat template")
    gen.add_argument("--json", action="store_true",
                     help="print one JSON object: token_ids, text, reasoning_content, "
                          "content, tool_calls, finish_reason, ttft_ms, ms_per_token, prompt_tokens, "
                          "cached_tokens, errors, engine (graph or reference), context_limit "
                          "and, when finish_reason is length, length_cause (max_tokens or "
                          "context_limit)")
    _sampling_args(gen)
    _engine_args(gen)
    gen.set_defaults(command="generate")

    srv = sub.add_parser("serve", help="OpenAI-compatible HTTP server (chat completions, "
                                       "completions, models, health, metrics)",
                         description="Serve a Flint checkpoint over the OpenAI HTTP API: POST "
                                     "/v1/chat/completions and /v1/completions (streamed as "
                                     "server-sent events with stream: true), GET /v1/models, "
                                     "/health and /metrics (Prometheus). Needs the serve "
                                     "extra (FastAPI, uvicorn, prometheus-client).")
    _model_args(srv, conversation=False)
    _engine_args(srv)
    srv.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default: %(default)s, this machine only). "
                          "The server holds at most 1,000 connections, 256 per client "
                          "address, and closes one that takes over 30 s to send its headers "
                          "or 60 s its body; a public address still belongs behind a "
                          "reverse proxy that limits clients")
    srv.add_argument("--port", type=tcp_port, default=8000,
                     help="TCP port (default: %(default)s)")
    srv.add_argument("--api-key", metavar="KEY", type=api_key,
                     help="require 'Authorization: Bearer KEY' on /v1 routes")
    srv.add_argument("--served-model-name", metavar="NAME", type=served_name,
                     help="the model id clients send and /v1/models lists (default: the "
                          "checkpoint's file or directory name, or flint-nano)")
    srv.add_argument("--max-waiting", type=positive_int, default=256, metavar="N",
                     help="requests that may wait for a free slot, in arrival order; past "
                          "them a request gets 429 at once (default: %(default)s)")
    srv.add_argument("--shutdown-grace", type=grace_seconds, default=5.0, metavar="S",
                     help="on Ctrl-C or SIGTERM, requests still open after S seconds are "
                          "aborted: a streamed one ends with finish_reason \"abort\" and "
                          "[DONE], another gets a 503 error; a second signal does that at "
                          "once (default: %(default)s)")
    srv.add_argument("--no-request-log", action="store_true",
                     help="do not print a line on stderr for each finished request (route, "
                          "finish reason, prompt / cached / generated tokens, TTFT, time); "
                          "GET /metrics counts them either way")
    srv.set_defaults(command="serve")

    mk = sub.add_parser("make-checkpoint", help="write a synthetic Flint checkpoint (BF16 "
                                                "safetensors and/or NVFP4 GGUF)",
                        description="Write a seeded synthetic checkpoint in exactly the real "
                                    "formats: DIR/ with config and tokenizer, plus BF16 "
                                    "shards and/or DIR/model-nvfp4.gguf (--format).")
    make_checkpoint_args.add_arguments(mk)
    mk.set_defaults(command="make-checkpoint")

    bk = sub.add_parser("build-kernels", help="compile the CuTe DSL kernels into the cubin "
                                              "cache (no GPU needed)",
                        description="Compile every kernel specialisation a config needs "
                                    "(batch buckets 1, 2, 4, 8) ahead of time into DIR: one "
                                    "cubin each plus DIR/manifest.json. Unchanged entries are "
                                    "kept. Needs the CuTe DSL (pip install '.[kernels]'); the "
                                    "GPU machine only reads the cache.")
    _build_kernels_args(bk)
    bk.set_defaults(command="build-kernels")
    from flint_graph.perf.cli import add_bench_parser, add_trace_parser

    add_bench_parser(sub, positive_int, _buckets)
    add_trace_parser(sub, positive_int, _buckets)
    from flint_graph.nano.eval_cli import add_eval_parser

    add_eval_parser(sub, positive_int)
    return p


def _build_kernels_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=("tiny", "nano", "full"), default="tiny",
                     help="packaged config whose shapes to compile (default: %(default)s)")
    src.add_argument("--config", type=_nonempty_path, metavar="CONFIG.json",
                     help="an HF-style config.json instead of a preset (e.g. a real checkpoint's)")
    p.add_argument("--arch", action="append", choices=("sm_90a", "sm_100a"),
                   help="target GPU arch, repeatable (default: sm_90a, the H100/H200)")
    p.add_argument("--out", type=_nonempty_path, metavar="DIR",
                   help="cache directory (default: $FLINT_GRAPH_CACHE/kernels, else "
                        "~/.cache/flint_graph/kernels)")
    p.add_argument("--buckets", type=_buckets,
                   default=(1, 2, 4, 8), metavar="B,B,...",
                   help="decode batch buckets to specialise for, powers of two up to 8 (default: "
                        "1,2,4,8)")
    p.add_argument("--force", action="store_true", help="rebuild entries that are up to date")
    p.add_argument("--jobs", type=positive_int, metavar="N",
                   help="compile processes (default: one per CPU, at most 8)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="hide the progress bar")


def _buckets(text: str) -> tuple[int, ...]:
    """--buckets: comma-separated batch sizes from 1 to MAX_BATCH (argparse reports the
    ArgumentTypeError's text as "argument --buckets: ...")."""
    from flint_graph.kernels.toolchain.spec import MAX_BATCH  # light: no torch, no DSL

    try:
        sizes = tuple(integer(b) for b in text.split(","))
    except argparse.ArgumentTypeError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated batch sizes >= 1 (e.g. "
                                         f"1,2,4,8), found {text!r}")
    if max(sizes) > MAX_BATCH:
        raise argparse.ArgumentTypeError(f"batch size {max(sizes)} is above {MAX_BATCH}, the "
                                         f"most rows the kernels handle; found {text!r}")
    odd = [b for b in sizes if b & (b - 1)]
    if odd:  # the MoE router's warp reductions and the engine's buckets are powers of two
        raise argparse.ArgumentTypeError(f"batch size {odd[0]} is not a batch bucket; expected "
                                         f"powers of two up to {MAX_BATCH} (1,2,4,8), found "
                                         f"{text!r}")
    refuse_repeats(sizes, text, "bucket")
    return sizes


def _nonempty_path(text: str) -> Path:
    """A path flag's value; an empty one (Path("") is ".") is refused, not taken as the current
    directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a path, found {text!r}")
    return Path(usable_name(text))


def _model_args(p: argparse.ArgumentParser, conversation: bool = True) -> None:
    """MODEL, --hf-config-path, --device, --threads, --stats (the engine's flags:
    `_engine_args`); with `conversation`, also --tools and --no-think (a server takes those per
    request instead)."""
    p.add_argument("model", nargs="?", metavar="MODEL", type=model_path,
                   help="BF16 checkpoint directory or NVFP4 .gguf file (default: the embedded "
                        "flint-nano, a small demo model unpacked into a cache directory on "
                        "first use)")
    p.add_argument("--hf-config-path", metavar="DIR", type=hf_config_dir,
                   help="directory with config.json, tokenizer and generation_config.json for "
                        "a GGUF (default: the GGUF's own directory)")
    p.add_argument("--device", metavar="DEV",
                   help="torch device, e.g. cuda or cpu (default: cuda when available)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="CPU threads for torch (default: for a small model on the CPU 1 thread, "
                        "and for prompts of 256+ tokens the cores the load average leaves free; "
                        "unless OMP_NUM_THREADS is set; else torch's own choice). --threads 1 "
                        "keeps one thread throughout (best on a busy machine)")
    p.add_argument("--stats", action="store_true",
                   help="print the start-up report on stderr (JSON): engine, seconds for the "
                        "checkpoint (read + repack) and the engine (KV cache, kernel cache, "
                        "capture per bucket), kernels per step per bucket, bytes of weights "
                        "and KV cache")
    if not conversation:
        return
    p.add_argument("--tools", metavar="TOOLS.json", type=_nonempty_path,
                   help="JSON file with a list of OpenAI-style function tools the model may call")
    p.add_argument("--no-think", dest="enable_thinking", action="store_false",
                   help="turn thinking off (the prompt ends with </think>)")


def _engine_args(p: argparse.ArgumentParser) -> None:
    """The engine's flags, in their own group after the others: most tune the GPU's graph
    engine, and listed first they hid --tools, --no-think and sampling from a CPU user (a new
    user's trial, 2026-12-07)."""
    g = p.add_argument_group("engine", "Most of these tune the graph engine on an NVIDIA GPU; "
                             "a CPU runs the reference engine, where only --engine, "
                             "--max-context, --prefill-chunk, --prefill-step-ms and "
                             "--no-kv-reuse apply.")
    g.add_argument("--engine", choices=("auto", "graph", "reference"), default="auto",
                   help="decode path: graph = CUDA-graph replay of the AOT kernels (needs a GPU "
                        "and the kernel cache, see flint-graph build-kernels); reference = the "
                        "plain PyTorch model; auto (default) = graph where it can run")
    g.add_argument("--prefill", choices=("kernel", "torch", "reference"), default="kernel",
                   help="graph engine's prompt path (GPU only; the reference engine always "
                        "prefills with the plain model): kernel (default) = the CuTe DSL prefill "
                        "attention with cuBLAS and grouped expert GEMMs; torch = torch's SDPA "
                        "for attention (the baseline); reference = the plain PyTorch model")
    g.add_argument("--no-prefill-graphs", dest="prefill_graphs", action="store_false",
                   help="kernel prefill: launch each chunk's kernels one by one instead of "
                        "replaying the CUDA graphs captured at start-up per chunk size (for "
                        "comparisons; the graphs cut ~80 ms of host launches per chunk)")
    g.add_argument("--no-prefill-dense-bf16", dest="prefill_dense_bf16", action="store_false",
                   help="graph engine with an NVFP4 checkpoint: decode the dense weights for "
                        "each prefill chunk instead of keeping a BF16 copy (the copy takes "
                        "~2.4 GB at full size from the KV cache and saves ~1 ms per prompt; "
                        "the output is the same either way)")
    g.add_argument("--no-kv-reuse", dest="kv_reuse", action="store_false",
                   help="prefill every prompt whole instead of continuing the finished sequence "
                        "that shares its longest prefix (chat turns, tool results: only the "
                        "new tokens are prefilled by default)")
    g.add_argument("--no-pipeline", dest="pipeline_decode", action="store_false",
                   help="graph engine: launch each decode step only after the host has handled "
                        "the previous step's tokens (by default the next step runs on the GPU "
                        "meanwhile; for comparisons)")
    g.add_argument("--prefill-chunk", type=positive_int, metavar="N",
                   help="prompt tokens per prefill chunk, on either engine (default: 32768 on "
                        "the graph engine's kernel prefill, else 2048; lower it if a long "
                        "prompt runs out of memory)")
    g.add_argument("--prefill-step-ms", type=step_ms, metavar="MS", default=100.0,
                   help="while other requests are generating, prefill about this many ms of a "
                        "new prompt per step (predicted from the prefills timed so far): lower "
                        "keeps their tokens coming more evenly, higher gets the new prompt's "
                        "first token sooner (default: 100). 'none': one chunk per step, "
                        "whatever the timings, so a rerun splits every prompt alike and repeats "
                        "bit for bit")
    g.add_argument("--max-context", type=positive_int, metavar="N",
                   help="tokens per sequence, prompt and output (default: the graph engine "
                        "holds what fits in 80%% of the free GPU memory, the reference engine "
                        "the model's limit)")


# the terminal chat ends a looping answer after this many tokens of it unless told otherwise:
# flint-nano answered a plain-text tool result with '{"sky": "rainrainrain…' to the 512-token
# limit, every time (a new user's trial, 2026-12-06); generate and the API keep it off, so a
# script gets exactly what it asked for
CHAT_STOP_ON_REPEAT = 64


def _sampling_args(p: argparse.ArgumentParser, repeat_default: int = 0) -> None:
    g = p.add_argument_group("sampling (defaults come from the checkpoint's "
                             "generation_config.json)")
    g.add_argument("--max-tokens", type=positive_int, metavar="N",
                   help="most tokens to generate, reasoning included (default: the "
                        "checkpoint's generation_config.json max_new_tokens, 512 for "
                        "flint-nano; without one, 4096)")
    g.add_argument("--temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--top-p", type=float, metavar="P", help="nucleus mass, in (0, 1]")
    g.add_argument("--top-k", type=integer, metavar="K", help="keep the K most likely (0 = off)")
    g.add_argument("--seed", type=integer, metavar="S", help="seed for reproducible sampling")
    g.add_argument("--stop", action="append", metavar="TEXT", default=None,
                   help="stop string (repeatable); it is not included in the output")
    g.add_argument("--stop-on-repeat", type=integer, metavar="N", default=repeat_default,
                   help="end an answer whose last N tokens are one short block said over and "
                        "over (at least 4 times); N from 8 to 4096, 0 = off (default: "
                        + (f"{repeat_default}" if repeat_default else "off") + ")")
