"""The `bench` and `trace` subcommands of `flint-graph`: their flags (imported while the CLI
starts, so nothing heavy here) and what they run."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from flint_graph.cli_args import model_path, plain_int, refuse_repeats, seed_int, usable_name
from flint_graph.paths import replace_file

BENCH_FIGURES = """\
figures (one process, one run):
  engine        whose step a row's first figures are: graph (the captured CUDA
                graph), else reference (no graph engine here, e.g. the CPU)
  median, p90   ms per decode step: the graph engine's step replayed --steps
                times (CUDA events), the reference's --baseline-steps times
                (synchronised wall clock); every row at the given context, the
                KV cache filled with random values, sampling included
  tokens/s      B / median step time
  copy BW       a buffer copy (read + write) timed at the start of the run:
                2 GiB device-to-device on CUDA, 256 MiB on the CPU
  floor ms      the fewest bytes the step must move (weights once, the routed
                experts B tokens are expected to touch, every row's KV), over
                the copy BW
  % of floor    floor / median: 100% would be a step at copy speed
  reference ms  the eager reference's median on the same (format, B, context);
  compiled ms   with --compiled, torch.compile's (CUDA graphs on CUDA)
  ×ref, ×comp   that baseline's median / the graph engine's median
  e2e ms/token  TPOT at batch B: B copies of a short chat prompt, --e2e-tokens
                tokens each (EOS ignored) through the engine's own loop: the
                median step once all B rows decode (host loop, sampling,
                detokenizer, stop checks included)
  TTFT          the median request's submission to first token (the B prompts
                prefill one after another, so it grows with B)
  prefill       TTFT of one prompt per --prefill-tokens length: chunked
                prefill + 1 token; on CUDA also TFLOP/s and MFU (against the
                BF16 matmul rate measured in the run) and, on the graph engine,
                the torch-ops baseline
  interleave    with --interleave 8k,32k: a running stream's time per token
                (p50, p99, max over the steps it took, their count shown) while
                those prompts arrive together, and their TTFT, with the engine's
                default pacing (100 ms of prefill per step) and untimed (one
                chunk a step); needs --buckets up to 1 + their count
  cold start    CLI entry to first token, split into checkpoint read, repack
                (GGUF), KV allocation, kernel-cache load, graph capture, first
                token and the rest (imports, tokenizer; synthetic --preset
                weights are made in memory, so no checkpoint read)
  kernels/step  kernel nodes in each bucket's captured decode graph
--json FILE keeps every figure with the machine (GPU, driver, torch,
cuda-bindings, CuTe DSL), the config hash and the git revision; --compare
A.json B.json prints what changed, B against A (warning when the GPU, model
or settings differ)."""

# The slowest kernels `flint-graph trace` lists, on screen and in --html alike (they were 20 and
# 15: the page disagreed with the terminal about the same step).
TOP_KERNELS = 20

TRACE_FIGURES = """\
figures:
  #, index      the kernel's place in the step's launch order
  start µs      where its time begins, from the step's first kernel start
  µs            its share of the step: from its start or the previous
                kernel's end, whichever is later, to its end (under PDL a
                kernel starts early and waits for its predecessor; the wait is
                not counted; span_us in the JSON is the raw duration). Graph
                engine: CUPTI kernel records (torch.profiler) of CUDA-graph
                replays; reference engine: wall clock around each top-level op
                (synchronised on CUDA). The step shown is the median-length one
                of --steps.
  MB            bytes (10^6) the kernel must move: weights, KV, activations
  % BW          MB / µs as a fraction of the copy bandwidth measured in this
                run (a read-only kernel may exceed a read + write copy)
  share         µs / the step's time (first kernel start to last kernel end)
  count         kernels of that kind
  kinds         embedding, attention, gemv, moe, norm, lm_head, sampling,
                other; gap = step time covered by no kernel (launch latency,
                bubbles); kinds and gap add up to the step
  floor µs      the kind's MB / copy bandwidth
  graph nodes   node types of the captured graph; kernels/step its kernels
                ("-" on the reference engine, which has no graph)
--out FILE writes the JSON, which is also a Chrome-trace / Perfetto timeline
(open it at ui.perfetto.dev or chrome://tracing); --html FILE a
self-contained page plotting the step by kind against the floor; --compare
A.json B.json diffs two saved traces."""


def _ints(text: str, what: str, shown: str | None = None) -> tuple[int, ...]:
    """Comma-separated ints ≥ 1, each once; `shown` is the text as the user typed it (for the
    error), when `text` is a rewriting of it."""
    try:
        vals = tuple(plain_int(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what} >= 1, found {text!r}")
    refuse_repeats(vals, shown or text)
    return vals


def _contexts(text: str) -> tuple[int, ...]:
    """--contexts: token counts; 8K / 100k style suffixes allowed."""
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        mult = 1024 if p.endswith("k") else 1
        try:
            out.append(plain_int(p[:-1] if mult > 1 else p) * mult)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated token counts (e.g. "
                                             f"1024,8192 or 1k,8k), found {text!r}") from None
    return _ints(",".join(map(str, out)), "token counts", text)


def _context(text: str) -> tuple[int]:
    """trace --context: one token count (8K style suffix allowed), as a 1-tuple."""
    if "," in text:
        raise argparse.ArgumentTypeError(f"trace takes one value, found {text!r}")
    try:
        return _contexts(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a token count >= 1 (e.g. 1024 or 8k), "
                                         f"found {text!r}") from None


def _path(text: str) -> Path:
    """A file flag's value; an empty one (Path("") is ".") is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name, found {text!r}")
    if text == "-":  # not stdout: the tables and the progress already go there
        raise argparse.ArgumentTypeError("'-' is not taken for stdout here (the tables go "
                                         "there); expected a file name, e.g. report.json")
    if text.endswith(("/", os.sep)):  # Path() drops it: `--json new/` wrote a file "new"
        raise argparse.ArgumentTypeError(f"{text!r} names a directory (it ends with /); "
                                         "expected a file name")
    return Path(usable_name(text))


def _format(text: str) -> tuple[str]:
    """trace --format: one weight format, as a 1-tuple (the error names the two values)."""
    if text.strip() not in ("bf16", "nvfp4"):
        raise argparse.ArgumentTypeError(f"expected bf16 or nvfp4 (trace takes one), found "
                                         f"{text!r}")
    return (text.strip(),)


def _formats(text: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(","))
    if not vals or any(v not in ("bf16", "nvfp4") for v in vals):
        raise argparse.ArgumentTypeError(f"expected bf16, nvfp4 or bf16,nvfp4, found {text!r}")
    refuse_repeats(vals, text, "format")
    return vals


def _common(p: argparse.ArgumentParser, positive_int) -> None:
    p.add_argument("model", nargs="?", metavar="MODEL", type=model_path,
                   help="a BF16 checkpoint directory or NVFP4 .gguf file (its config.json "
                        "beside it); default: synthetic weights of --preset made in memory")
    p.add_argument("--preset", choices=("tiny", "nano", "full"),
                   help="config of the synthetic weights when no MODEL is given (default: "
                        "tiny; full = the 40B shape, needs a large GPU)")
    p.add_argument("--device", metavar="DEV", help="cuda or cpu (default: cuda when present)")
    p.add_argument("--engine", choices=("auto", "graph", "reference"), default="auto",
                   help="engine under test: graph (CUDA + kernel cache), reference, or auto "
                        "(graph where it can run; default)")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the synthetic weights")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="hide progress bars")
    # the default named here is attn_decode.FOLD_QK's (a test holds them equal: importing the
    # kernel module here would load torch for every --help)
    p.add_argument("--attn-fold", choices=("on", "off"),
                   help="which decode attention the graph engine (GPU) runs, to compare the "
                        "two: off = a separate kernel does each layer's query/key norm, "
                        "rotary position encoding and KV-cache write before attention; on = "
                        "the attention kernel does them itself, one launch a layer fewer; the "
                        "same output up to rounding either way; no effect on the CPU "
                        "(default: off)")


def add_bench_parser(sub, positive_int, buckets) -> None:
    """`flint-graph bench`."""
    p = sub.add_parser("bench", help="decode latency per bucket and context against the roofline "
                                     "and the eager reference; e2e, prefill, TTFT, cold start",
                       description=textwrap.fill(
                           "Benchmark the decode runtime in one run: decode step times per "
                           "batch bucket and context, next to the roofline floor and the eager "
                           "reference; end-to-end TPOT, TTFT, prefill and cold start.", 79),
                       epilog=BENCH_FIGURES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, positive_int)
    p.add_argument("--formats", type=_formats, metavar="F,F",
                   help="weight formats of the synthetic weights (default: bf16,nvfp4; a "
                        "checkpoint has its own)")
    p.add_argument("--buckets", type=buckets, default=(1, 2, 4, 8), metavar="B,B,...",
                   help="batch buckets (default: 1,2,4,8)")
    p.add_argument("--contexts", type=_contexts, metavar="N,N,...",
                   help="context lengths in tokens, e.g. 1k,8k,32k,100000 (default: "
                        "1024,8192,32768,100000, those below the model's limit)")
    p.add_argument("--steps", type=positive_int, default=50, metavar="N",
                   help="timed replays per graph cell (default: %(default)s)")
    p.add_argument("--baseline-steps", type=positive_int, default=3, metavar="N",
                   help="timed steps per reference cell (default: %(default)s)")
    p.add_argument("--compiled", action="store_true",
                   help="also time the reference under torch.compile (CUDA graphs on CUDA; "
                        "slow to compile)")
    p.add_argument("--e2e-tokens", type=positive_int, default=64, metavar="N",
                   help="tokens per request in the end-to-end run (default: %(default)s)")
    p.add_argument("--prefill-tokens", type=_contexts, metavar="N,N,...",
                   help="prompt lengths of the prefill timing, e.g. 512,2k,8k,32k (default: "
                        "8192, or half the model's limit when smaller)")
    p.add_argument("--interleave", type=_contexts, metavar="N,N,...",
                   help="prompt lengths arriving together while a stream decodes, e.g. "
                        "8k,32k (default: none; see interleave in the figures below)")
    p.add_argument("--json", type=_path, metavar="FILE", help="write every figure as JSON")
    p.add_argument("--markdown", type=_path, metavar="FILE", help="write the tables as markdown")
    p.add_argument("--compare", type=_path, nargs=2, metavar=("A.json", "B.json"),
                   help="print what changed from run A to run B (runs nothing)")
    p.set_defaults(command="bench")


def add_trace_parser(sub, positive_int, buckets) -> None:
    """`flint-graph trace`."""
    p = sub.add_parser("trace", help="one decode step per kernel: times, bytes, bandwidth, "
                                     "totals per kind, a Perfetto timeline",
                       description=textwrap.fill(
                           "Trace the decode step: per kernel its layer, kind, time, bytes and "
                           "bandwidth; totals per kind with the gaps; the graph's kernel count; "
                           "a Chrome-trace/Perfetto timeline.", 79),
                       epilog=TRACE_FIGURES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, positive_int)
    p.add_argument("--format", dest="formats", type=_format,
                   metavar="F", help="weight format of the synthetic weights (default: nvfp4; "
                                     "a checkpoint has its own)")
    def batch(text: str) -> tuple[int]:
        """trace --batch: one batch bucket, as a 1-tuple (its error words one value)."""
        if "," in text:
            raise argparse.ArgumentTypeError(f"trace takes one value, found {text!r}")
        try:
            return buckets(text)
        except argparse.ArgumentTypeError as e:
            if "comma-separated" not in str(e):  # e.g. above 8: its own words fit one value
                raise
            raise argparse.ArgumentTypeError(f"expected one batch size >= 1 (e.g. 1 or 8), "
                                             f"found {text!r}") from None

    p.add_argument("--batch", type=batch, default=(1,), metavar="B",
                   help="batch bucket (default: 1)")
    p.add_argument("--context", type=_context, default=(1024,), metavar="N",
                   help="tokens in every row's KV cache (default: 1024)")
    p.add_argument("--steps", type=positive_int, default=5, metavar="N",
                   help="steps traced; the one of median length is reported (default: %(default)s)")
    p.add_argument("--prefill", type=positive_int, metavar="N",
                   help="trace one N-token prefill (the graph engine's GPU prefill, in the "
                        "engine's chunks) instead of a decode step; its kernels kinded by name")
    p.add_argument("--top", type=positive_int, default=TOP_KERNELS, metavar="N",
                   help="slowest kernels listed, on screen and in --html (default: "
                        "%(default)s)")
    p.add_argument("--out", type=_path, metavar="FILE",
                   help="write the trace JSON (also a Perfetto / chrome://tracing timeline)")
    p.add_argument("--html", type=_path, metavar="FILE",
                   help="write a self-contained HTML plot of the step by kind vs the floor")
    p.add_argument("--compare", type=_path, nargs=2, metavar=("A.json", "B.json"),
                   help="diff two saved traces (runs nothing)")
    p.set_defaults(command="trace")


# what --preset and --formats (trace: --format) mean when not given
SYNTHETIC_DEFAULTS = {"preset": "tiny", "bench": ("bf16", "nvfp4"), "trace": ("nvfp4",)}


def _synthetic_flags(args, command: str) -> None:
    """Fill --preset and --formats with their defaults; with MODEL, a note that the ones given
    are not used (`trace MODEL --format bf16 --preset full` ignored both in silence, a
    bad-input trial of 2026-12-06: a checkpoint has its own config and weight format)."""
    flag = "--format" if command == "trace" else "--formats"
    named = [f for f, v in (("--preset", args.preset), (flag, args.formats)) if v is not None]
    if "seed" in getattr(args, "given", ()):  # it seeds the synthetic weights only (a re-trial)
        named.append("--seed")
    if args.model is not None and named:
        print(f"flint-graph: note: {', '.join(named[:-1]) + ' and ' if named[:-1] else ''}"
              f"{named[-1]} "
              f"{'describe' if len(named) > 1 else 'describes'} the synthetic weights made "
              f"when no MODEL is given; {args.model} has its own config and weight format, so "
              f"{'they are' if len(named) > 1 else 'it is'} not used", file=sys.stderr)
    args.preset = args.preset or SYNTHETIC_DEFAULTS["preset"]
    args.formats = args.formats or SYNTHETIC_DEFAULTS[command]


def _options(args, command: str):
    from flint_graph.perf.bench import BenchOptions

    o = BenchOptions(model=args.model, preset=args.preset, formats=args.formats,
                     device=args.device, engine=args.engine, seed=args.seed,
                     progress=args.progress, t_entry=getattr(args, "t_entry", None),
                     command=command, steps=args.steps,
                     attn_fold=None if args.attn_fold is None else args.attn_fold == "on")
    return o


def check_outputs(args, flags: tuple[str, ...], compare_runs: bool = False,
                  own: dict | None = None) -> None:
    """Before any work: each output flag names a writable file, no two name the same one, and
    none overwrites a file of the checkpoint being measured (MODEL, or its directory's files)
    or the --compare report. Unless `compare_runs` (eval: --compare holds a new run to a saved
    one), also refuses output flags beside --compare, which then writes nothing. `own` maps a
    flag to (kind, recognise): an existing non-empty file there is replaced only when
    recognise(path) is true (an earlier output of that kind), never another file. Raises
    InvalidRequestError naming the flag."""
    from flint_graph.errors import InvalidRequestError

    given = {f: getattr(args, f.lstrip("-").replace("-", "_")) for f in flags}
    given = {f: p for f, p in given.items() if p is not None}
    if args.compare and given and not compare_runs:
        raise InvalidRequestError(f"{', '.join(given)}: --compare reads two saved files and "
                                  "writes nothing; run without it to measure")
    model = Path(args.model).resolve() if args.model else None
    inside = model if model and model.is_dir() else model.parent if model else None
    seen: dict[Path, str] = {}
    for flag, path in given.items():
        try:
            _check_output(args, flag, path, seen, model, inside, own)
        except (OSError, RuntimeError) as e:  # ENAMETOOLONG; RuntimeError: a symlink loop
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise InvalidRequestError(f"{flag} {path}: cannot write there ({why})") from None


def _check_output(args, flag: str, path: Path, seen: dict, model: Path | None,
                  inside: Path | None, own: dict | None) -> None:
    """`check_outputs` for one flag; raises InvalidRequestError, or OSError / RuntimeError
    from the file system (named by the caller)."""
    from flint_graph.errors import InvalidRequestError

    if not str(path).strip():
        raise InvalidRequestError(f"{flag}: expected a file name, found an empty path")
    # opening a FIFO for the probe below would block until a reader comes; a device or a
    # pipe (/dev/full, /dev/stdout into a pipe) fails only after the run: refuse them now
    if path.exists() and not path.is_file() and not path.is_dir() \
            and os.path.realpath(path) != os.devnull:
        raise InvalidRequestError(f"{flag} {path}: not a regular file (a pipe, device or "
                                  "socket); expected a file name (/dev/null discards)")
    full = path.resolve()
    if full.is_file() and _is_std_stream(full):
        # `--json /dev/stdout > out.txt`: the report renamed over out.txt would leave the
        # tables printed after it in a file without a name (a bad-input trial, 2026-12-06)
        raise InvalidRequestError(f"{flag} {path}: is where this command's output goes "
                                  f"({full}); write the report to a file of its own")
    if os.path.realpath(full) == os.devnull:
        return  # discards: any flag may name it, and no probe is needed
    if full in seen:
        raise InvalidRequestError(f"{flag} and {seen[full]} name the same file {path}; "
                                  "give each its own")
    seen[full] = flag
    if full.is_dir():
        raise InvalidRequestError(f"{flag} {path}: is a directory; expected a file name")
    if args.compare and (full == Path(args.compare).resolve() or (
            full.exists() and Path(args.compare).exists()
            and os.path.samefile(full, args.compare))):  # a hard link is the same file
        raise InvalidRequestError(f"{flag} {path}: is the --compare report; write the new "
                                  "one elsewhere so the reference is kept")
    if model and (full == model or (full.exists() and full.parent == inside)):
        raise InvalidRequestError(f"{flag} {path}: would overwrite a file of the checkpoint "
                                  f"{args.model}; write it elsewhere")
    above = next(a for a in full.parents if a.exists())
    if not above.is_dir():
        raise InvalidRequestError(f"{flag} {path}: cannot write there ({above} is a file, "
                                  "not a directory)")
    existed = full.exists()
    if existed and flag in (own or {}) and full.stat().st_size \
            and not own[flag][1](full):
        raise InvalidRequestError(f"{flag} {path}: exists and is not {own[flag][0]}; choose "
                                  "another name, or delete it first")
    missing = [a for a in full.parents if not a.exists()]  # the deepest first
    try:
        try:  # a real probe: permission bits say little to root or on /proc
            full.parent.mkdir(parents=True, exist_ok=True)
            if existed:  # (a missing target is not created here: another run finishing now
                with open(full, "a"):  # could rename its report there, and our unlink of
                    pass  # the probe would delete it, a bad-input trial of 2026-12-06)
        except OSError as e:
            raise InvalidRequestError(f"{flag} {path}: cannot write there "
                                      f"({e.strerror or e})") from None
        try:  # the report is written beside the target and renamed over it (replace_file)
            fd, tmp = tempfile.mkstemp(dir=full.parent)
            os.close(fd)
            os.unlink(tmp)
        except OSError as e:
            raise InvalidRequestError(f"{flag} {path}: cannot create a file in {full.parent} "
                                      f"({e.strerror or e}); the report is written beside its "
                                      "target and renamed over it") from None
    finally:  # a run refused later (a bad MODEL) must leave no directory behind (trial)
        for d in missing:
            with contextlib.suppress(OSError):
                d.rmdir()


def _is_std_stream(path: Path) -> bool:
    """Whether `path` is the file standard output or standard error goes to (a redirect)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    for fd in (1, 2):
        try:
            o = os.fstat(fd)
        except OSError:
            continue
        if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
            return True
    return False


def write_outputs(outputs: list[tuple[str, Path | None, Any]]) -> list[str]:
    """Write each (flag, path, text or a function making it) whose path is set, making its
    missing directories as `mkdir -p` does (a note names the top one, so a typo shows);
    returns one message per file that could not be written ("--json out.json: cannot write
    the file (…)"). None is raised: a run's figures are never lost to one bad output (the
    tables are printed after). bench, trace and eval write through it."""
    failed = []
    for flag, path, text in outputs:
        if path is None:
            continue
        path = path.resolve()  # "new/../x.json" must not make new/ (a bad-input trial)
        missing = [a for a in path.parents if not a.exists()]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # never truncate an earlier report before the new one is whole: a full disk left
            # an invalid half-file where the previous report was (a bad-input trial)
            replace_file(path, text() if callable(text) else text)
            if missing:  # made for the output, as `mkdir -p` would: said, so a typo shows
                print(f"flint-graph: note: {flag}: created the directory {missing[-1]}",
                      file=sys.stderr)
        except OSError as e:
            failed.append(f"{flag} {path}: cannot write the file ({e.strerror or e}); the "
                          "figures are in the tables above")
    return failed


def _finish(console, failed: list[str], wrote: list[str]) -> int:
    """Print what was written, then each write failure on stderr; exit status 2 if any."""
    from flint_graph.errors import terminal_safe

    for line in wrote:  # a path the user typed: shown, never obeyed as control or rich markup
        console.print(terminal_safe(line), markup=False, highlight=False)
    for message in failed:
        print(f"flint-graph: error: {terminal_safe(message)}", file=sys.stderr)
    return 2 if failed else 0


def _command_line() -> str:
    return "flint-graph " + " ".join(sys.argv[1:])


# Wide enough for any table of ours on one line a row; rich stops a row at the console's width.
PIPED_WIDTH = 4096


def report_console():
    """The rich Console that bench, trace and eval print their reports on. In a terminal it
    takes the terminal's width. Piped or redirected, it takes the tables' own width: rich would
    use 80 columns (or the width of the terminal stdin is on), folding kernel names and
    figures mid-word ("attentio|n") in output that is kept, grepped or pasted."""
    from rich.console import Console

    class ReportConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here, the code of a missed --check target (`eval | head -1` ended
            # 1 with no word, a bad-input trial of 2026-12-06): the reader left, which
            # flint_graph.cli.main answers as for generate, exit 0
            self.quiet = True
            raise BrokenPipeError

    # emoji=False: a saved file's ":thumbs_up:" is text, not a picture (a re-trial)
    console = ReportConsole(emoji=False)
    return console if console.is_terminal else ReportConsole(width=PIPED_WIDTH, emoji=False)


def saved_json(schema: str):
    """A recogniser for check_outputs' `own`: whether a file is a saved JSON of `schema`
    ("flint-graph-bench", "flint-graph-trace"), which its flag may replace."""
    def recognise(path: Path) -> bool:
        from flint_graph.perf.bench_report import read_json

        try:
            read_json(path, schema)
        except Exception:  # noqa: BLE001 - any reason it is not ours: keep the file
            return False
        return True
    return recognise


SEAL = "<!-- flint-graph {what}; sha256 of the text above: {digest} -->\n"
SEAL_MAX_BYTES = 64 << 20  # a report is a few hundred KB


def seal(text: str, what: str) -> str:
    """`text` (ending in a newline) with a last line naming `what` wrote it and the sha256 of
    everything before that line: what `sealed_as` recognises as our own earlier output."""
    # the bytes replace_file writes (argv's undecodable bytes come back as themselves)
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    return text + SEAL.format(what=what, digest=digest)


def sealed_as(what: str):
    """A recogniser for check_outputs' `own`: whether a file is one `seal(…, what)` wrote,
    unchanged since (its last line's digest matches the text above it). A file that only
    begins like a report, or quotes one, or was a report and has been edited, is a user's
    (bad-input trials: `bench --markdown notes.md` replaced notes quoting, and then notes
    beginning with, a report's first line)."""
    def recognise(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                data = f.read(SEAL_MAX_BYTES + 1)
        except OSError:
            return False
        if len(data) > SEAL_MAX_BYTES or not data.endswith(b" -->\n"):
            return False
        body, _, last = data[:-1].rpartition(b"\n")
        body += b"\n"
        want = SEAL.format(what=what, digest=hashlib.sha256(body).hexdigest()).encode()
        return last + b"\n" == want
    return recognise


# What each output flag of bench and trace may replace: only an earlier output of its own kind
# (a bad-input trial saw `bench --json notes.txt` and `trace --out report.json` replace a
# user's file and an eval report without a word).
OWN_OUTPUTS = {
    "bench": {"--json": ("a flint-graph bench JSON", saved_json("flint-graph-bench")),
              "--markdown": ("a flint-graph bench markdown report",
                             sealed_as("bench markdown"))},
    "trace": {"--out": ("a flint-graph trace JSON", saved_json("flint-graph-trace")),
              "--html": ("a flint-graph trace HTML plot",
                         sealed_as("trace html"))},
}


def _start(args, report, outputs: tuple[str, ...], own: dict | None = None):
    """Check the output flags (`own` as check_outputs takes it); with --compare print the
    comparison (report: bench_report or trace_report) and return None, else the rich Console
    the run prints on."""
    console = report_console()
    check_outputs(args, outputs, own=own)
    if not args.compare:
        return console
    if ignored := _measuring_flags_given(args):
        from flint_graph.errors import InvalidRequestError

        raise InvalidRequestError(f"{', '.join(ignored)}: --compare reads two saved files and "
                                  "measures nothing; run without it to measure")
    a, b = (report.load(p) for p in args.compare)
    if args.command == "trace":
        report.print_compare(a, b, console, top=args.top)
    else:
        report.print_compare(a, b, console)
    return None


# flags that shape how a comparison is shown, not what a run measures
_SHOWN_WITH_COMPARE = {"help", "compare", "command", "progress", "top"}


def _measuring_flags_given(args) -> list[str]:
    """The flags (and MODEL) of `args.command` set to other than their defaults that only a
    measuring run uses: --compare would ignore them (`bench MODEL --compare A B --buckets 1`
    compared the files without a word: a bad-input trial). Output flags are check_outputs'."""
    from flint_graph.cli_args import build_parser

    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    given = getattr(args, "given", None)  # set by flint_graph.cli.main: typed, at any value

    def typed(a) -> bool:
        return a.dest in given if given is not None else \
            getattr(args, a.dest, a.default) != a.default
    return [a.option_strings[0] if a.option_strings else a.metavar
            for a in sub._actions if a.dest not in _SHOWN_WITH_COMPARE and typed(a)]


def run_bench_cmd(args) -> int:
    """Run (or compare) benchmarks; print the tables; write --json / --markdown."""
    from flint_graph.perf import bench_report

    console = _start(args, bench_report, ("--json", "--markdown"), OWN_OUTPUTS["bench"])
    if console is None:
        return 0
    from flint_graph.perf.bench import run_bench

    _synthetic_flags(args, "bench")
    o = _options(args, _command_line())
    o.buckets, o.contexts = args.buckets, args.contexts
    o.baseline_steps, o.compiled = args.baseline_steps, args.compiled
    o.e2e_tokens, o.prefill_tokens = args.e2e_tokens, args.prefill_tokens
    o.interleave = args.interleave
    res = run_bench(o)
    # files first: the figures survive whatever happens to the tables, and the tables whatever
    # happens to a file (a full disk)
    failed = write_outputs([("--json", args.json, json.dumps(res, indent=1) + "\n"),
                         ("--markdown", args.markdown,
                          lambda: seal(bench_report.markdown(res) + "\n", "bench markdown"))])
    bench_report.print_report(res, console)
    done = [f"wrote {p}" for f, p in (("--json", args.json), ("--markdown", args.markdown))
            if p and not any(m.startswith(f"{f} ") for m in failed)]
    return _finish(console, failed, done)


def run_trace_cmd(args) -> int:
    """Trace (or compare traces); print the breakdown; write --out / --html."""
    from flint_graph.perf import trace_report

    console = _start(args, trace_report, ("--out", "--html"), OWN_OUTPUTS["trace"])
    if console is None:
        return 0
    from flint_graph.errors import InvalidRequestError
    from flint_graph.perf.trace import run_trace

    _synthetic_flags(args, "trace")
    for flag, vals in (("--batch", args.batch), ("--context", args.context),
                       ("--format", args.formats)):
        if len(vals) != 1:
            raise InvalidRequestError(f"{flag}: trace takes one value, found "
                                      f"{','.join(map(str, vals))}")

    o = _options(args, _command_line())
    o.buckets, o.contexts = args.batch, args.context
    o.trace_prefill = args.prefill
    o.nvfp4_flag = "--format nvfp4"
    if args.prefill:  # the KV cache must hold the prompt
        o.contexts = (max(args.context[0], args.prefill),)
    tr = run_trace(o)
    failed = write_outputs([("--out", args.out,
                          lambda: json.dumps(trace_report.to_file_json(tr)) + "\n"),
                         ("--html", args.html,
                          lambda: seal(trace_report.html_plot(tr, top=args.top), "trace html"))])
    trace_report.print_trace(tr, console, top=args.top)
    ok = {f: p for f, p in (("--out", args.out), ("--html", args.html))
          if p and not any(m.startswith(f"{f} ") for m in failed)}
    done = ([f"wrote {ok['--out']} (open it at ui.perfetto.dev or chrome://tracing)"]
            if "--out" in ok else []) + ([f"wrote {ok['--html']}"] if "--html" in ok else [])
    return _finish(console, failed, done)
