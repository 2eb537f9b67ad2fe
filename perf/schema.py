"""The shape of the bench and trace JSON files, checked when `--compare` reads them, so a file
edited by hand or cut short fails with its path and field named, not deep in a table.

A spec is "num" (a finite number ≥ 0, not a bool), "int" (an integer ≥ 0), "str", "dict",
a dict {key: spec} (a key ending in "?" may be missing), a one-item list [spec] (a list of
those) or ("map", spec) (a dict of any keys to spec); a leading "?" on a string spec, or a
tuple ("?", spec), also allows null.
"""

from __future__ import annotations

import math

from flint_graph.errors import InvalidRequestError, shown

_DECODE = {"engine": "str", "format": "str", "B": "int", "context": "int", "median_ms": "num",
           "p90_ms?": "?num", "steps?": "?int", "tokens_per_s?": "?num", "bytes?": "?num",
           "floor_ms?": "?num", "fraction?": "?num"}
_E2E = {"engine": "str", "format": "str", "B": "int", "tokens?": "?int",
        "prompt_tokens?": "?int", "ms_per_token?": "?num", "ttft_ms?": "?num"}
_PREFILL = {"engine": "str", "format": "str", "tokens": "int", "ms": "?num",
            "tokens_per_s?": "?num", "tflops?": "?num", "mfu?": "?num"}
_INTERLEAVE = {"engine": "str", "format": "str", "prefill_step_ms": "?num",
               "prompts": ["int"], "steps": "int", "tpot_p50_ms": "num", "tpot_p99_ms": "num",
               "tpot_max_ms": "num", "ttft_ms": ("map", "?num")}
_COLD = {"format?": "?str", "total_s?": "?num", "phases?": ("map", "?num"), "note?": "?str"}

BENCH = {"machine": "dict", "model": "dict", "copy_bw?": "?num", "matmul_peak_flops?": "?num", "decode?": [_DECODE],
         "e2e?": [_E2E], "prefill?": [_PREFILL], "interleave?": [_INTERLEAVE],
         "cold_start?": ("?", _COLD),
         "kernels_per_step?": ("map", ("map", "int")), "errors?": ["str"],
         "settings?": ("?", "dict")}
TRACE = {"machine": "dict", "model": "dict", "engine": "str", "format": "str", "B": "int",
         "context": "int", "steps?": "?int", "copy_bw": "num", "step_us": "num",
         "graph_nodes?": ("?", ("map", "int")), "kernels_per_step?": "?int",
         "kernels": [{"index?": "?int", "name": "str", "layer?": "?int", "kind": "str",
                      "start_us": "num", "us": "num", "bytes?": "?num"}]}
SPECS = {"flint-graph-bench": BENCH, "flint-graph-trace": TRACE}


def _bad(path, where: str, expected: str, value) -> InvalidRequestError:
    # in the file's own words (null, "one", true), not Python's (None, 'one', True): a
    # bad-input trial, 2026-12-06
    return InvalidRequestError(f"{path}: field {where or '(top level)'} is {shown(value, 40)}; "
                               f"expected {expected}")


def check(path, value, spec, where: str = "") -> None:
    """Raise InvalidRequestError naming `path` and the field when `value` does not fit `spec`."""
    if isinstance(spec, tuple) and spec[0] == "?":
        if value is not None:
            check(path, value, spec[1], where)
        return
    if isinstance(spec, str) and spec.startswith("?"):
        if value is not None:
            check(path, value, spec[1:], where)
        return
    if spec == "num":
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise _bad(path, where, "a finite number >= 0", value)
    elif spec == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise _bad(path, where, "an integer >= 0", value)
    elif spec in ("str", "dict"):
        if not isinstance(value, {"str": str, "dict": dict}[spec]):
            raise _bad(path, where, f"a {'string' if spec == 'str' else 'JSON object'}", value)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise _bad(path, where, "a JSON list", value)
        for i, item in enumerate(value):
            check(path, item, spec[0], f"{where}[{i}]")
    elif isinstance(spec, tuple):  # ("map", value spec)
        if not isinstance(value, dict):
            raise _bad(path, where, "a JSON object", value)
        for k, v in value.items():
            check(path, v, spec[1], f"{where}.{k}" if where else k)
    else:  # a dict of fields
        if not isinstance(value, dict):
            raise _bad(path, where, "a JSON object", value)
        for key, sub in spec.items():
            name = key.rstrip("?")
            here = f"{where}.{name}" if where else name
            if name not in value:
                if key.endswith("?"):
                    continue
                raise InvalidRequestError(f"{path}: field {here} is missing")
            check(path, value[name], sub, here)
