"""Reports of `flint-graph bench` (perf/bench.py): the decode and summary tables (terminal and
markdown), the comparison of two saved runs, and reading a saved run back. Pure Python on the
result dict, no torch, so tests/test_bench_report.py checks all of it on the CPU.

The result (schema "flint-graph-bench", version 1); every time carries its unit in its name
(_ms, _s), bytes are bytes, copy_bw is bytes/s:
  created, command, git_rev, machine {device, gpu, driver, torch, cuda, cuda_bindings,
  cutlass_dsl, python, cpu}, model {source, config_hash, layers, hidden}, copy_bw, kv_fill,
  cold_start {format, total_s, phases {<phase>_s}, note} | None,
  kernels_per_step {format: {bucket: kernel nodes}},
  decode [{engine, format, B, context, median_ms, p90_ms, steps, tokens_per_s, bytes, floor_ms,
           fraction = floor_ms / median_ms}],
  e2e [{engine, format, B, prompt_tokens, tokens, ms_per_token, ttft_ms}],
  prefill [{engine, format, tokens, ms, tokens_per_s}], errors [what did not run].
Any list may be empty and any optional field missing or None: the tables print "-" there.
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flint_graph.checkpoints.jsonfile import read_capped
from flint_graph.errors import InvalidRequestError, kind, shown, terminal_safe

RESULT_MAX_BYTES = 256 << 20  # a bench or trace JSON is a few MB; a device or 1 GB file is refused

SCHEMA, VERSIONS = "flint-graph-bench", (1,)
# How a markdown report begins
MARKDOWN_HEAD = "**flint-graph bench** — "
BASELINES = ("reference", "compiled")  # what the graph engine is timed against, in column order
SHORT = {"reference": "ref", "compiled": "comp"}
DECODE_FIELDS = ("median_ms", "p90_ms", "tokens_per_s", "fraction")
HIGHER_IS_BETTER = ("tokens_per_s", "fraction")
COPY_BW_TOLERANCE = 0.05  # two runs' copy BW further apart than this: not the same machine state
# what each schema is written by, to say so when one file is passed for the other
WRITER = {"flint-graph-bench": "flint-graph bench --json", "flint-graph-trace":
          "flint-graph trace --out"}
DECODE_CAPTION = (
    "copy BW {bw}: a device copy measured in this run; KV cache: {kv}. floor ms = bytes the "
    "step must move / copy BW; % of floor = floor / median (100% = a step at copy speed); "
    "tokens/s = B / median; engine: whose step fills median … tokens/s (the graph engine when "
    "it ran); ×ref, ×comp = that baseline's median ms / the graph engine's median ms.")
SUMMARY_CAPTION = (
    "end to end: ms per token (TPOT) once all B rows decode, through the engine's own loop "
    "(sampling, detokenizer, stop checks included); TTFT: the median request's submission to "
    "first token (the B prompts prefill one after another); prefill: one prompt of N tokens, "
    "chunked, first token included (on a GPU the median of 3 cold runs up to 4,096 tokens); cold start: CLI entry to first token, then its phases; "
    "kernels per step: kernel nodes in each bucket's captured decode graph.")


# -- formatting shared with perf/trace_report.py -----------------------------------------------

def num(v, p: int = 2, unit: str = "") -> str:
    """v with p decimals (3 significant digits below 1, powers of ten from 1e9 on; an int as
    it is) followed by its unit; "-" for None. (A compared file's 1e308 printed as 309 digits,
    widening its table past hundreds of columns.)"""
    if v is None:
        return "-"
    if isinstance(v, int) or not isinstance(v, float):  # counts (and stray strings) as they are
        if isinstance(v, int) and abs(v) >= 10**12:  # from its digits: 10**400 is no float
            d = str(abs(v))
            return f"{'-' if v < 0 else ''}{d[0]}.{d[1:4]}e+{len(d) - 1}{unit}"
        return f"{v}{unit}"
    if abs(v) >= 1e9:
        return f"{v:.3e}{unit}"
    return (f"{v:.{p}f}" if abs(v) >= 1 or v == 0 else f"{v:#.3g}") + unit


def signed(v: float, p: int = 2, unit: str = "") -> str:
    """`num` with its sign always shown ("+1.25", "-0.50"): a difference between two runs."""
    return ("+" if v >= 0 else "") + num(v, p, unit)


def change_pct(change: float) -> str:
    """A relative change (0.029) as a signed percentage ("+2.9%"), in powers of ten when huge:
    a compared file's 1e308 made a 309-digit cell of f"{change:+.1%}" (a bad-input trial)."""
    return signed(change * 100, 1, "%")


def bandwidth(bytes_per_s: float | None) -> str:
    """A bandwidth in TB/s, or GB/s below 1 TB/s (a CPU); "-" for None."""
    if not bytes_per_s:
        return "-"
    return (f"{bytes_per_s / 1e12:.2f} TB/s" if bytes_per_s >= 1e12
            else f"{bytes_per_s / 1e9:.1f} GB/s")


def ratio(x: float | None) -> str:
    """A speed ratio with ~3 significant digits: "188×", "18.8×", "1.88×"; "-" for None."""
    if x is None:
        return "-"
    return f"{x:.0f}×" if x >= 100 else f"{x:.1f}×" if x >= 10 else f"{x:.2f}×"


def pct(fraction: float | None) -> str:
    """A fraction as a percentage with one decimal (no sign); "-" for None."""
    return num(None if fraction is None else 100 * fraction, 1)


def megabytes(nbytes: float | None) -> str:
    """Bytes as MB (1e6) with 3 decimals; "-" for None."""
    return num(None if nbytes is None else nbytes / 1e6, 3)


def rel_change(a: float | None, b: float | None) -> float | None:
    """b / a − 1; None when either is missing or a is 0."""
    return None if a is None or b is None or a == 0 else b / a - 1


def describe_machine(m: dict | None) -> str:
    """"NVIDIA H200 (driver 580.1, CUDA 13.0), torch 2.11.0, …" or "CPU x86_64 …, torch …"."""
    m = m or {}
    where = (f"{m['gpu']} (driver {m.get('driver') or '-'}, CUDA {m.get('cuda') or '-'})"
             if m.get("gpu") else f"CPU {m.get('cpu') or '-'}")
    names = {"torch": "torch", "cuda_bindings": "cuda-bindings", "cutlass_dsl": "CuTe DSL"}
    return ", ".join([where, *(f"{n} {m[k]}" for k, n in names.items() if m.get(k))])


def header_line(result: dict) -> str:
    """Machine, git revision, config hash (model source) and date of a bench or trace result."""
    model = result.get("model") or {}
    return (f"{describe_machine(result.get('machine'))}; git {result.get('git_rev') or '-'}; "
            f"config {model.get('config_hash') or '-'} ({model.get('source') or '-'}); "
            f"{result.get('created') or '-'}")


def read_json(path, schema: str, versions=VERSIONS) -> dict:
    """The JSON object at `path`, checked to be `schema` in one of `versions`. Raises
    InvalidRequestError naming the path and what was expected when the file is missing,
    unreadable, not JSON, another schema (e.g. a trace given for a bench) or another version."""
    p = Path(path)
    want = f"a {schema} JSON (version {'/'.join(map(str, versions))}, written by {WRITER[schema]})"
    try:
        data = read_capped(p, RESULT_MAX_BYTES)
    except FileNotFoundError:
        raise InvalidRequestError(f"{p}: no such file; expected {want}") from None
    except ValueError as e:
        raise InvalidRequestError(f"{p}: {e}; expected {want}") from None
    except OSError as e:
        raise InvalidRequestError(f"{p}: cannot read ({e}); expected {want}") from None
    found = data.get("schema") if isinstance(data, dict) else None
    if found != schema:
        # in JSON's words (null, "x", [...]), not Python's (NoneType, None: a trial)
        what = (f"a JSON {kind(data)}, not an object" if not isinstance(data, dict)
                else f"schema {shown(found, 40)}" if "schema" in data else 'no "schema" field')
        # a schema that is no string (a list, an object) cannot be looked up: it was
        # "internal error: TypeError: unhashable type" (a bad-input trial, 2026-12-06)
        hint = (f" (this file is from {WRITER[found]})"
                if isinstance(found, str) and found in WRITER else "")
        raise InvalidRequestError(f"{p}: {what}{hint}; expected {want}")
    version = data.get("version")
    if isinstance(version, bool) or version not in versions:
        # only a larger whole number can come from a newer flint-graph ("1", a string, was
        # asked about as if it did: a bad-input trial, 2026-12-06)
        newer = (isinstance(version, int) and not isinstance(version, bool)
                 and version > max(versions))
        raise InvalidRequestError(f"{p}: {schema} version {shown(version, 40)}; expected "
                                  f"{want}{' (written by a newer flint-graph?)' if newer else ''}")
    from flint_graph.perf.schema import SPECS, check

    if schema in SPECS:
        check(p, data, SPECS[schema])
    return _shown_strings(data)


def _shown_strings(value):
    """`value` (parsed JSON) with every string, keys too, made terminal-safe
    (`errors.terminal_safe`): a saved file's names reach the terminal in the --compare tables,
    where an escape sequence in one would retitle the window or write the clipboard (a
    bad-input trial put OSC 52 in an engine name)."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, list):
        return [_shown_strings(v) for v in value]
    if isinstance(value, dict):
        return {_shown_strings(k): _shown_strings(v) for k, v in value.items()}
    return value


def rich_table(title: str, cols, rows, caption: str, left: int = 1) -> Table:
    """A rich Table: the first `left` columns left-aligned, the rest (numbers) right-aligned.
    Cells from the JSON are escaped, so a "[" in a name never reads as rich markup."""
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for i, c in enumerate(cols):
        # a figure is folded, never cut, on a narrow terminal
        t.add_column(escape(c), justify="left" if i < left else "right", overflow="fold")
    for r in rows:
        t.add_row(*(x if isinstance(x, Text) else escape(str(x)) for x in r))
    return t


def md_table(cols, rows) -> list[str]:
    """Markdown table lines ("|" in a cell escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return [line(cols), "|" + "---|" * len(cols), *(line(r) for r in rows)]


# -- the tables --------------------------------------------------------------------------------

def _fraction(r: dict) -> float | None:
    if r.get("fraction") is not None:
        return r["fraction"]
    f, m = r.get("floor_ms"), r.get("median_ms")
    return f / m if f is not None and m else None


def _tokens_per_s(r: dict) -> float | None:
    if r.get("tokens_per_s") is not None:
        return r["tokens_per_s"]
    b, m = r.get("B"), r.get("median_ms")
    return b / m * 1e3 if b is not None and m else None


def _decode_grid(result: dict) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the decode table: one row per (format, B, context), in run order."""
    recs = result.get("decode") or []
    by = {(r.get("format"), r.get("B"), r.get("context"), r.get("engine")): r for r in recs}
    engines = {r.get("engine") for r in recs} - {"graph"}
    bases = [e for e in BASELINES if e in engines] + sorted(engines - set(BASELINES), key=str)
    if "graph" not in {r.get("engine") for r in recs}:  # CPU: the reference fills median …
        bases = [e for e in bases if e != "reference"]  # so its own columns would repeat it
    cols = ["format", "B", "context", "engine", "median ms", "p90 ms", "floor ms", "% of floor",
            "tokens/s"]
    for e in bases:
        cols += [f"{e} ms", f"×{SHORT.get(e, e)}"]
    rows = []
    for fmt, b, ctx in dict.fromkeys((r.get("format"), r.get("B"), r.get("context"))
                                     for r in recs):
        graph = by.get((fmt, b, ctx, "graph"))
        own = graph or next(by[k] for e in ("reference", *bases) if (k := (fmt, b, ctx, e)) in by)
        frac = _fraction(own)
        row = [fmt, b, ctx, own.get("engine"), num(own.get("median_ms"), 3),
               num(own.get("p90_ms"), 3), num(own.get("floor_ms"), 3),
               pct(frac), num(_tokens_per_s(own), 1)]
        g_ms = graph and graph.get("median_ms")
        for e in bases:
            ms = (by.get((fmt, b, ctx, e)) or {}).get("median_ms")
            row += [num(ms, 3), ratio(ms / g_ms if ms is not None and g_ms else None)]
        rows.append([num(x) if x is None else x for x in row])
    return cols, rows


def _phase_name(key: str) -> str:
    return key.removesuffix("_s").replace("_", " ")


def _e2e_row(r: dict) -> list[str]:
    what = (f"end to end B={num(r.get('B'))}, {num(r.get('tokens'))} tokens "
            f"(prompt {num(r.get('prompt_tokens'))})")
    value = (f"{num(r.get('ms_per_token'), 2, ' ms/token')}, "
             f"TTFT {num(r.get('ttft_ms'), 1, ' ms')}")
    return [what, r.get("engine") or "-", r.get("format") or "-", value]


def _prefill_row(r: dict) -> list[str]:
    value = f"{num(r.get('ms'), 1, ' ms')}, {num(r.get('tokens_per_s'), 1, ' tokens/s')}"
    if r.get("mfu") is not None:
        value += f", {num(r.get('tflops'), 0, ' TFLOP/s')}, MFU {r['mfu']:.1%}"
    return [f"prefill {num(r.get('tokens'))} tokens", r.get("engine") or "-",
            r.get("format") or "-", value]


def _interleave_row(r: dict) -> list[str]:
    pace = r.get("prefill_step_ms")
    how = f"paced {num(pace, 0, ' ms')}" if pace is not None else "a chunk a step"
    ttft = ", ".join(f"{k}: {num(v, 0, ' ms')}" for k, v in (r.get("ttft_ms") or {}).items())
    value = (f"TPOT p50 {num(r.get('tpot_p50_ms'), 1, ' ms')}, p99 "
             f"{num(r.get('tpot_p99_ms'), 1, ' ms')}, max {num(r.get('tpot_max_ms'), 1, ' ms')};"
             f" TTFT {ttft}")
    prompts = "+".join(num(n) for n in r.get("prompts") or [])
    how += f", {num(r.get('steps'))} step{'' if r.get('steps') == 1 else 's'}"
    return [f"stream while {prompts} arrive ({how})", r.get("engine") or "-",
            r.get("format") or "-", value]


def _summary_grid(result: dict) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of the summary: e2e, prefill, interleave, cold start and kernels per
    step."""
    rows = [_e2e_row(r) for r in result.get("e2e") or []]
    rows += [_prefill_row(r) for r in result.get("prefill") or []]
    rows += [_interleave_row(r) for r in result.get("interleave") or []]
    cs = result.get("cold_start")
    if cs:
        rows.append(["cold start", "-", cs.get("format") or "-",
                     num(cs.get("total_s"), 2, " s")])
        rows += [[f"  {_phase_name(k)}", "", "", "-" if v is None else f"{v:.3f} s"]
                 for k, v in (cs.get("phases") or {}).items()]
    for fmt, per in (result.get("kernels_per_step") or {}).items():
        rows.append(["kernels per step", "graph", fmt,
                     ", ".join(f"B={b}: {num(n)}" for b, n in (per or {}).items()) or "-"])
    for fmt, fold in (result.get("attn_fold") or {}).items():
        rows.append(["decode attention", "graph", fmt, fold_name(fold)])
    return ["figure", "engine", "format", "value"], rows


def fold_name(fold) -> str:
    """How a run's decode attention ran (`attn_fold`): folded (Q/K norm, RoPE and the KV write
    inside attention) or plain (qk_norm_rope_kv before it)."""
    return {True: "folded (--attn-fold on)", False: "plain (--attn-fold off)"}.get(fold, "-")


def _notes(result: dict) -> list[str]:
    """Lines printed below the summary table: the cold start's note, which as a table cell
    widened the whole value column (220 columns when piped)."""
    cs = result.get("cold_start") or {}
    return [f"cold start: {cs['note']}"] if cs.get("note") else []


def _decode_caption(result: dict) -> str:
    return DECODE_CAPTION.format(bw=bandwidth(result.get("copy_bw")),
                                 kv=result.get("kv_fill") or "-")


def decode_table(result: dict) -> Table:
    """The decode step per (format, B, context): the graph engine's median / p90 / floor ms, %
    of floor and tokens/s (the reference's own where the graph engine did not run: CPU), then
    each baseline's median ms and its ratio to the graph engine's."""
    cols, rows = _decode_grid(result)
    return rich_table("decode step", cols, rows, _decode_caption(result), left=4)


def summary_table(result: dict) -> Table:
    """End to end (ms/token, TTFT), prefill (ms, tokens/s), cold start (s, with its phases) and
    kernels per step per bucket, one row per figure."""
    cols, rows = _summary_grid(result)
    return rich_table("end to end, prefill, cold start", cols, rows, SUMMARY_CAPTION, left=4)


def markdown(result: dict) -> str:
    """The two tables as markdown (docs/perf-log.md, $OUT/bench.md), headed by one line with
    machine, git rev, config hash and date; then what did not run."""
    out = [f"{MARKDOWN_HEAD}{header_line(result)}", "",
           f"`{result.get('command') or '-'}`", ""]
    out += [*md_table(*_decode_grid(result)), "", _decode_caption(result), ""]
    out += [*md_table(*_summary_grid(result)), "", SUMMARY_CAPTION]
    out += [f"\n{line}" for line in _notes(result)]
    errors = result.get("errors") or []
    if errors:
        out += ["", "Did not run:", *(f"- {e}" for e in errors)]
    return "\n".join(out)


def print_report(result: dict, console) -> None:
    """Header line (machine, git rev, config hash), both tables and the errors, on `console`."""
    console.print(escape(header_line(result)))
    console.print(escape(f"command: {result.get('command') or '-'}"), style="dim")
    if result.get("decode"):
        console.print(decode_table(result))
    else:
        console.print("no decode figures in this result")
    console.print(summary_table(result))
    for line in _notes(result):
        console.print(escape(line), style="dim")
    for e in result.get("errors") or []:
        console.print(escape(f"did not run: {e}"), style="red")


# -- comparing two runs ------------------------------------------------------------------------

def _figures(result: dict) -> dict:
    """Every comparable figure of a result: {"what" (record key, then field): value}."""
    out = {}
    for r in result.get("decode") or []:
        key = (f"decode {r.get('engine')} {r.get('format')} B={r.get('B')} "
               f"ctx={r.get('context')}")
        out.update({f"{key} {f}": r.get(f) for f in DECODE_FIELDS})
    for r in result.get("e2e") or []:
        key = f"e2e {r.get('engine')} {r.get('format')} B={r.get('B')}"
        out.update({f"{key} {f}": r.get(f) for f in ("ms_per_token", "ttft_ms")})
    for r in result.get("prefill") or []:
        key = f"prefill {r.get('engine')} {r.get('format')} tokens={r.get('tokens')}"
        out.update({f"{key} {f}": r.get(f) for f in ("ms", "tokens_per_s")})
    cs = result.get("cold_start")
    if cs:
        out[f"cold_start {cs.get('format')} total_s"] = cs.get("total_s")
        out.update({f"cold_start {cs.get('format')} {k}": v
                    for k, v in (cs.get("phases") or {}).items()})
    for fmt, per in (result.get("kernels_per_step") or {}).items():
        out.update({f"kernels_per_step {fmt} B={b}": n for b, n in (per or {}).items()})
    return out


def _better(what: str) -> str | None:
    """"lower" for times, "higher" for tokens/s and fraction, None for counts."""
    field = what.rsplit(" ", 1)[-1]
    if field in HIGHER_IS_BETTER:
        return "higher"
    return "lower" if field.endswith(("_ms", "_s", "ms_per_token")) or field == "ms" else None


def compare(a: dict, b: dict) -> list[dict]:
    """One dict per figure of either run, matched by record key and field:
    {"what", "a", "b", "change" (b / a − 1, None when a is 0 or None), "better" ("lower",
    "higher" or None), "note" ("only in A", "only in B" or "")}. A's order, then B's extras."""
    fa, fb = _figures(a), _figures(b)
    out = []
    for what in dict.fromkeys([*fa, *fb]):
        va, vb = fa.get(what), fb.get(what)
        if va is None and vb is None:  # a field neither run has (e.g. no p90): nothing to say
            continue
        note = "only in A" if what not in fb else "only in B" if what not in fa else ""
        out.append({"what": what, "a": va, "b": vb, "change": rel_change(va, vb),
                    "better": _better(what), "note": note})
    return out


def compare_warnings(a: dict, b: dict) -> list[str]:
    """Why two runs may not be comparable: another GPU, another model config, or a copy
    bandwidth more than COPY_BW_TOLERANCE apart (the floors and fractions move with it)."""
    out = []
    ga, gb = ((r.get("machine") or {}).get("gpu") for r in (a, b))
    if ga != gb:
        out.append(f"different GPU: A {ga or 'none (CPU)'}, B {gb or 'none (CPU)'}: "
                   "times are not comparable")
    ha, hb = ((r.get("model") or {}).get("config_hash") for r in (a, b))
    if ha != hb:
        out.append(f"different model config: A config hash {ha or '-'}, B {hb or '-'}: "
                   "bytes and times differ by model")
    ca = rel_change(a.get("copy_bw"), b.get("copy_bw"))
    if ca is not None and abs(ca) > COPY_BW_TOLERANCE:
        out.append(f"copy bandwidth differs by {change_pct(ca)}: A {bandwidth(a.get('copy_bw'))}, B "
                   f"{bandwidth(b.get('copy_bw'))} (another machine, clock or load?): floors "
                   "and fractions move with it")
    sa, sb = a.get("settings") or {}, b.get("settings") or {}
    for key in sorted(set(sa) | set(sb)):
        if sa.get(key) != sb.get(key):
            out.append(f"different {key}: A {sa.get(key)}, B {sb.get(key)}: only the figures "
                       "both runs have are compared")
    fa, fb = ({d.get("format") for d in r.get("decode") or []} for r in (a, b))
    if fa != fb:
        out.append(f"different weight formats: A {sorted(fa)}, B {sorted(fb)}")
    fo = [r.get("attn_fold") for r in (a, b)]
    if fo[0] is not None and fo[1] is not None and fo[0] != fo[1]:
        def said(f):
            return (", ".join(f"{k} {fold_name(v)}" for k, v in f.items())
                    if isinstance(f, dict) else fold_name(f))
        out.append(f"different decode attention: A {said(fo[0])}, B {said(fo[1])}: the step "
                   "times differ by it")
    return out


def change_text(change: float | None, better: str | None, threshold: float,
                note: str = "") -> Text:
    """A change as "+2.9%": green when better, red when worse, dim below `threshold`."""
    if note or change is None:
        return Text(note or "-", style="dim")
    text = change_pct(change)
    if abs(change) < threshold:
        return Text(text, style="dim")
    good = {"lower": change < 0, "higher": change > 0}.get(better)
    return Text(text, style="" if good is None else "green" if good else "red")


def print_compare(a: dict, b: dict, console, threshold: float = 0.02) -> None:
    """Warnings, then every figure of A and B with its change (green better, red worse, dim
    below `threshold`, a fraction)."""
    console.print(escape(f"A: {header_line(a)}"))
    console.print(escape(f"B: {header_line(b)}"))
    for w in compare_warnings(a, b):
        console.print(escape(f"warning: {w}"), style="yellow")
    rows = [[e["what"], _value(e["a"]), _value(e["b"]),
             change_text(e["change"], e["better"], threshold, e["note"])]
            for e in compare(a, b)]
    caption = (f"change = B / A − 1; green: better (less time, more tokens/s, higher fraction "
               f"of the floor), red: worse, dim: below {threshold:.0%}. Units are in each "
               "figure's name (_ms, _s, tokens_per_s); fraction = floor / median.")
    console.print(rich_table("bench A → B", ["figure", "A", "B", "change"], rows, caption))


def _value(v) -> str:
    return "-" if v is None else str(v) if isinstance(v, int) else f"{v:.4g}"


def load(path) -> dict:
    """A saved bench result (`flint-graph bench --json FILE`). Raises InvalidRequestError naming
    the path when it is missing, not JSON, not a "flint-graph-bench" file or another version."""
    return read_json(path, SCHEMA)
