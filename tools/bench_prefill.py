#!/usr/bin/env python3
"""Prefill benchmark on the GPU (issue 21): the prefill (capture/prefill.py) with the CuTe DSL
attention kernel beside the torch-ops baseline (the same GEMMs with torch's SDPA for attention),
in one run, at the full config's shapes with synthetic weights held in memory, BF16 then NVFP4.

    python tools/bench_prefill.py [--preset full] [--tokens 512,2048,8192,32768]
                                  [--chunk N] [--out DIR] [--formats bf16,nvfp4]

For each format, path and prompt length: the median wall time of a whole prefill (every chunk,
the last token's logits on the host: the TTFT less tokenisation and sampling), tokens/s, and
MFU = FLOPs (`FlintConfig.prefill_flops`) / time over the dense BF16 matmul rate measured in the
same run (torch.matmul 8192³). Then a per-kernel breakdown of one chunk (torch.profiler: CUDA
time by kernel name, our cubins included). Writes prefill.json and prefill.md under --out.

With --processes N the whole bench runs in N fresh processes one after another (under
--out/process-I) and each row reports the median of their medians, with every process's value
(`ms_processes`) and the spread: on one H200 the NVFP4 8K prefill read 124.6 to 168.7 ms in four
processes while BF16 held 114.0 to 114.9 (2026-12-05), so one process's figure is not a
measurement of the code.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from flint_graph.cli_args import plain_int_or_none, shown
from flint_graph.perf.tool_reports import count_arg


def time_prefill(pre, prompt: torch.Tensor, chunk: int, reps: int,
                 split: dict | None = None) -> float:
    """Median seconds of `reps` whole prefills of `prompt` into slot 0 (logits on the host).
    With `split` (a dict, filled in): the medians in ms of "issue_ms" (until `prefill`
    returned: the host's launches; near the wall time when the host, not the GPU, sets the
    pace) and "gpu_ms" (CUDA events on the current stream around the call: the GPU's span,
    the side stream included, since it joins the current stream before the logits)."""
    times, issue, gpu = [], [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        e0.record()
        logits = pre.prefill(0, prompt, chunk)
        e1.record()
        t1 = time.perf_counter()
        logits.cpu()
        times.append(time.perf_counter() - t0)
        issue.append((t1 - t0) * 1e3)
        gpu.append(e0.elapsed_time(e1))
    if split is not None:
        split.update(issue_ms=statistics.median(issue), gpu_ms=statistics.median(gpu),
                     wall_ms_each=[round(t * 1e3, 2) for t in times])
    return statistics.median(times)


def gpu_state() -> str | None:
    """nvidia-smi's SM and memory clocks, power, temperature and active throttle reasons right
    now (None where it cannot say): read after each timed row, so a slow object can be told
    apart from a clocked-down GPU (the 8K NVFP4 spread, docs/device-queue.md)."""
    import subprocess

    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout else None


def breakdown(pre, prompt: torch.Tensor, chunk: int, top: int = 25) -> str:
    """CUDA time by kernel of one prefill of `prompt` (torch.profiler's table, our cubins
    included: CUPTI sees every launch)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        pre.prefill(0, prompt, chunk)
        torch.cuda.synchronize()
    for key in ("self_device_time_total", "self_cuda_time_total"):
        try:
            return prof.key_averages().table(sort_by=key, row_limit=top, max_name_column_width=70)
        except (AttributeError, KeyError, ValueError):
            continue
    return "(no profiler table)"


def _rows(text: str) -> int | None:
    """'-' (every size / off) or a row count ≥ 0."""
    if text == "-":
        return None
    rows = plain_int_or_none(text)
    if rows is None or text != text.strip():
        raise argparse.ArgumentTypeError(f"{shown(text)}: expected '-' or a row count ≥ 0")
    return rows


def w4a16_max_list(text: str) -> list[tuple[int | None, int | None]]:
    """--w4a16-max: comma-separated ROUTED/SHARED pairs of _rows."""
    out = []
    for v in (v for v in text.split(",") if v):
        parts = v.split("/")
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"{shown(v)}: expected ROUTED/SHARED, e.g. -/512")
        out.append((_rows(parts[0]), _rows(parts[1])))
    return out


def w4a16_wg_list(text: str) -> list[int | None]:
    """--w4a16-wg: comma-separated _rows."""
    return [_rows(v) for v in text.split(",") if v]


def _kv_values(v: str, pairs: list[str], known: dict[str, tuple[int, ...]], what: str,
               example: str) -> dict[str, int]:
    """K=V pairs of variant `v` (ASCII digits; each key once, one of `known`, its value among
    known[key]); raises ArgumentTypeError naming the pair and what was expected."""
    values: dict[str, int] = {}
    for kv in pairs:
        key, eq, val = kv.partition("=")
        num = plain_int_or_none(val) if val == val.strip() else None
        if not (key.isidentifier() and eq and num is not None):
            raise argparse.ArgumentTypeError(f"{shown(kv)} in {shown(v)}: expected K=V with V "
                                             f"an integer ≥ 0, e.g. {example}")
        if key in values:
            raise argparse.ArgumentTypeError(f"{shown(v)}: {key} given twice")
        if key not in known:
            raise argparse.ArgumentTypeError(
                f"{shown(v)}: no {shown(key)}; {what} takes "
                f"{', '.join(sorted(known)) or 'no K=V values'}")
        if num not in known[key]:
            raise argparse.ArgumentTypeError(f"{shown(kv)} in {shown(v)}: {key} is one of "
                                             f"{', '.join(map(str, known[key]))}")
        values[key] = num
    return values


def wg_values_list(text: str) -> list[dict[str, int]]:
    """--wg-values: comma-separated '-' (the default spec values) or K=V[:K=V…] with K one of
    grouped_w4a16_wg's benchmark switches (SUB, RS, W0: 0 or 1; W0 = 1 needs RS = 1)."""
    from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg

    out = []
    for v in (v for v in text.split(",") if v):
        values = {} if v == "-" else _kv_values(v, v.split(":"), {"SUB": (0, 1), "RS": (0, 1),
                                                                   "W0": (0, 1)},
                                                "grouped_w4a16_wg", "SUB=0")
        try:
            gwg.check_variant(values)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{shown(v)}: {e}") from None
        out.append(values)
    return out


def _attn_variant_built(values: dict[str, int]) -> bool:
    """Whether attn_prefill_wg's specs with `values` are among those the cache build makes
    (`_specs` and `bench_specs` at the full config): a GPU machine without the CuTe DSL
    cannot build a missing one."""
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels.prefill import attn_prefill_wg as awg

    cfg = FlintConfig.preset("full")
    built = {s.id for s in awg.KERNEL.specs(cfg, ()) + awg.bench_specs(cfg)}
    base = [s for s in awg.KERNEL.specs(cfg, ()) if "SPLITS" not in s.as_dict()]
    try:
        return all(awg.variant(s, **values).id in built for s in base)
    except ValueError:  # a combination no spec takes
        return False


def attn_kernel_list(text: str) -> list[tuple[str, dict[str, int]]]:
    """--attn-kernel: comma-separated NAME[:K=V[:K=V…]] (NAME one of ATTN_KERNELS; K=V one of
    attn_prefill_wg's benchmark variants: ST 2 or 3 stages, WS 0 or 1, FC 0 or 1)."""
    from flint_graph.capture.prefill import ATTN_KERNELS

    out = []
    for v in (v for v in text.split(",") if v):
        name, *pairs = v.split(":")
        if name not in ATTN_KERNELS:
            raise argparse.ArgumentTypeError(f"{shown(name)}: expected one of {', '.join(ATTN_KERNELS)}")
        known = {"attn_prefill_wg": {"ST": (2, 3), "WS": (0, 1), "FC": (0, 1)}}.get(name, {})
        values = _kv_values(v, pairs, known, name, "attn_prefill_wg:ST=3")
        if values.get("WS") == 0:
            del values["WS"]  # the default form: its specs do not name WS
        if values and not _attn_variant_built(values):
            raise argparse.ArgumentTypeError(
                f"{shown(v)}: no such attn_prefill_wg spec is built (tools/build_gpu_cache.py "
                "builds ST=3, WS=1 or FC=0, one at a time: its WS=1 form takes ST=2)")
        out.append((name, values))
    return out


# comma-separated integer options, checked before any work: (minimum, allowed values or None,
# '-' allowed, at least one value)
INT_LISTS = {"tokens": (1, None, False, True), "kernel_tokens": (1, None, False, False),
             "row_moe_max": (0, None, False, False), "nt": (1, (16, 32, 64), False, False),
             "depth": (1, (2, 3, 4), False, False), "ws": (0, (0, 1), False, False),
             "pf": (0, (0, 2, 4, 8), False, False),
             "side_max_rows": (1, None, True, False), "overlap": (0, (0, 1), False, False),
             "kv_write": (0, (0, 1), False, False), "combine_norm": (0, (0, 1), False, False),
             "dense_bf16": (0, (0, 1), False, False), "fold": (0, (0, 1), False, False),
             "shared": (0, (0, 1), False, False)}
NAME_LISTS = {"formats": ("bf16", "nvfp4"), "paths": ("graph", "kernel", "sdpa"),
              "moe": ("w4a16", "unpack")}


def check_args(p: argparse.ArgumentParser, args) -> None:
    """Every option's values, before any work (weights take minutes to make): p.error names
    the option and what it expected."""
    for name, (least, allowed, dash, needed) in INT_LISTS.items():
        flag, text = "--" + name.replace("_", "-"), getattr(args, name)
        vals = [v for v in text.split(",") if v]
        if needed and not vals:
            p.error(f"{flag} {shown(text)}: expected at least one value")
        for v in vals:
            if dash and v == "-":
                continue
            num = plain_int_or_none(v) if v == v.strip() else None
            if num is None or num < least or (allowed and num not in allowed):
                want = (f"one of {', '.join(map(str, allowed))}" if allowed else
                        f"an integer ≥ {least}") + (" or '-'" if dash else "")
                p.error(f"{flag} {shown(v)}: expected {want} (plain digits), comma-separated")
    for name, allowed in NAME_LISTS.items():
        flag, text = "--" + name, getattr(args, name)
        vals = [v for v in text.split(",") if v]
        if name != "moe" and not vals:
            p.error(f"{flag} {shown(text)}: expected at least one of {', '.join(allowed)}")
        for v in vals:
            if v not in allowed:
                p.error(f"{flag} {shown(v)}: expected one of {', '.join(allowed)}, comma-separated")
    try:
        extra = [count_arg(v) for v in args.graph_buckets.split(",") if v.strip()]
    except argparse.ArgumentTypeError:
        extra = [0]
    if any(b < 1 for b in extra):
        p.error(f"--graph-buckets {args.graph_buckets!r}: expected comma-separated token "
                "counts >= 1")
    args.graph_buckets = extra
    for flag, value, least in (("--reps", args.reps, 1), ("--chunk", args.chunk, 1),
                               ("--graph-max", args.graph_max, 1),
                               ("--processes", args.processes, 1),
                               ("--profile-tokens", args.profile_tokens, 0)):
        if value < least:
            p.error(f"{flag} {value}: expected {least} or more")
    # the W4A16 variants are built one at a time (grouped_w4a16.bench_specs): a row that
    # combined two would find no kernel after the weights were made and earlier rows timed
    picked = {flag: [int(v) for v in text.split(",") if v and int(v) != default]
              for flag, text, default in (("--depth", args.depth, 2), ("--ws", args.ws, 0),
                                          ("--pf", args.pf, 0))}
    if sum(bool(v) for v in picked.values()) > 1:
        p.error(f"{', '.join(f for f, v in picked.items() if v)}: each builds a variant of the "
                "W4A16 kernels on its own; give other values than the default for one of "
                "--depth (2), --ws (0) and --pf (0) per run")
    bad_nt = [v for v in args.nt.split(",") if v and int(v) not in (16, 32)]
    if picked["--pf"] and bad_nt:
        p.error(f"--pf with --nt {','.join(bad_nt)}: PF is built for NT 16 and 32 only")
    if picked["--ws"] and bad_nt:
        p.error(f"--ws 1 with --nt {','.join(bad_nt)}: WS is built for NT 16 and 32 only")
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.errors import ConfigError

    try:
        cfg = FlintConfig.preset(args.preset)
    except (ConfigError, ValueError) as e:
        p.error(f"--preset {shown(args.preset)}: {e}")
    for flag, text in (("--tokens", args.tokens), ("--kernel-tokens", args.kernel_tokens)):
        longest = max((int(v) for v in text.split(",") if v), default=0)
        if longest > cfg.max_position_embeddings:
            typed = any(a.split("=")[0] == flag for a in sys.argv[1:])
            default = "" if typed else f" (the default {flag}" + (
                "; --kernel-tokens= times none)" if flag == "--kernel-tokens" else ")")
            p.error(f"{flag} {longest}{default}: the {args.preset} config holds at most "
                    f"{cfg.max_position_embeddings} positions")
    # a variant option that no timed run would take is a mistake, not a no-op (a bad-input
    # trial, 2026-12-07: --wg-values with --formats bf16 timed the defaults and said nothing)
    formats, paths = args.formats.split(","), args.paths.split(",")
    if args.wg_values and ("nvfp4" not in formats or "graph" not in paths):
        p.error("--wg-values: grouped_w4a16_wg runs only on the graph path of NVFP4 "
                "checkpoints; add nvfp4 to --formats and graph to --paths")
    if args.combine_norm and not {"graph", "kernel"} & set(paths):
        p.error("--combine-norm: moe_combine runs on the graph and kernel paths only; add one "
                "of them to --paths")
    if "1" in args.combine_norm.split(","):
        from flint_graph.kernels.prefill import moe_combine

        if not any(moe_combine.norm_of(sp) for sp in moe_combine.KERNEL.specs(cfg, ())):
            p.error(f"--combine-norm 1: the {args.preset} config has no moe_combine NORM = 1 "
                    f"(its hidden size {cfg.hidden_size} is no multiple of "
                    f"{moe_combine.NORM_ALIGN}, or it has no routed experts)")
    if args.processes > MAX_PROCESSES:
        p.error(f"--processes {args.processes}: at most {MAX_PROCESSES} (one GPU process each)")
    if not args.out:
        p.error(f"--out {args.out!r}: expected a folder (it holds prefill.md, prefill.json and "
                "per-process folders)")
    from flint_graph.perf.tool_reports import out_problem

    # the reports replace only earlier reports of this tool, unchanged (bad-input trials,
    # 2026-12-07: --out naming a folder of the user's replaced its prefill.json and
    # prefill.md unasked)
    out = Path(args.out)
    reports = {"prefill.json": _own_json, "prefill.md": _own_markdown}
    for folder in [out] + ([out / f"process-{i}" for i in range(args.processes)]
                           if args.processes > 1 else []):
        if problem := out_problem(folder, reports):
            p.error(f"--out {args.out!r}: {problem}")


def main() -> int:
    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.prefill import GRAPH_BUCKETS, Prefill
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.runtime.engine_config import EngineConfig
    from flint_graph.checkpoints.make_checkpoint import make_nvfp4_weights, quantize_weights
    from flint_graph.perf.measure import matmul_peak_flops
    from flint_graph.checkpoints.synthetic import make_weights
    from flint_graph.cli_args import ValueParser

    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full",
                   help="model config: full (Flint 40B), nano or tiny (default: full)")
    p.add_argument("--tokens", default="25,512,2048,8192,32768",
                   help="prompt lengths to time, comma-separated")
    p.add_argument("--kernel-tokens", default="100000",
                   help="longer prompts timed on the kernel path only (the baseline takes minutes)")
    from flint_graph.runtime.engine_config import KERNEL_PREFILL_CHUNK

    p.add_argument("--chunk", type=count_arg, default=KERNEL_PREFILL_CHUNK,
                   help=f"prompt tokens per chunk (default: the engine's, {KERNEL_PREFILL_CHUNK})")
    p.add_argument("--reps", type=count_arg, default=3,
                   help="timed prefills per row (the median is reported; default 3)")
    p.add_argument("--formats", default="bf16,nvfp4",
                   help="weight formats, comma-separated: bf16, nvfp4 (nvfp4 alone fits an "
                        "80 GB GPU)")
    p.add_argument("--paths", default="graph,kernel,sdpa",
                   help="graph = the kernel path as the engine runs it (chunks of up to "
                        "--graph-max tokens replay CUDA graphs, larger ones run eagerly), "
                        "kernel = every chunk launched eagerly, sdpa = the torch-ops baseline")
    p.add_argument("--graph-max", type=count_arg, default=8192,
                   help="the largest chunk (tokens) the graph path captures as a CUDA graph "
                        "(default 8192, the largest of prefill.GRAPH_BUCKETS; 4096 launches "
                        "longer chunks eagerly, as before the twenty-ninth session; above "
                        "8192, a bucket of that size is captured too)")
    p.add_argument("--graph-buckets", default="",
                   help="more chunk sizes (tokens, comma-separated) to capture beside "
                        "prefill.GRAPH_BUCKETS, up to --graph-max, e.g. 5120,6144,7168 with "
                        "--graph-max 8192: a chunk replays the smallest bucket that holds it")
    p.add_argument("--row-moe-max", default="",
                   help="chunks up to this many rows run the MoE on the decode kernels "
                        "(capture/prefill_row_moe.py; default: prefill.ROW_MOE_MAX per "
                        "format); several values (e.g. 0,64,128,256) time the graph path once "
                        "per value")
    p.add_argument("--moe", default="",
                   help="experts on the graph path: w4a16 (the grouped kernels: NVFP4 as "
                        "W4A16, BF16 on WB = 16 up to prefill.BF16_GROUPED_MAX rows), unpack "
                        "(torch._grouped_mm; NVFP4 decoded to BF16 first); several values time "
                        "each (default: the prefill's own choice)")
    p.add_argument("--nt", default="",
                   help="pairs per tile of the W4A16 kernels (16, 32, 64; several values time "
                        "each; default: prefill.W4A16_NT by chunk size)")
    p.add_argument("--depth", default="",
                   help="weight steps the W4A16 kernels hold in registers (2, 3, 4; several "
                        "values time each; default: grouped_w4a16.DEPTH)")
    p.add_argument("--ws", default="",
                   help="1: the W4A16 kernels' weights through shared memory (cp.async, "
                        "grouped_w4a16.WS_STAGES deep); 0,1 times both (default: 0)")
    p.add_argument("--pf", default="",
                   help="the W4A16 kernels' L2 prefetch distance in steps at NT 16 and 32 "
                        "(grouped_w4a16 PF: 0, 2, 4, 8; several values time each; default: "
                        "the model's, grouped_w4a16.PF_MODEL: 2 for gate/up at NT 16); "
                        "chunks on grouped_w4a16_wg (above 1,536 rows) or at NT 64 keep PF = 0")
    p.add_argument("--w4a16-max", type=w4a16_max_list, default=[],
                   help="NVFP4 graph path: ROUTED/SHARED, the largest chunk (rows) the routed "
                        "and the shared expert run on the grouped W4A16 kernels, larger ones "
                        "from a BF16 scratch ('-' for every size); comma-separated values time "
                        "each, e.g. --w4a16-max=-/-,-/0,0/0 (the = form: a value may start with "
                        "'-'; default: capture/prefill.py's constants)")
    p.add_argument("--w4a16-wg", type=w4a16_wg_list, default=[],
                   help="NVFP4 graph path: chunks above this many rows run the routed experts on "
                        "grouped_w4a16_wg (wgmma); comma-separated values time each, '-' for "
                        "off, e.g. --w4a16-wg=-,0 (default: capture/prefill.py W4A16_WG_MIN)")
    p.add_argument("--attn-kernel", type=attn_kernel_list, default=[],
                   help="attention kernel(s) of the graph and kernel paths, comma-separated to "
                        "time each: attn_prefill (mma.sync), attn_prefill_wg (wgmma), a variant "
                        "as NAME:K=V[:K=V…], e.g. attn_prefill_wg:ST=3 (default: "
                        "capture/prefill.py ATTN_KERNEL)")
    p.add_argument("--wg-values", type=wg_values_list, default=[],
                   help="NVFP4 graph path: grouped_w4a16_wg with other spec values, "
                        "comma-separated variants to time each, '-' for the default, K=V[:K=V…] "
                        "otherwise, e.g. --wg-values=-,SUB=1 (benchmark variants of "
                        "kernels/prefill/grouped_w4a16_wg.py bench_specs)")
    p.add_argument("--side-max-rows", default="",
                   help="graph and kernel paths: the side stream only for chunks of at most "
                        "this many rows ('-': every chunk, the default); comma-separated values "
                        "time each, e.g. --side-max-rows=-,4096,2048 (Prefill.set_side_max_rows)")
    p.add_argument("--overlap", default="",
                   help="1: the side stream on (weight decodes ahead, shared expert and KV "
                        "writes beside the main stream: capture/side_stream.py), 0: one stream; "
                        "0,1 times both (default: the prefill's default, on)")
    p.add_argument("--kv-write", default="",
                   help="1: the KV write by the kv_write kernel (kernels/prefill/kv_write.py), "
                        "0: by torch's indexed assignment; 0,1 times both (default: the "
                        "prefill's default, the kernel)")
    p.add_argument("--combine-norm", default="",
                   help="1: each MoE layer's next attention norm in its moe_combine launch "
                        "(NORM = 1, kernels/prefill/moe_combine.py), 0: its own rmsnorm_rows "
                        "launch; 0,1 times both (default: the prefill's default, 1)")
    p.add_argument("--dense-bf16", default="",
                   help="1: the NVFP4 dense projections kept decoded in BF16 (Prefill."
                        "set_dense_bf16: ~2.2 GB at full size, bit for bit the same output; the "
                        "default, as the graph engine's EngineConfig.prefill_dense_bf16), 0: "
                        "decoded per chunk; 0,1 times both")
    p.add_argument("--fold", default="",
                   help="1: the NVFP4 shared expert as one more group of the routed W4A16 "
                        "launches (capture/prefill.py FOLD_SHARED), 0: its own launches; 0,1 "
                        "times both (default: the prefill's default)")
    p.add_argument("--shared", default="",
                   help="0: the NVFP4 shared expert on W4A16 replaced by zeros, a timing-only "
                        "bound on what it costs (outputs are wrong); 0,1 times both (default: "
                        "run it)")
    p.add_argument("--out", default="out",
                   help="directory for prefill.md and prefill.json (created; default: out)")
    p.add_argument("--processes", type=count_arg, default=1,
                   help="run the bench in this many fresh processes and report each row's "
                        "median over them, with the spread (module docstring)")
    p.add_argument("--profile-tokens", type=count_arg, default=8192,
                   help="prompt length of the per-kernel breakdown (0: none); clamped to the "
                        "longest timed prompt, which sizes the KV cache")
    args = p.parse_args()
    check_args(p, args)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (this machine has none)")
    if args.processes > 1:
        return in_processes(args.processes, Path(args.out), sys.argv[1:], args.profile_tokens)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        p.error(f"--out {args.out!r}: cannot create it ({e.strerror})")
    torch.backends.cuda.matmul.allow_tf32 = False
    lengths = [int(x) for x in args.tokens.split(",") if x]
    longer = [int(x) for x in args.kernel_tokens.split(",") if x]
    cfg = FlintConfig.preset(args.preset)
    peak = matmul_peak_flops("cuda")
    print(f"dense BF16 matmul 8192^3: {peak / 1e12:.0f} TFLOP/s", flush=True)
    res = {"preset": args.preset, "matmul_peak_flops": peak, "chunk": args.chunk,
           "gpu": torch.cuda.get_device_name(), "rows": [], "breakdown": {}}
    t0 = time.perf_counter()
    only_nvfp4 = "bf16" not in args.formats.split(",")
    weights = (make_nvfp4_weights(cfg, 1, "cuda") if only_nvfp4  # fits an 80 GB GPU
               else make_weights(cfg, 1, "cuda"))
    print(f"weights in {time.perf_counter() - t0:.0f} s", flush=True)
    kv = KVCache(cfg, num_slots=1, max_tokens=max(lengths + longer + [300]) + 1)  # 300: warm-up
    # the breakdown must fit the cache sized above, not fail after the timed runs
    args.profile_tokens = min(args.profile_tokens, max(lengths + longer + [300]))
    gen = torch.Generator().manual_seed(0)
    for fmt in ("bf16", "nvfp4"):
        if fmt == "nvfp4" and not only_nvfp4:
            quantize_weights(weights, progress=False)
            torch.cuda.empty_cache()
        if fmt not in args.formats.split(","):
            continue
        rows_sweep = [int(v) for v in args.row_moe_max.split(",") if v] or [None]
        moe_sweep = [{"w4a16": True, "unpack": False}[v] for v in args.moe.split(",") if v]
        nt_sweep = [int(v) for v in args.nt.split(",") if v] or [None]
        depth_sweep = [int(v) for v in args.depth.split(",") if v] or [None]
        ws_sweep = [int(v) for v in args.ws.split(",") if v] or [None]
        pf_sweep = [int(v) for v in args.pf.split(",") if v] or [None]
        w4 = fmt == "nvfp4"
        max_sweep = args.w4a16_max or [None]
        attn_sweep = args.attn_kernel or [None]
        wg_sweep = [("wg", v) for v in args.w4a16_wg] if w4 else []  # v None: off
        overlap_sweep = [bool(int(v)) for v in args.overlap.split(",") if v] or [None]
        shared_sweep = [bool(int(v)) for v in args.shared.split(",") if v] or [True]
        fold_sweep = [bool(int(v)) for v in args.fold.split(",") if v] or [None]
        kvw_sweep = [bool(int(v)) for v in args.kv_write.split(",") if v] or [None]
        cn_sweep = [bool(int(v)) for v in args.combine_norm.split(",") if v] or [None]
        # unset: the engine's default (EngineConfig), so a plain bench times what serving runs
        dbf_sweep = [bool(int(v)) for v in args.dense_bf16.split(",") if v] or [
            EngineConfig.prefill_dense_bf16]
        smr_sweep = [("max", None if v == "-" else int(v))
                     for v in args.side_max_rows.split(",") if v] or [None]
        sweep = [(r, m, n, d, w, pf, x) for r in rows_sweep for m in (moe_sweep or [None])
                 for n in (nt_sweep if m is not False and w4 else [None])
                 for d in (depth_sweep if m is not False and w4 else [None])
                 for w in (ws_sweep if m is not False and w4 else [None])
                 for pf in (pf_sweep if m is not False and w4 else [None])
                 for x in (max_sweep if m is not False and w4 else [None])]
        wgv_sweep = args.wg_values if w4 else []
        runs = [(path, r, a, wgm, ov, sh, fo, kw, db, smr, wgv, cn)
                for path in args.paths.split(",")
                for r in (sweep if path == "graph" else [(None,) * 7])
                for a in (attn_sweep if path in ("graph", "kernel") else [None])
                for wgm in ((wg_sweep or [None]) if path == "graph" else [None])
                for ov in (overlap_sweep if path in ("graph", "kernel") else [None])
                for sh in (shared_sweep if path in ("graph", "kernel") else [True])
                for fo in (fold_sweep if w4 and path in ("graph", "kernel") else [None])
                for kw in (kvw_sweep if path in ("graph", "kernel") else [None])
                for db in (dbf_sweep if w4 and path in ("graph", "kernel") else [None])
                for smr in (smr_sweep if path in ("graph", "kernel") else [None])
                for wgv in ((wgv_sweep or [None]) if path == "graph" else [None])
                for cn in (cn_sweep if path in ("graph", "kernel") else [None])]
        for obj, (path, (row_moe, w4a16, nt, depth, ws, pf, most), attn, wgm, ov, shared, fold,
                  kw, db, smr, wgv, cn) in enumerate(runs):
            chunk = args.chunk
            prompt = None
            pre = Prefill(cfg, weights, kv, attention="kernel" if path == "graph" else path,
                          row_moe_max=row_moe, w4a16=w4a16)
            if wgm is not None and pre.w4a16:
                pre.set_w4a16_wg(wgm[1])
            if wgv and pre.w4a16 and pre.w4a16_wg:
                pre.set_w4a16_wg(pre.w4a16_wg_min, **wgv)
            if attn:
                pre.set_attn_kernel(attn[0], **attn[1])
            if ov is not None:
                pre.set_overlap(ov)
            if smr is not None and pre.side.on:
                pre.set_side_max_rows(smr[1])
            if kw is not None:
                pre.set_kv_write(kw)
            if cn is not None:
                try:
                    pre.set_combine_norm(cn)
                except ValueError as e:  # e.g. the tiny preset: no NORM = 1 combine
                    raise SystemExit(f"bench_prefill.py: --combine-norm 1: {e}") from None
            kept = pre.set_dense_bf16(db) if db is not None else 0
            if fold is not None and pre.w4a16_shared:
                pre.set_fold_shared(fold)
            if not shared:  # timing only: what the shared expert's own kernels cost
                pre.set_fold_shared(False)
                pre._shared_w4a16 = lambda i, h: torch.zeros_like(h)
            pre.w4a16_nt = nt
            if most is not None:
                pre.w4a16_routed_max, pre.w4a16_shared_max = most
            variant = {k: v for k, v in (("D", depth), ("WS", ws), ("PF", pf))
                       if v is not None}
            if variant and pre.w4a16:
                pre.set_w4a16_variant(**variant)
            grouped = 'w4a16' if pre.w4a16 else 'bf16-grouped' if pre.w4a16_fold else 'unpack'
            row_moe = (f"{pre.row_moe_max}/{grouped}/{nt or 'auto'}"
                       f"/D{depth or 'auto'}/WS{ws or 0}{f'/PF{pf}' if pf else ''}"
                       f"/max{pre.w4a16_routed_max},{pre.w4a16_shared_max}"
                       f"/{pre.attn_kernel or 'torch'}"
                       f"{''.join(f':{k}={v}' for k, v in attn[1].items()) if attn else ''}"
                       f"/wg>{pre.w4a16_wg_min if pre.w4a16_wg else '-'}"
                       f"{''.join(f':{k}={v}' for k, v in (wgv or {}).items())}"
                       f"/side{int(pre.side.on)}{'' if shared else '/no-shared'}"
                       f"/fold{int(bool(pre.w4a16_fold))}"
                       f"{'' if pre.kv_write or path != 'graph' else '/kv-indexed'}"
                       f"{'' if pre.combine_norm is not None or path != 'graph' else '/norm-apart'}"
                       f"{f'/dense-bf16:{kept / 1e9:.2f}GB' if kept else ''}"
                       f"{'' if pre.side_max_rows is None else f'/side<={pre.side_max_rows}'}")
            if path == "graph":
                t0 = time.perf_counter()
                pre.graph_buckets = tuple(sorted({*GRAPH_BUCKETS, *args.graph_buckets,
                                                  args.graph_max}))
                buckets = pre.capture(min(chunk, args.graph_max))
                res[f"capture_{fmt}_s"] = time.perf_counter() - t0
                print(f"{fmt}: captured buckets {buckets} in "
                      f"{res[f'capture_{fmt}_s']:.1f} s", flush=True)
            pre.prefill(0, torch.randint(0, cfg.vocab_size, (300,), generator=gen), chunk)
            for n in lengths + (longer if path in ("kernel", "graph") else []):
                prompt = torch.randint(0, cfg.vocab_size, (n,), generator=gen)
                try:
                    split: dict = {}
                    retries = torch.cuda.memory_stats().get("num_alloc_retries", 0)
                    s = time_prefill(pre, prompt, chunk, args.reps if n <= 8192 else 1, split)
                    # the caching allocator's free-and-retry (a cudaFree: the host waits for
                    # the GPU mid-issue) during the timed runs, and what the process holds
                    split["alloc_retries"] = (torch.cuda.memory_stats().get(
                        "num_alloc_retries", 0) - retries)
                    split["reserved_gb"] = round(torch.cuda.memory_reserved() / 1e9, 2)
                except Exception as e:  # noqa: BLE001 - report and go on with the others
                    print(f"{fmt} {path} {n}: {type(e).__name__}: {e}", flush=True)
                    continue
                fl = cfg.prefill_flops(n)["total"]
                row = {"format": fmt, "path": path, "row_moe_max": row_moe, "chunk": chunk,
                       "tokens": n, "ms": s * 1e3,
                       "tokens_per_s": n / s, "tflops": fl / s / 1e12, "mfu": fl / s / peak,
                       "object": obj, **split, "gpu_state": gpu_state()}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
            # where a short prompt's time goes on the host (CPU self time by op)
            from torch.profiler import ProfilerActivity, profile

            short = torch.randint(0, cfg.vocab_size, (25,), generator=gen)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                pre.prefill(0, short, chunk)
            res["breakdown"][f"{fmt}/{path}/{row_moe} host, 25 tokens"] = prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60)
            if args.profile_tokens:
                # the prompt just timed where it has that length (a slow object's table then
                # shows the same routing that was timed); one table per object
                if prompt is None or len(prompt) != args.profile_tokens:
                    prompt = torch.randint(0, cfg.vocab_size, (args.profile_tokens,),
                                           generator=gen)
                res["breakdown"][f"{fmt}/{path}/{row_moe} (object {obj})"] = breakdown(
                    pre, prompt, chunk)
            # a Prefill may hold reference cycles, which `del` alone leaves (and their GPU
            # memory) to a later collection; the suspect for later objects' 8K host stalls in
            # the twenty-seventh session (issue time = GPU time): the rows' alloc_retries say
            del pre
            gc.collect()
            torch.cuda.empty_cache()
    write_report(res, out, args.profile_tokens)
    return 0


REPORT_TOOL = "tools/bench_prefill.py"  # prefill.json's "tool" (flint_graph.perf.tool_reports)
MARKDOWN_SEAL = "bench_prefill markdown"  # prefill.md's last line (flint_graph.perf.cli.seal)
MAX_PROCESSES = 64


def _own_json(path: Path) -> bool:
    """Whether `path` is a prefill.json this tool wrote, unchanged since."""
    from flint_graph.perf.tool_reports import is_own_json

    return is_own_json(path, REPORT_TOOL)


def _own_markdown(path: Path) -> bool:
    """Whether `path` is a prefill.md this tool wrote, unchanged since (its sealed last line)."""
    from flint_graph.perf.cli import sealed_as

    return sealed_as(MARKDOWN_SEAL)(path)


def write_report(res: dict, out: Path, profile_tokens: int) -> None:
    """prefill.json and prefill.md under `out` (printed too): one table row per timed
    configuration (with the per-process values and their spread when `res` aggregates several
    processes), then each per-kernel breakdown. The JSON names this tool ("tool") and the
    markdown ends in a seal line, so a later run replaces only these (`check_args`)."""
    from flint_graph.perf.cli import seal
    from flint_graph.perf.tool_reports import sealed_json

    (out / "prefill.json").write_text(sealed_json(res, REPORT_TOOL))
    many = any("ms_processes" in r for r in res["rows"])
    lines = [f"GPU {res['gpu']}; dense BF16 matmul {res['matmul_peak_flops'] / 1e12:.0f} TFLOP/s "
             f"(8192³, same run); chunk {res['chunk']}", "",
             "| format | path | row MoE ≤ / experts / NT | chunk | tokens | ms | tokens/s | "
             "TFLOP/s | MFU |" + (" ms per process | spread |" if many else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if many else "")]
    for r in res["rows"]:
        line = (f"| {r['format']} | {r['path']} | {r['row_moe_max']} | {r['chunk']} | "
                f"{r['tokens']} | {r['ms']:.1f} | {r['tokens_per_s']:.0f} | {r['tflops']:.0f} | "
                f"{r['mfu']:.1%} |")
        if many:
            ms = r["ms_processes"]
            line += (f" {', '.join(f'{m:.1f}' for m in ms)} | "
                     f"{(max(ms) - min(ms)) / r['ms']:.0%} |")
        lines.append(line)
    for key, table in res["breakdown"].items():
        lines += ["", f"{key}, {profile_tokens} tokens: CUDA time by kernel", "", "```",
                  table, "```"]
    (out / "prefill.md").write_text(seal("\n".join(lines) + "\n", MARKDOWN_SEAL))
    print("\n".join(lines))


ROW_KEY = ("format", "path", "row_moe_max", "chunk", "tokens")


def aggregate(reports: list[dict]) -> dict:
    """One report from the prefill.json of several processes: each row (by ROW_KEY, in the first
    report's order) with ms the median over the processes that timed it, `ms_processes` every
    one, tokens/s, TFLOP/s and MFU rescaled to that median (against the first report's matmul
    peak); the first report's breakdowns. Rows a process did not time count only where timed."""
    first = {k: v for k, v in reports[0].items() if k not in ("tool", "sha256")}  # its seal
    out = {**first, "rows": [], "processes": len(reports)}
    for row in first["rows"]:
        key = tuple(row[k] for k in ROW_KEY)
        ms = [r["ms"] for rep in reports for r in rep["rows"]
              if tuple(r[k] for k in ROW_KEY) == key]
        med = statistics.median(ms)
        scale = row["ms"] / med
        out["rows"].append({**row, "ms": med, "ms_processes": ms,
                            "tokens_per_s": row["tokens_per_s"] * scale,
                            "tflops": row["tflops"] * scale, "mfu": row["mfu"] * scale})
    return out


def in_processes(n: int, out: Path, argv: list[str], profile_tokens: int) -> int:
    """Run this bench `n` times, each in a fresh process writing under out/process-I (argv as
    given, then --processes 1 and that --out), and write the aggregate (`aggregate`) to out.
    Returns 1 when a process fails (its exit status is printed), else 0."""
    import subprocess

    reports = []
    for i in range(n):
        sub_out = out / f"process-{i}"
        cmd = [sys.executable, __file__, *argv, "--processes", "1", "--out", str(sub_out)]
        print(f"process {i + 1} of {n}: {' '.join(cmd[1:])}", flush=True)
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            print(f"process {i + 1} exited with status {rc}; no aggregate written", flush=True)
            return 1
        reports.append(json.loads((sub_out / "prefill.json").read_text()))
    res = aggregate(reports)
    out.mkdir(parents=True, exist_ok=True)
    write_report(res, out, profile_tokens)
    return 0


if __name__ == "__main__":
    sys.exit(main())
