"""The `eval` subcommand of `flint-graph`: its flags (imported while the CLI starts, so nothing
heavy here) and what it runs (nano/evals.py holds the suite)."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from flint_graph.cli_args import RepeatedValue, hf_config_dir, model_path, seed_int

EVAL_FIGURES = """\
figures (held-out cases of the flint-nano curriculum, greedy decoding):
  tools valid   one call parsed, to a declared tool, with the schema's
                required arguments each of its declared type
  tools exact   valid, and the intended tool with exactly the intended
                arguments
  tools-direct  3-digit arithmetic with the tools offered: answered exactly,
                without calling a tool
  arith         3-digit addition and subtraction answered exactly
  recall@C      a key-value list of about C tokens, one question for a key
                more than C/2 tokens back; the value answered exactly
  chain-tools   a held-out tool request as the second request of a chat,
                after an answered arithmetic one; scored as tools
  chain-arith   3-digit arithmetic as the second request, after a tool
                request with its result and answer; scored as arith
  chat-chain3   (suite chat, not run by default) 3-digit arithmetic as the
                third request, after a tool request and an arithmetic one
  chat-negative (chat) a - b with a < b, 3 digits: the negative answer
  chat-list     (chat) a pasted list of 4-40 key = value lines, one
                question; tools offered in every other case
  phr-tools     (suite phrasing, not run by default; sentences no training
                template produces) a weather question without a unit or
                day count, or a conversion with unit names in words;
                scored as tools
  phr-arith     (phrasing) a word problem or terse sum, 3 digits
  phr-greet     (phrasing) a greeting or small talk: answered with one of
                the trained replies, no tool call, not cut off
  phr-refuse    (phrasing) a request outside the skills: as phr-greet,
                and the answer starts "I can't"
  phr-multi     (phrasing) a greeting answered, then a phr-tools request
  result        (suite result, not run by default) the turn after a tool
                call: the tool's JSON answered as "Result: <JSON>" exactly
  targets       tools valid >= 95% and exact >= 90%, arith >= 90%,
                recall@4096 >= 90% (what flint-nano is trained to);
                phr-tools exact and phr-arith >= 90%, phr-greet and
                phr-refuse 100%
Answers cut off by the token limit are counted under the table.
--compare REF.json holds this run to a saved one (e.g. the reference
engine's) on the cases both runs have (the same --seed; a smaller --n or
fewer --contexts compares that subset, and the verdict says how many): it
passes when every metric is within noise (the two differ by at most two
standard errors of their difference), at
least 95% of the answers are identical, and the log-probabilities of the
tokens both decoded alike differ by at most 2.6e-4 nats on average (by 0 when
the same engine, device kind, --batch, --threads and cases made both runs).
It also prints the mean |Δ| of each step's top-5 log-probabilities (reports
keep them), informational until its tolerance is measured. A reference made
from other weights is refused (its "weights" fingerprint covers the norms,
sinks and biases: alike in BF16 and NVFP4, moved by any training step; weights
differing only in their matrices are not told apart), and so is one made with
another --plant: make a new one after retraining. Runs repeat bit for bit:
eval prefills one chunk a step, never a timed share.
--plant BUG runs with a deliberate bug (window-1, no-sink, rope-on-nope,
router-bias-bf16) to show the suite catches it.
Exit status: 0; 1 with --check when a target is missed or the --compare
fails; 2 for bad input."""


DEFAULT_CONTEXTS = (1024, 4096, 16384)  # eval --contexts


def add_eval_parser(sub, positive_int) -> None:
    """`flint-graph eval`."""
    from flint_graph.cli_args import thread_count
    from flint_graph.nano.plants import PLANTS
    from flint_graph.perf.cli import _path

    p = sub.add_parser("eval", help="accuracy suite: tool calls, arithmetic, long-context "
                                    "recall, two-request chats (flint-nano's skills; --suite "
                                    "phrasing: greetings and paraphrases), on any engine",
                       description=textwrap.fill(
                           "Score a checkpoint on held-out tool-calling, arithmetic, "
                           "long-context recall and two-request chat cases through the chat "
                           "API, on the chosen engine (--suite chat, phrasing, result and "
                           "follow add more: a third request, greetings, out-of-scope requests, "
                           "paraphrased skills, the answer to a tool's result and follow-ups "
                           "that point back at the last answer); compare "
                           "with a saved run.", 79),
                       epilog=EVAL_FIGURES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", metavar="MODEL", type=model_path,
                   help="BF16 checkpoint directory or NVFP4 .gguf (default: the embedded one)")
    p.add_argument("--hf-config-path", metavar="DIR", type=hf_config_dir,
                   help="directory with config.json, tokenizer and generation_config.json for "
                        "a GGUF (default: the GGUF's own directory)")
    p.add_argument("--suite", default="tools,arith,recall,chain", metavar="S,..",
                   help="suites to run, of tools, arith, recall, chain, chat, phrasing, "
                        "result and follow (default: %(default)s)")
    p.add_argument("--n", type=_case_count, default=50, metavar="N",
                   help=f"cases per suite and per recall context, 1 to {MAX_N} "
                        "(default: %(default)s: a GPU-sized run; on 2 CPU cores --n 10 "
                        "--contexts 1024,4096 takes about 4 minutes)")
    p.add_argument("--contexts", type=_recall_contexts, default=DEFAULT_CONTEXTS,
                   metavar="C,..",
                   help="recall contexts in tokens, e.g. 1024,4k (default: 1024,4096,16384)")
    p.add_argument("--seed", type=seed_int, default=0, help="case seed (default: 0)")
    p.add_argument("--batch", type=positive_int, default=8, metavar="B",
                   help="requests decoded together (default: %(default)s)")
    p.add_argument("--device", metavar="DEV", help="torch device (default: cuda when present)")
    p.add_argument("--engine", choices=("auto", "graph", "reference"), default="auto",
                   help="decode path (default: auto = graph where it can run)")
    p.add_argument("--threads", type=thread_count, metavar="N",
                   help="CPU threads for torch, at most 4 per CPU (default: as for chat's "
                        "--threads)")
    p.add_argument("--plant", choices=PLANTS, metavar="BUG",
                   help=f"run with a deliberate bug: {', '.join(PLANTS)}")
    p.add_argument("--json", type=_path, metavar="FILE", help="write the report and every case")
    p.add_argument("--compare", type=_path, metavar="REF.json",
                   help="hold this run to a saved report on the cases both have (same --seed "
                        "and weights; a smaller --n or fewer --contexts compares that subset)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 when a target is missed or the --compare fails")
    p.add_argument("--quiet", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(command="eval")


MAX_N = 10_000  # cases per group; more would take days on the reference engine


def _case_count(text: str) -> int:
    """--n: 1..MAX_N."""
    from flint_graph.cli_args import plain_int

    try:
        n = plain_int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_N:
        raise argparse.ArgumentTypeError(f"expected a case count from 1 to {MAX_N}, found "
                                         f"{text!r}")
    return n


def _recall_contexts(text: str) -> tuple[int, ...]:
    """--contexts: bench's token-count syntax (1024,4k), each at least 128 tokens."""
    from flint_graph.perf.cli import _contexts

    try:
        vals = _contexts(text)
    except RepeatedValue:
        raise
    except argparse.ArgumentTypeError:
        vals = (0,)
    if min(vals) < 128:
        raise argparse.ArgumentTypeError(f"expected comma-separated recall contexts of at "
                                         f"least 128 tokens (e.g. 1024,4k), found {text!r}")
    return vals


# on the CPU, a run past these says up front that it is long (README: `--n 10 --contexts
# 1024,4096` takes about 4 minutes on 2 cores, the default run well over an hour)
CPU_QUICK_N = 10
CPU_QUICK_CONTEXT = 4096


def cmd_eval(args) -> int:
    """Run the suite and print the table; exit status as EVAL_FIGURES says."""
    from flint_graph.api import LLM
    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.runtime.engine_config import EngineConfig, pick_device
    from flint_graph.errors import InvalidRequestError, counted
    from flint_graph.nano import evals
    from flint_graph.nano.plants import plant
    from flint_graph.perf.cli import check_outputs

    suites = evals.parse_suites(args.suite)
    contexts = args.contexts
    ref = _read_report(args.compare) if args.compare else None
    if ref is not None and ref.get("plant") is not None and ref["plant"] != args.plant:
        # a planted run is a bug on purpose: it judges nothing but a rerun of the same plant
        raise InvalidRequestError(
            f"--compare {args.compare}: made with --plant {ref['plant']} (a deliberate bug); "
            "hold runs to a clean reference, or pass the same --plant to check a rerun")
    # the cases and where --json can be written need no model: refused before the default one
    # is unpacked (in a fresh cache its note made a one-line error two lines)
    cases = evals.build_cases(suites, args.n, args.seed, contexts)
    model = args.model
    if model is None:
        check_outputs(args, ("--json",), compare_runs=True)
        from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

        # resolved before the full check below, so that --json cannot overwrite its files
        model = args.model = str(ensure_default_checkpoint(progress=args.progress))
    else:  # the CLI's words (a bare word is said to be read as MODEL)
        from flint_graph.cli import check_model_path

        check_model_path(model)
    check_outputs(args, ("--json",), compare_runs=True,
                  own={"--json": ("an eval report", _is_report)})
    common = {(c.group, c.index) for c in cases} & {(c["group"], c["index"])
                                                     for c in (ref or {}).get("cases", [])}
    theirs = [c["group"] for c in (ref or {}).get("cases", [])]
    if ref is not None and not common:
        raise InvalidRequestError(f"--compare {args.compare}: no case in common with this run "
                                  f"(it has {', '.join(dict.fromkeys(theirs))}; use the same "
                                  "--suite and --contexts)")
    if ref is not None:
        _same_cases(ref, cases, args)
    if "recall" not in suites and ("contexts" in getattr(args, "given", ())
                                   or contexts != DEFAULT_CONTEXTS):
        # `--suite arith --contexts 40000` ran without a word that the flag did nothing
        print(f"flint-graph: eval: note: --contexts sets the recall suite's prompt lengths; "
              f"this run has no recall suite ({','.join(suites)}), so it is not used",
              file=sys.stderr)
    device = pick_device(args.device)
    ckpt = load_checkpoint(model, args.hf_config_path, device, args.progress)
    weights = ckpt.weights.fingerprint()  # before a plant changes them
    _check_same_weights(ref, weights, args.compare)
    if args.plant:
        ckpt = plant(ckpt, args.plant)
    # no timed prefill budget: chunk boundaries that follow the timings round differently
    # from run to run (a rerun of the reference engine on the H200 differed by 1.2e-5 nats),
    # and --compare holds a rerun to 0
    llm = LLM.from_checkpoint(ckpt, device, EngineConfig(engine=args.engine,
                                                         cpu_threads=args.threads,
                                                         prefill_step_ms=None))
    limit = llm.engine.context_limit
    too_long = [c for c in contexts if "recall" in suites
                and c + evals.MAX_NEW_TOKENS["recall"] > limit]
    if too_long:
        raise InvalidRequestError(
            f"--contexts {too_long[0]}: a recall prompt of about that many tokens plus its "
            f"answer does not fit the model's context limit of {limit} tokens; use at most "
            f"{limit - evals.MAX_NEW_TOKENS['recall']}")
    if device.type == "cpu" and (args.n > CPU_QUICK_N or "recall" in suites
                                 and max(contexts) > CPU_QUICK_CONTEXT):
        # a new user ran the README's first eval line on the CPU: over an hour, with no word
        # of it but a bar at 0/400 (said after the checks that can refuse the run: a note
        # and then an error read as two verdicts, a bad-input trial)
        print(f"flint-graph: eval: {counted(len(cases), 'case')} on the CPU"
              + (f", recall prompts up to {max(contexts):,} tokens" if "recall" in suites
                 else "") + f": a long run (the default one takes well over an hour on 2 "
              f"cores); --n {CPU_QUICK_N} --contexts 1024,4096 takes about 4 minutes",
              file=sys.stderr)
    report = evals.run(llm, cases, args.batch, args.progress)
    report.update({"model": str(model), "format": ckpt.format.value, "engine": llm.engine.name,
                   "device": str(device), "plant": args.plant, "n": args.n, "seed": args.seed,
                   "suites": list(suites), "contexts": list(contexts), "batch": args.batch,
                   "threads": args.threads, "weights": weights})
    if ref is not None:
        report["compare"] = evals.compare(report, ref)
    from flint_graph.perf.cli import write_outputs

    # the output check's probe passes on /dev/full; the run's answers are printed below
    failed = write_outputs([("--json", args.json, lambda: json.dumps(report, indent=1) + "\n")])
    if failed:
        print(f"flint-graph: error: {failed[0]}", file=sys.stderr)
        _print(report)
        return 2
    _print(report)
    missed = [t for t in report["targets"] if not t["met"] and t.get("judged", True)]
    failed = ref is not None and not report["compare"]["passed"]
    return 1 if args.check and (missed or failed) else 0


def _check_same_weights(ref: dict | None, weights: str, path: Path | None) -> None:
    """Refuse a --compare reference made from other weights (its "weights" fingerprint,
    FlintWeights.fingerprint: the norms, sinks and biases, which any training step moves;
    weights differing only in their matrices are not told apart): its log-probabilities cannot
    judge this run's. Reports written before the fingerprint (2026-12-03) are taken with a
    warning. Raises InvalidRequestError."""
    from flint_graph.errors import InvalidRequestError

    if ref is None:
        return
    theirs = ref.get("weights")
    if theirs is None:
        print(f"flint-graph: warning: --compare {path}: the report does not say which weights "
              "made it (written before eval recorded them); make sure they are this run's",
              file=sys.stderr)
    elif theirs != weights:
        raise InvalidRequestError(
            f"--compare {path}: made from other weights (fingerprint {theirs}; this checkpoint "
            f"has {weights}), so its answers and log-probabilities cannot judge this run; make "
            "a new reference with `flint-graph eval MODEL --engine reference --json REF.json`")


def _target(share: float) -> str:
    """A target share as the report shows it: "≥90%", or "100%" (nothing can exceed it)."""
    return "100%" if share >= 1 else f"≥{100 * share:.0f}%"


def _verdict(target: dict) -> str:
    """A target's cell: met / MISSED, or not judged below `evals.judge_min_n` cases (reports
    written before the rule have no "judged" and are judged)."""
    if not target.get("judged", True):
        from flint_graph.nano.evals import judge_min_n

        return f"not judged (n < {judge_min_n(target.get('target', 1.0))})"
    return "met" if target["met"] else "MISSED"


# a report holds every case's answer and log-probabilities: ~13 KB a case (480 cases: 6.1 MB);
# what it may take parsed is bounded too (jsonfile.PARSED_MAX_BYTES: reports to ~200 MB)
REPORT_MAX_BYTES = 1 << 30


def _is_report(path: Path) -> bool:
    """Whether `path` holds an eval report (what --json may replace; a bad-input trial saw an
    unrelated JSON file overwritten without notice)."""
    try:
        _read_report(path)
    except Exception:  # noqa: BLE001 - any reason it is not a report: keep the file
        return False
    return True


def _read_report(path: Path) -> dict:
    from flint_graph.errors import InvalidRequestError
    from flint_graph.nano.evals import check_report

    from flint_graph.checkpoints.jsonfile import read_capped

    try:
        rep = read_capped(path, REPORT_MAX_BYTES)
    except (OSError, ValueError) as e:
        # an OSError's own text repeats the path ("[Errno 2] No such file …: '/x.json'")
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise InvalidRequestError(f"--compare {path}: cannot read an eval report ({why})") \
            from None
    return check_report(rep, f"--compare {path}")


def _top_k() -> int:
    from flint_graph.nano.evals import TOP_LOGPROBS

    return TOP_LOGPROBS


def _print(report: dict, console=None) -> None:
    """The header line, the table of scores and the --compare verdict, on `console` (default:
    bench's and trace's report console)."""
    from flint_graph.errors import counted

    from rich.markup import escape
    from rich.table import Table

    from flint_graph.perf.cli import report_console

    console = console or report_console()
    # The header names the checkpoint for the user to copy (README): printed above the table,
    # unwrapped, since as the table's title it was folded to the table's 43 columns, mid-hash.
    console.print(escape(f"eval: {report['model']} ({report['format']}, {report['engine']} "
                         f"engine{', plant ' + report['plant'] if report['plant'] else ''}), "
                         f"{report['seconds']} s of decoding"), soft_wrap=True,
                  highlight=False)
    t = Table()
    cmp_rows = {(r["group"], r["metric"]): r for r in report.get("compare", {}).get("rows", [])}
    for col in ("suite", "n", "metric", "score", "target") + (("reference", "Δ points (noise)")
                                                               if cmp_rows else ()):
        t.add_column(col, justify="left" if col in ("suite", "metric") else "right")
    targets = {(x["group"], x["metric"]): x for x in report["targets"]}
    for grp, g in report["groups"].items():
        for m in ("valid", "exact", "correct"):
            if m not in g:
                continue
            tg = targets.get((grp, m))
            row = [grp, str(g["n"]), m, f"{100 * g[m]:.1f}%",
                   "" if tg is None else f"{_target(tg['target'])} {_verdict(tg)}"]
            if cmp_rows:
                c = cmp_rows.get((grp, m))
                row += ["", ""] if c is None else [
                    f"{100 * c['reference']:.1f}%",
                    f"{100 * c['diff']:+.1f} (±{100 * c['noise']:.1f})"
                    f"{'' if c['within'] else ' OUTSIDE'}"]
            t.add_row(*row)
    console.print(t)
    cut = {grp: g["length_hits"] for grp, g in report["groups"].items() if g.get("length_hits")}
    if cut:
        print(f"answers cut off by the token limit: {sum(cut.values())} ("
              + ", ".join(f"{grp} {k}" for grp, k in cut.items()) + ")")
    if "compare" in report:
        c = report["compare"]
        agree_ok = c["identical_answers"] >= c["agree_min"]
        print(f"identical answers: {100 * c['identical_answers']:.1f}% of {c['compared']} "
              f"(pass ≥ {100 * c['agree_min']:.0f}%: {'ok' if agree_ok else 'TOO FEW'})")
        print(f"metrics: {'within noise' if c['within_noise'] else 'OUTSIDE NOISE'}")
        if c.get("logprob_tokens"):
            if c["logprob_tolerance"] == 0:  # the same setup made both: bit for bit
                rule = ("must be identical, same engine and setup: "
                        f"{'identical' if c['logprob_within'] else 'DIFFERENT'}")
            else:
                rule = (f"pass ≤ {c['logprob_tolerance']:.3g}: "
                        f"{'within' if c['logprob_within'] else 'OUTSIDE'}")
            print(f"log-probabilities of the {counted(c['logprob_tokens'], 'token')} both "
                  "decoded alike: "
                  f"mean |Δ| {c['logprob_mean_abs_diff']:.3g} nats ({rule}), max "
                  f"{c['logprob_max_abs_diff']:.3g}")
        if c.get("top_logprob_pairs"):
            print(f"top-{_top_k()} log-probabilities at those steps ({c['top_logprob_pairs']} "
                  f"ids listed by both): mean |Δ| {c['top_logprob_mean_abs_diff']:.3g} nats "
                  "(informational: not yet part of the verdict)")
        if c.get("logprob_length_mismatches"):
            n = c["logprob_length_mismatches"]
            print(f"{counted(n, 'output')} alike in both runs {'has' if n == 1 else 'have'} "
                  "log-probability lists of different lengths (a report edited or cut)")
        print(f"compare: {'PASSED' if c['passed'] else 'FAILED'}")
    sys.stdout.flush()


def _same_cases(ref: dict, cases: list, args) -> None:
    """Raise InvalidRequestError unless the --compare report `ref` ran this run's `cases`.
    Cases pair by group and index, so they must be the same requests: the questions a report
    records decide (a report whose "seed" was deleted paired other cases and failed the run;
    one whose seed was edited sent the user to the wrong --seed: a bad-input trial and its
    re-trial, 2026-12-07); without any, its seed does, and without either it is refused."""
    from flint_graph.errors import InvalidRequestError
    from flint_graph.nano import evals

    seed = ref.get("seed")
    asked = {(c.group, c.index): evals.question_text(c) for c in cases}
    theirs = [(c, asked.get((c["group"], c["index"]))) for c in ref.get("cases", [])
              if "question" in c]
    other = next(((c, mine) for c, mine in theirs if mine is not None and c["question"] != mine),
                 None)
    if other is None and theirs:
        return
    if seed is not None and seed != args.seed:
        raise InvalidRequestError(f"--compare {args.compare}: made with --seed {seed}, this "
                                  f"run has --seed {args.seed}; its cases differ, so pass the "
                                  "same --seed")
    if other is not None:
        c, mine = other
        a, b = _differ(c["question"], mine)
        raise InvalidRequestError(
            f"--compare {args.compare}: its case {c['group']} #{c['index']} asked {a}, this "
            f"run's asks {b}: the report was made with other cases (another --seed, or another "
            "version's suites), so the two cannot be compared")
    if seed is None:
        raise InvalidRequestError(
            f"--compare {args.compare}: it records neither its --seed nor its cases' questions, "
            "so which cases it ran cannot be told; compare with a report this version wrote")


def _differ(a: str, b: str, width: int = 60) -> tuple[str, str]:
    """`a` and `b` quoted for an error message, each cut to about `width` characters around
    where they first differ (two questions cut at the same place had read alike)."""
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo = max(0, i - width // 3)

    def cut(t: str) -> str:
        part = t[lo:lo + width]
        return repr(("…" if lo else "") + part + ("…" if lo + width < len(t) else ""))

    return cut(a), cut(b)
