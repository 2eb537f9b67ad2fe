"""The sandbox a checkpoint's chat template renders in: Jinja's immutable sandbox, set up as HF
transformers sets up `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls, a `tojson`
that is plain `json.dumps`, `raise_exception` and `strftime_now` globals), with a budget per
render.

A chat template is code from the checkpoint, run on every request. The sandbox keeps it from
reaching Python; the budget keeps it from taking the process's time or memory (issue 26, and
the bad-input trials since). Three rules, each a TemplateError that names the limit:
- Time and work: every call, filter and operator is charged to the render (RENDER_SECONDS,
  RENDER_CALLS, RENDER_RANGE_ITEMS, RENDER_INT_BITS), and a watchdog stops a render that
  reaches no check (`_Watchdog`).
- Memory: the large values a render built and still holds take at most RENDER_MEMORY
  (`_held_bytes`, by reference counts).
- Size, checked before the value is built: no operator, method, filter, format or output
  builds text longer than RENDER_CHARS. A result's size is estimated from its inputs: the
  widths and precisions of `%`, `|format` and `str.format` (`"%999999999d" % 1` asked for a
  1 GB string and took 21 s before the output cap saw it), padding (`center`, `ljust`,
  `rjust`, `zfill`, `expandtabs`, `|center`, `|indent`), `replace`, `translate`, `join`,
  `tojson`'s indent and separators, what splits or expands (`_GROWTH`), and the text a list or
  dict becomes (`[s] * 60` or `[s, s, s, ...]` of one 60M-character
  string), from `_text_size`.
A single value of up to RENDER_CHARS characters may still be built (~0.1 s, a few hundred MB
at most); a chat template renders a few KB.
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import gc
import heapq
import json
import math
import re
import sys
import threading
import time
import types
from collections.abc import Iterator
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter, safe_range
from jinja2.utils import Namespace

from flint_graph.errors import TemplateError

__all__ = ["RENDER_CHARS", "RENDER_SECONDS", "compile_template", "render_budgeted",
           "template_variables"]

RENDER_SECONDS = 5.0  # wall time, checked at every call and operator the template evaluates
RENDER_CALLS = 2_000_000  # calls (functions, macros, filters) and operators
RENDER_RANGE_ITEMS = 2_000_000  # items of range() and of lists filters build, per render
RENDER_CHARS = 64 << 20  # characters of the output, and of any value one operation builds
RENDER_MEMORY = 1 << 30  # bytes of the values one render built and still holds
_MEMORY_CHECK_CHARS = 8 << 20  # characters (or items) built between two looks at the memory
_TRACKED_CHARS = 16 << 10  # values from this size on are counted in RENDER_MEMORY
RENDER_INT_BITS = 1 << 16  # bits of an integer ** may produce
_BUDGET: contextvars.ContextVar[list | None] = contextvars.ContextVar("render_budget",
                                                                      default=None)


def _held_bytes(tracked: dict[int, Any]) -> int:
    """Bytes of the tracked values something besides `tracked` still refers to; the others
    (dropped by the template: an accumulated prompt's earlier copies) leave `tracked`."""
    total = 0
    for key in list(tracked):
        value = tracked[key]
        if sys.getrefcount(value) > 3:  # `tracked`, `value` and getrefcount's argument
            total += sys.getsizeof(value)
        else:
            del tracked[key]
    return total


def _spend(calls: int = 1, items: int = 0, chars: int = 0) -> None:
    """Charge the current render's budget ([deadline, calls left, items left, characters
    until the next memory check, {id: value} of the large values it built]). Why the memory
    the render's values hold and not a total of characters built: a template that accumulates
    its prompt (`ns.p = ns.p ~ ...`) builds the square of its size while holding only the last
    copy (a 260K-character chat was refused at a 128M-character total), and one that keeps
    copies holds all of them; and not the process's growth, which other threads share (a
    1.5 GB allocation beside a render refused it; bad-input trials, 2026-12-05)."""
    b = _BUDGET.get()
    if b is None:
        return
    b[1] -= calls
    b[2] -= items
    b[3] -= chars + items
    if b[1] < 0:
        raise TemplateError(f"chat template: more than {RENDER_CALLS:,} calls and operations "
                            "in one render")
    if b[2] < 0:
        raise TemplateError(f"chat template: its range() loops and the lists it builds exceed "
                            f"{RENDER_RANGE_ITEMS:,} items in one render")
    if b[3] < 0:  # every 8M characters built: how much the process has grown
        b[3] = _MEMORY_CHECK_CHARS
        held = _held_bytes(b[4])
        if held > RENDER_MEMORY:
            raise TemplateError(f"chat template: its values hold {held >> 20:,} MiB (at most "
                                f"{RENDER_MEMORY >> 20:,} MiB in one render)")
    if time.perf_counter() > b[0]:
        raise TemplateError(f"chat template: rendering took more than {RENDER_SECONDS:g} s")


# --- sizes, estimated before building -------------------------------------------------------

def _refuse(size: int, what: str) -> None:
    if size > RENDER_CHARS:
        raise TemplateError(f"chat template: {what} would build a value of {size:,} characters "
                            f"or more, longer than {RENDER_CHARS:,}")


def _text_size(value: Any, limit: int = RENDER_CHARS) -> int:
    """Characters of `str(value)` (or of its JSON), estimated from below without building it,
    stopping once past `limit`. A string counts its length (repr's quotes and escapes are not
    counted: they at most multiply a bounded size); containers count their items (each
    reference to a shared string again, which is where `[s] * 60` gets its size)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v) + 2
        elif isinstance(v, (list, tuple, set, frozenset)):
            total += 2 + len(v)
            stack.extend(v)
        elif isinstance(v, dict):
            total += 2 + 2 * len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, Namespace):  # its repr shows its attributes
            stack.append(object.__getattribute__(v, "_Namespace__attrs"))
        elif isinstance(v, int) and not isinstance(v, bool):
            total += 2 + v.bit_length() * 3 // 10
        elif isinstance(v, (bytes, bytearray)):
            total += 4 * len(v)
        else:
            total += 8
    return total


def _count(value: Any) -> int:
    """An int size argument as given, 0 for anything else (the call then fails on its own)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _charge(value: Any) -> Any:
    """Charge a value an operation built to the render (its characters, or its items), and
    count the items of a lazy one as they come. Returns it (a generator wrapped)."""
    if isinstance(value, (str, bytes, bytearray)):
        if len(value) >= _TRACKED_CHARS:
            b = _BUDGET.get()
            if b is not None:
                b[4][id(value)] = value
        _spend(calls=0, chars=len(value))
    elif isinstance(value, (list, tuple, dict, set, frozenset)):
        _spend(calls=0, items=len(value))
    elif isinstance(value, types.GeneratorType):
        return _counted(value)
    return value


def _counted(items: Iterator) -> Iterator:
    for item in items:  # `|batch(1)` of a 60M-character string: 60M lists, 6.5 GB
        _spend(calls=0, items=1)
        yield item


# filters that build a list from their input's items (charged before they run)
_ITEM_FILTERS = frozenset({"list", "batch", "slice", "sort", "reverse", "unique", "dictsort",
                           "groupby", "items", "map", "select", "reject", "selectattr",
                           "rejectattr"})
# filters and str methods whose work or intermediate lists grow with their input by more than
# its size: a regex split per word (title, wordwrap, striptags), 12 bytes per character
# (urlencode), case changes that expand ("ﬃ".upper() is "FFI"), splits into one string per
# word or line (4.5 GB for `|title` of 60M characters, bad-input trial 2026-12-05)
_GROWTH = {"title": 8, "wordwrap": 8, "striptags": 8, "wordcount": 8, "urlencode": 12,
           "upper": 3, "lower": 3, "capitalize": 3, "swapcase": 3, "casefold": 3,
           "split": 8, "rsplit": 8, "splitlines": 8, "partition": 2, "rpartition": 2}


# `%` conversions: (mapping key)? flags width(.precision)? length? type
_PERCENT_SPEC = re.compile(r"%(\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?(.)", re.S)
_DIGITS = re.compile(r"\d+")


def _number(digits: str) -> int:
    return int(digits) if len(digits) <= 12 else RENDER_CHARS + 1  # int() of a 1M-digit run


def _percent_size(fmt: str, args: Any) -> int:
    """Characters of `fmt % args` (from above for widths and precisions, from below for the
    values), without formatting."""
    values = list(args) if isinstance(args, tuple) else [args]
    mapping = args if isinstance(args, dict) else None
    size, i = len(fmt), 0
    for m in _PERCENT_SPEC.finditer(fmt):
        key, width, precision, conv = m.groups()
        if conv == "%":
            continue
        for g in (width, precision):
            if g == "*":
                size += _count(values[i]) if i < len(values) else 0
                i += 1
            elif g:
                size += _number(g)
        if key is not None:
            value = mapping.get(key[1:-1]) if mapping is not None else None
        else:
            value = values[i] if i < len(values) else None
            i += 1
        size += _text_size(value) if conv in "sra" else 0
        if size > RENDER_CHARS:
            break
    return size


class _FieldSizes(SandboxedFormatter):
    """`str.format`'s fields walked through the sandbox's lookups (nested specs resolved),
    their widths, precisions and values summed instead of formatted."""

    def __init__(self, env: jinja2.Environment) -> None:
        super().__init__(env)
        self.size = 0

    def format_field(self, value: Any, format_spec: str) -> str:
        size = sum(map(_number, _DIGITS.findall(format_spec))) + _text_size(value)
        self.size += size
        # a nested field (`{:{w}}`) is formatted into the outer spec: keep short values
        return format(value, "") if size <= 64 and not format_spec else ""


def _method_size(obj: Any, args: tuple, kwargs: dict) -> int:
    """Characters (bytes) a str or bytes method call would build, or the work it does in
    units of characters (0: not one that grows its string)."""
    s, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(s, (str, bytes, bytearray)):
        return 0
    if name in _GROWTH:
        return len(s) * _GROWTH[name]
    if name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        return len(s) * max(1, longest)
    if name in ("center", "ljust", "rjust", "zfill"):
        return max(len(s), _count(args[0]) if args else 0)
    if name == "expandtabs":
        tab = _count(args[0] if args else kwargs.get("tabsize", 8))
        return len(s) + s.count("\t") * tab
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        count = _count(args[2]) if len(args) > 2 else -1
        return _replace_size(s, args[0], args[1], count)
    if name == "join" and args:
        return _text_size(args[0]) + len(s) * max(0, _len(args[0]) - 1)
    return 0


def _len(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        return 0


def _replace_size(s: str, old: str, new: str, count: int = -1) -> int:
    hits = s.count(old) if old else len(s) + 1
    if count >= 0:
        hits = min(hits, count)
    return len(s) + hits * max(0, len(new) - len(old))


# filters that build nothing from their value: not measured (Qwen3's template asks
# `messages|length` in a loop over the messages: measuring the list each time made a
# 2,000-message chat run past the time limit; bad-input trial, 2026-12-05)
_INSPECTING = frozenset({"length", "count", "first", "last", "random", "default", "d", "attr",
                         "int", "float", "abs", "round", "filesizeformat"})


def _filter_size(name: str, args: tuple, kwargs: dict) -> int:
    """Characters the filter `name` would build from its value `args[0]` and its arguments."""
    if name in _INSPECTING:
        return 0
    value = args[0] if args else None
    size = _text_size(value)
    if name in _GROWTH:
        size *= _GROWTH[name]
    if name == "center":
        size = max(size, _count(args[1] if len(args) > 1 else kwargs.get("width", 80)))
    elif name == "indent":
        width = args[1] if len(args) > 1 else kwargs.get("width", 4)
        per_line = len(width) if isinstance(width, str) else _count(width)
        lines = value.count("\n") + 1 if isinstance(value, str) else 1
        size += lines * per_line
    elif name == "format":
        if isinstance(value, str):
            size = _percent_size(value, kwargs or tuple(args[1:]))
    elif name == "replace":
        if len(args) >= 3 and all(isinstance(a, str) for a in args[:3]):
            count = args[3] if len(args) > 3 else kwargs.get("count")
            size = _replace_size(value, args[1], args[2], -1 if count is None else _count(count))
    elif name == "join":
        sep = args[1] if len(args) > 1 else kwargs.get("d", "")
        size += len(str(sep)) * max(0, _len(value) - 1)
    elif name == "tojson":
        indent = args[2] if len(args) > 2 else kwargs.get("indent")
        per_line = len(indent) if isinstance(indent, str) else _count(indent)
        size += _text_size(value) * per_line if per_line else 0  # a line per item at worst
        seps = args[3] if len(args) > 3 else kwargs.get("separators")
        if isinstance(seps, (list, tuple)):  # one per item at worst
            size += _text_size(value) * sum(len(x) for x in seps if isinstance(x, str))
    return size


def _guard_filter(name: str, f: Any) -> Any:
    """`f` with its size checked before it runs; Jinja's pass_* marker kept (the first
    argument is then the environment or context, not the value)."""
    skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(f)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _spend()
        rest = args[skip:]
        if name == "join" and rest and not isinstance(rest[0], (str, list, tuple, dict)):
            rest = (list(rest[0]),) + rest[1:]  # a generator: its items once, then measured
            args = args[:skip] + rest
        _refuse(_filter_size(name, rest, kwargs), f"the filter |{name}")
        if name in _ITEM_FILTERS and rest:
            _spend(calls=0, items=_len(rest[0]))
        return _charge(f(*args, **kwargs))

    return guarded


# --- the environment --------------------------------------------------------------------------

class _BudgetedCodeGenerator(CodeGenerator):
    """Jinja's code generator with `~` (concatenation) routed through the environment's
    `budgeted_concat`, which the sandbox cannot intercept otherwise (string doubling with `~`
    reached gigabytes)."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.budgeted_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every call, filter and `*`, `**`, `+`, `%`, `~` charged to
    the render's budget, and each refused where its result would be too large to build."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BudgetedCodeGenerator

    def budgeted_concat(self, values) -> str:
        """`a ~ b ~ ...` (no autoescape here: str of each, joined) within the budget."""
        _spend()
        _refuse(sum(_text_size(v) for v in values), "`~`")
        return _charge("".join(str(v) for v in values))

    def concat(self, parts) -> str:  # a block's or a macro's output, joined
        parts = list(parts)
        _refuse(sum(map(len, parts)), "a block's or a macro's output")
        return _charge("".join(parts))

    def wrap_str_format(self, value: Any):
        """Jinja's sandboxed `str.format` / `format_map`, its fields' sizes summed first."""
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        @functools.wraps(wrapper)
        def measured(*args: Any, **kwargs: Any) -> str:
            sizes = _FieldSizes(self)
            if is_map and len(args) == 1 and not kwargs:
                sizes.vformat(fmt, (), args[0])
            else:
                sizes.vformat(fmt, args, kwargs)
            _refuse(len(fmt) + sizes.size, f"str.{value.__name__}")
            return wrapper(*args, **kwargs)

        return measured

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        _spend()
        size = _method_size(__obj, args, kwargs)
        if size > RENDER_CHARS:
            _refuse(size, f"str.{getattr(__obj, '__name__', '?')}")
        return _charge(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _spend()
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
        if operator == "**" and ints and abs(left) > 1 and right > 0 and \
                right * math.log2(abs(left)) > RENDER_INT_BITS:
            raise TemplateError(f"chat template: {left} ** {right} is larger than "
                                f"{RENDER_INT_BITS:,} bits")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                    size = (len(seq) if isinstance(seq, (str, bytes)) else _text_size(seq)) * n
                    if size > RENDER_CHARS:
                        raise TemplateError(f"chat template: a sequence of length {len(seq):,} "
                                            f"times {n:,} is longer than {RENDER_CHARS:,} "
                                            "characters")
        if operator == "+" and all(isinstance(v, (str, list, tuple)) for v in (left, right)):
            if _text_size(left) + _text_size(right) > RENDER_CHARS:  # (at least their len)
                raise TemplateError(f"chat template: builds a value longer than "
                                    f"{RENDER_CHARS:,}")
        if operator == "%" and isinstance(left, str):
            _refuse(_percent_size(left, right), "`%` formatting")
        return _charge(super().call_binop(context, operator, left, right))


def _checked_output(value: Any) -> Any:
    """Jinja's finalize: a `{{ value }}` is measured before it becomes text, and charged (in a
    `{% set %}` block or a macro it builds a value the output cap does not see)."""
    size = _text_size(value)
    if not isinstance(value, str):
        _refuse(size, "printing a value")
    _spend(calls=0, chars=size)
    return value


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    # HF's override of Jinja's tojson: plain json.dumps (no HTML escaping), non-ASCII kept.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _budget_range(*args: int) -> range:
    r = safe_range(*args)
    _spend(items=len(r))
    return r


@lru_cache(maxsize=8)
def template_variables(template: str) -> frozenset[str] | None:
    """The names a chat template reads from its caller: loaded before anything in the
    template assigns them (a `set`, a loop or macro variable, a macro's name), walking its
    syntax tree in the order it runs (a `set`'s value before its target, a loop's iterable
    before its variable). From the tree alone: no code generation, so a hostile template's
    expressions are not folded outside the render budget. None when it does not parse
    (`compile_template` then says why). A keyword argument for the template that is not one
    of these would have no effect: the chat API refuses it (`render_chat_segments`). Scopes
    are not tracked, so a name assigned in one loop counts as assigned after it too."""
    nodes = jinja2.nodes
    try:
        tree = jinja2.Environment().parse(template)
    except (jinja2.TemplateSyntaxError, RecursionError, MemoryError):
        return None
    assigned: set[str] = set()
    free: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, list):
            for n in node:
                visit(n)
            return
        if not isinstance(node, nodes.Node):
            return
        if isinstance(node, nodes.Name):
            if node.ctx == "load":
                if node.name not in assigned:
                    free.add(node.name)
            else:  # store, param
                assigned.add(node.name)
            return
        if isinstance(node, nodes.Assign):
            order = [node.node, node.target]
        elif isinstance(node, nodes.AssignBlock):
            order = [node.body, node.filter, node.target]
        elif isinstance(node, nodes.For):
            order = [node.iter, node.target, node.test, node.body, node.else_]
        elif isinstance(node, nodes.With):
            order = [node.values, node.targets, node.body]
        elif isinstance(node, (nodes.Macro, nodes.CallBlock)):
            if isinstance(node, nodes.Macro):
                assigned.add(node.name)
            order = [node.defaults, node.args, node.body] + (
                [node.call] if isinstance(node, nodes.CallBlock) else [])
        else:
            order = list(node.iter_child_nodes())
        for child in order:
            visit(child)

    try:
        visit(tree.body)
    except RecursionError:
        return None
    return frozenset(free)


@lru_cache(maxsize=8)
def compile_template(template: str) -> jinja2.Template:
    """Compile a chat template (str) in the budgeted sandbox. Raises TemplateError if it does
    not compile (syntax, nesting too deep, too large)."""
    env = _BudgetedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                           finalize=_checked_output)
    env.filters["tojson"] = _tojson
    for name in list(env.filters):
        env.filters[name] = _guard_filter(name, env.filters[name])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = _budget_range
    env.globals.pop("lipsum", None)  # megabytes of filler text on request: no use in a prompt
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from e
    except RecursionError:
        raise TemplateError("chat template does not compile: nested too deeply") from None
    except MemoryError:
        raise TemplateError("chat template does not compile: too large") from None


class _RenderTimeout(BaseException):
    """Raised inside a render that ran past its time (BaseException: no `except Exception` on
    the way swallows it)."""


class _Ticket:
    """One render's watch: its thread, and whether it ended (`done`) or was stopped (`fired`),
    both set under its own lock."""

    __slots__ = ("deadline", "tid", "lock", "done", "fired")

    def __init__(self, deadline: float, tid: int) -> None:
        self.deadline, self.tid = deadline, tid
        self.lock = threading.Lock()
        self.done = self.fired = False

    def __lt__(self, other: "_Ticket") -> bool:
        return self.deadline < other.deadline


class _Watchdog:
    """One daemon thread that raises _RenderTimeout in a thread whose render runs past its
    deadline (CPython's PyThreadState_SetAsyncExc: delivered at the thread's next bytecode).
    Why: the budget is charged at calls, operators and filters, and a loop whose body does
    none of those (`{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}` over a long
    string) never reached a check: it ran without end, and kept the server from exiting
    (bad-input trial, 2026-12-05). A single C call (one filter over 64M characters) still
    finishes first; its size is bounded by the checks above.
    The exception is raised under the render's own ticket lock only, never under the lock
    every render takes to start: a render ending at its deadline can receive it while taking
    its ticket lock and keep that lock (it is never used again), where it had kept the shared
    one and hung every later render (bad-input trial, 2026-12-05)."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._due: list[_Ticket] = []
        self._thread: threading.Thread | None = None

    def start(self, seconds: float) -> _Ticket:
        ticket = _Ticket(time.monotonic() + seconds, threading.get_ident())
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="flint-graph-template-watchdog")
                self._thread.start()
            heapq.heappush(self._due, ticket)
            self._cv.notify()
        return ticket

    @staticmethod
    def stop(ticket: _Ticket) -> None:
        """End the watch; a timeout raised but not yet delivered is withdrawn (it may also
        arrive during this call: the caller catches it)."""
        with ticket.lock:
            ticket.done = True
            if ticket.fired:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ticket.tid), None)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._due and self._due[0].done:
                    heapq.heappop(self._due)  # ended in time
                if not self._due:
                    self._cv.wait()
                    continue
                left = self._due[0].deadline - time.monotonic()
                if left > 0:
                    self._cv.wait(left)
                    continue
                ticket = heapq.heappop(self._due)
            with ticket.lock:  # not under self._cv (see the class docstring)
                if not ticket.done:
                    ticket.fired = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(ticket.tid), ctypes.py_object(_RenderTimeout))


_WATCHDOG = _Watchdog()


def render_budgeted(compiled: jinja2.Template, **variables: Any) -> str:
    """`compiled.render(**variables)` within the render budget (module docstring): output
    gathered chunk by chunk up to RENDER_CHARS characters, the whole render stopped by a
    watchdog 1 s past RENDER_SECONDS if no check saw the time first. Raises TemplateError past
    a limit (and jinja2's errors from the template itself)."""
    budget = [time.perf_counter() + RENDER_SECONDS, RENDER_CALLS, RENDER_RANGE_ITEMS,
              _MEMORY_CHECK_CHARS, {}]
    token = _BUDGET.set(budget)
    try:
        ticket = _WATCHDOG.start(RENDER_SECONDS + 1.0)
        try:
            parts, size = [], 0
            for chunk in compiled.generate(**variables):
                size += len(chunk)
                if size > RENDER_CHARS:
                    raise TemplateError(f"chat template: its output passes {RENDER_CHARS:,} "
                                        "characters")
                parts.append(chunk)
                _spend(calls=0)
            return "".join(parts)
        finally:
            _WATCHDOG.stop(ticket)
    except _RenderTimeout:
        why = f"chat template: rendering took more than {RENDER_SECONDS:g} s (stopped in a loop)"
    except MemoryError:
        why = "chat template: ran out of memory while rendering"
    except TemplateError as e:
        why = str(e)
    finally:
        held = sum(map(sys.getsizeof, budget[4].values()))
        budget[4].clear()
        _BUDGET.reset(token)
    # Raised here, out of the except blocks, so that it carries no traceback into the
    # template's frames: a refused render's values stayed alive with the exception the caller
    # held, and in reference cycles after it (five refusals in a row held 5 GB; bad-input
    # trial, 2026-12-05)
    if held > 64 << 20:
        gc.collect()
    raise TemplateError(why)
