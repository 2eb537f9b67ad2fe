"""`flint-graph chat`: the interactive terminal chat, drawn with `rich`.

While an answer streams, a live region shows the tail of its reasoning (dimmed) and content;
once it is done the region is erased and the message printed once: reasoning collapsed to one
line (unless --show-reasoning), content, one panel per tool call (the user types the tool's
result, which goes back as a `tool` message). The live region draws `live_text`'s safe view of
the text, so no character the model emits can make it miscount its lines and corrupt the screen;
the printed message and the transcript keep the real text. Ctrl-C stops the current answer and
keeps the session; `/save FILE` writes the transcript atomically (temporary file + rename), so a
crash never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from flint_graph.checkpoints import jsonfile
from flint_graph.errors import ContextLengthError, FlintError, counted, not_utf8
from flint_graph.paths import replace_file
from flint_graph.terminal.live_text import printable, tail_lines
from flint_graph.terminal.progress import prefill_bar
from flint_graph.terminal.stdout_console import StdoutConsole

__all__ = ["ChatSession", "save_transcript", "printable", "HELP"]

COMMANDS = ("/exit", "/quit", "/reset", "/save", "/reasoning", "/help")
HELP = ('""" starts and ends a message of several lines · '
        "/reset  start a new conversation · /save FILE  save the transcript as JSON · "
        "/reasoning  show the last reasoning · /help  every command · "
        "/exit  quit (or /quit, Ctrl-D)")
ECHO_CHARS = 2000  # of a piped line printed back after its prompt (the rest is counted)
ECHO_LINES = 20  # of a piped """ message printed back (the rest is counted)
# the longest piped line read (characters): far above what the largest context holds (the
# exact check by the model's context follows), as `generate` caps its stdin at 64 MiB
PIPED_LINE_MAX_CHARS = 64 << 20
FENCE = '"""'  # a message of several lines is fenced by it, as in ollama's terminal chat
# /help: every command and key, one a line (the banner's HELP is the one-line reminder)
HELP_LONG = (
    "/reset           start a new conversation (the system prompt and tools stay)\n"
    "/save FILE       save the transcript as JSON (the OpenAI messages format)\n"
    "/reasoning       show the last answer's reasoning in full\n"
    "/help            this list\n"
    "/exit, /quit     quit (or Ctrl-D at the prompt)\n"
    '"""              on its own or before text: a message of several lines, up to the next """\n'
    "Ctrl-C           stop the answer being written; before its first word it also takes\n"
    "                 your message back (at the prompt: nothing; Ctrl-D quits)")


TRANSCRIPT_CHECK_BYTES = 256 << 20  # larger files are not read to decide (and are not replaced)


def _saved_transcript(path: Path) -> tuple[list, list] | None:
    """(messages, tools) of what save_transcript wrote at `path` (tools [] when none were
    declared), or None when the file is not such a transcript (or too large to check): an
    object with a "messages" list and nothing but an optional "tools" list beside it. (An
    OpenAI request body, `{"model": …, "messages": […], "max_tokens": …}`, also has a
    "messages" list: taken for a transcript, its other keys were lost on /save, a bad-input
    trial of 2026-12-06.)"""
    try:
        if path.stat().st_size > TRANSCRIPT_CHECK_BYTES:
            return None
        obj = jsonfile.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not UTF-8, or not JSON (jsonfile.loads)
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) \
            or not set(obj) <= {"messages", "tools"}:
        return None
    tools = obj.get("tools", [])
    return (obj["messages"], tools) if isinstance(tools, list) else None


_QUEUED: dict[int, bytes] = {}  # bytes read from a terminal but not yet given out, per fd
_eof_pending: dict[int, bool] = {}  # a Ctrl-D read after them, per fd
_LINE_END = re.compile(rb"\r\n|\r|\n")


def queued_line(stream) -> str | None:
    """A line or a Ctrl-D the user typed while no one read the terminal (an answer streaming):
    the line without its newline, EOFError for the Ctrl-D, None when nothing whole is queued
    (or `stream` is no terminal). Read before input() because readline's switch to raw mode
    dropped a queued Ctrl-D: "Ctrl-D quits" failed while an answer streamed (new-user trial,
    2026-12-04). In canonical mode the terminal is readable only once a whole line or an
    end-of-file is queued, so a half-typed line is left for readline to edit.

    A paste can queue many lines at once, and those that arrived while readline held the
    terminal in raw mode end in a carriage return, not a newline: each is its own line, given
    one per call (a 45-line paste into a fenced message was one line joined by CRs, and the
    model answered it wrongly: new-user trial, 2026-12-06). Everything queued is read, in as
    many reads as it takes, and kept as bytes until its line ends, so a long paste is neither
    cut at a read's end nor split inside a UTF-8 character (a bad-input trial: both happened
    at ~4 KB). A last piece with no line end yet goes back to readline's edit buffer
    (`pending_text`), where the user finishes it."""
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return None
        buf = _QUEUED.get(fd, b"") + _read_ready(fd)
    except (OSError, ValueError, AttributeError):  # closed, not a real file
        return None
    m = _LINE_END.search(buf)
    if m is None:
        _QUEUED[fd] = buf
        if buf == b"" and _eof_pending.pop(fd, False):
            raise EOFError
        return None
    _QUEUED[fd] = buf[m.end():]
    return buf[:m.start()].decode("utf-8", "surrogateescape")


@contextlib.contextmanager
def _prefilled(text: str):
    """The next input() starts with `text` in readline's edit buffer (nothing when empty or
    readline is not loaded)."""
    rl = sys.modules.get("readline") if text else None
    if rl is None:
        yield
        return
    rl.set_startup_hook(lambda: rl.insert_text(text))
    try:
        yield
    finally:
        rl.set_startup_hook()


def _read_ready(fd: int) -> bytes:
    """All bytes the terminal `fd` has ready now (b"" when none); an end-of-file (a read of
    nothing while readable: Ctrl-D) is noted for `queued_line`."""
    import select

    out = b""
    while select.select([fd], [], [], 0)[0]:
        data = os.read(fd, 1 << 16)
        if not data:
            _eof_pending[fd] = True
            break
        out += data
    return out


def pending_text(stream) -> str:
    """The queued piece of a line with no line end yet (a paste that did not end in Enter),
    taken out of the queue: the chat puts it in readline's edit buffer for the next prompt."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return ""
    rest = _QUEUED.pop(fd, b"")
    return rest.decode("utf-8", "surrogateescape") if rest else ""


def drop_queued(stream) -> None:
    """Forget every line queued for `stream` (Ctrl-C during an answer: the rest of a paste is
    not sent on its own, one message at a time)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    _QUEUED.pop(fd, None)
    try:
        _read_ready(fd)
    except OSError:
        pass


def _file_argument(text: str) -> str:
    """The one file name of a /save argument, read as a shell reads words (`shlex`): quotes
    group and are removed (`/save ""` had written a file named "" with its quotes), and more
    than one word is refused (`/save a b c` had written a file named "a b c").
    Raises ValueError saying what was expected."""
    try:
        words = shlex.split(text)
    except ValueError as e:  # "No closing quotation"
        raise ValueError(f"could not read the file name ({str(e).lower()}; quote a name that "
                         "holds a quote: /save \"it's.json\")") from None
    if len(words) != 1 or not words[0].strip():
        found = f"{len(words)} words" if len(words) > 1 else "a blank name" if words else "none"
        raise ValueError(f"expected one file name, found {found} (quote a name with spaces)")
    if "\0" in words[0]:  # the OS cannot name a file so (it was an internal error)
        raise ValueError("a file name cannot hold a NUL character")
    return words[0]


def openai_messages(messages: list) -> list:
    """`messages` as the OpenAI chat API writes them: each tool call's `function.arguments` a
    JSON string (the chat keeps them as mappings, which `LLM.chat` also takes); everything else
    unchanged. A transcript saved before (arguments as mappings) compares equal after this."""
    def call(c):
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or isinstance(f.get("arguments"), str) or "arguments" not in f:
            return c
        return {**c, "function": {**f, "arguments": json.dumps(f["arguments"],
                                                               ensure_ascii=False)}}
    return [{**m, "tool_calls": [call(c) for c in m["tool_calls"]]}
            if isinstance(m, dict) and isinstance(m.get("tool_calls"), list) else m
            for m in messages]


def save_transcript(path: str | Path, messages: list[dict[str, Any]],
                    replaced: list | None = None, tools: list[dict] | None = None) -> Path:
    """Write `messages` as JSON to `path` atomically (in the OpenAI messages format:
    `openai_messages`; with `tools`, the declared tools beside them, as a chat request carries
    them, so the transcript replays as it ran) (same-directory temp file, then rename);
    appends True to `replaced` when an existing transcript was overwritten. An existing
    transcript is replaced only by one that begins with all its messages and declares the same
    tools (the same conversation, saved again as it grew), so no saved message or tool is ever
    lost; any other existing file, or transcript, is refused (FlintError), never replaced.

    Raises FlintError naming the path if the directory does not exist or is not writable, or
    the name cannot be a file there (too long, a symlink loop, a directory): every such case
    is the user's to fix, and the chat goes on."""
    if str(path) == "-":  # the usual "standard output" of a command line: not here
        raise FlintError("-: /save writes a file, not standard output; give a file name")
    if str(path).endswith(("/", os.sep)):  # `new/` wrote a file named "new"
        raise FlintError(f"{path}: names a directory (it ends with /); give a file name")
    path = Path(path).expanduser()
    try:
        if path.exists() and not path.is_file():  # before resolving: /dev/stdout is a pipe
            raise FlintError(f"{path}: exists and is not a regular file (a directory, device "
                             "or pipe); choose a file name")
        if path.is_symlink():
            path = path.resolve()  # replace the file the link points at, keep the link
        if not path.parent.is_dir():
            above = next((a for a in path.parents if a.exists()), None)
            if above is not None and not above.is_dir():
                raise FlintError(f"{path}: {above} is a file, not a directory")
            raise FlintError(f"{path}: directory {path.parent} does not exist")
        existed = path.exists()
        record: dict[str, Any] = {"messages": openai_messages(messages)}
        if tools:
            record["tools"] = tools
        text = json.dumps(record, ensure_ascii=False, indent=2)
        found = _saved_transcript(path) if existed else ([], [])
        if found is None:
            # /save replaces only its own files: anything else there is the user's data
            raise FlintError(f"{path}: exists and is not a chat transcript; choose another "
                             "name, or delete it first")
        saved, saved_tools = openai_messages(found[0]), found[1]
        written = json.loads(text)  # what the file will hold, as a later read sees it
        if written["messages"][:len(saved)] != saved:
            # another conversation (or this one after /reset): replacing it would lose it
            raise FlintError(f"{path}: holds a transcript of {counted(len(saved), 'message')} that this "
                             f"chat's {len(messages)} do not begin with; choose another name, "
                             "or delete it first")
        if existed and written.get("tools", []) != saved_tools:
            # the same messages under other declared tools are another conversation: the
            # tools are part of what the model saw (a bad-input trial, 2026-12-06)
            raise FlintError(f"{path}: holds a transcript of a chat with other tools "
                             f"({len(saved_tools)} declared there, {len(tools or [])} here); "
                             "choose another name, or delete it first")
    except (OSError, RuntimeError) as e:  # ENAMETOOLONG, ELOOP; RuntimeError: a symlink loop
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise FlintError(f"{path}: cannot save transcript ({why})") from None
    try:
        replace_file(path, text)
        if existed and replaced is not None:
            replaced.append(True)
    except OSError as e:
        raise FlintError(f"{path}: cannot save transcript ({e.strerror or e})") from None
    return path


class ChatSession:
    """One interactive conversation.

    Args: llm: a loaded flint_graph.LLM; params: SamplingParams for every answer; tools: OpenAI
    function tools or None; system: optional system message; enable_thinking: reasoning on/off;
    show_reasoning: keep reasoning expanded; console: a rich Console (tests pass their own);
    echo_input: print each input line after its prompt (default: when stdin is piped);
    tools_path: the --tools file the tools came from (named in the note on a call shown as
    text when it declares none).
    """

    def __init__(self, llm, params, tools=None, system: str | None = None,
                 enable_thinking: bool = True, show_reasoning: bool = False,
                 console: Console | None = None, echo_input: bool | None = None,
                 tools_path: str | None = None):
        self.llm, self.params, self.tools = llm, params, tools
        self.tools_path = tools_path
        self.hinted_tools = False  # the note on a refusal without tools, shown once
        self.hinted_json = False  # the note on a tool result that is not JSON, shown once
        self.system, self.enable_thinking = system, enable_thinking
        self.show_reasoning = show_reasoning
        # piped, rich would break lines at 80 columns inside words; a reader of the file wraps
        self.console = console or StdoutConsole(highlight=False,
                                                soft_wrap=not sys.stdout.isatty())
        # piped input is not echoed by a terminal: `_ask` prints it (None: when this session
        # reads the real stdin and it is not a terminal)
        self.echo_input = (console is None and not sys.stdin.isatty()) if echo_input is None \
            else echo_input
        if console is None and not sys.stdin.isatty():
            # input() reads a line of any length whole: `head -c 1500000000 /dev/zero | tr
            # '\0' a | flint-graph chat` held 3.3 GB before the size check (a bad-input trial)
            self.console.input = self._piped_line  # type: ignore[method-assign]
        self.messages: list[dict[str, Any]] = []
        self.last_reasoning = ""
        self._read_any = False  # whether a line was read yet (a BOM may lead the first)
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def run(self) -> int:
        """Read-eval loop until /exit or end of input; returns the exit code (0)."""
        c = self.console
        if c.is_terminal:
            import readline  # noqa: F401  (line editing and history for input())
        _read_bad_bytes_as_surrogates()
        # the weights' format: the embedded model runs its BF16 twin, not the NVFP4 GGUF the
        # README names first (a new user could not tell which ran)
        fmt = getattr(getattr(self.llm, "checkpoint", None), "format", None)
        c.print(f"[bold]flint-graph chat[/] · {self.llm.cfg.num_hidden_layers} layers · "
                + (f"{str(getattr(fmt, 'value', fmt)).upper()} weights · " if fmt else "")
                + f"{self.llm.device} · {self.llm.engine.name} engine · "
                f"thinking {'on' if self.enable_thinking else 'off'}"
                + (f" · {_count(len(self.tools), 'tool')}" if self.tools else ""))
        c.print(f"[dim]{HELP}[/]")
        while True:
            try:
                line = self._ask("[bold green]you>[/] ")
            except EOFError:
                c.print()
                return 0
            except KeyboardInterrupt:
                c.print("\n[dim](/exit or Ctrl-D quits)[/]")
                continue
            fenced = line.lstrip().startswith(FENCE)
            if fenced:
                line = self._read_fenced(line.lstrip()[len(FENCE):])
                if line is None:
                    return 0
            if not line.strip():
                continue
            if line.startswith("/") and not fenced:  # a fenced message is sent as typed
                if self.command(line.strip()) == "exit":
                    return 0
                continue
            if not self._text_ok(line, "message"):
                continue
            self.messages.append({"role": "user", "content": line})
            if self.answer() == "exit":
                return 0

    def _piped_line(self, prompt: str = "") -> str:
        """`Console.input` for a stdin that is not a terminal: prints `prompt`, then reads one
        line of at most PIPED_LINE_MAX_CHARS characters. A longer one is read to its end
        without being kept, reported, and comes back as "" (nothing is sent; the chat goes
        on). Raises EOFError at the end of the input, as input() does."""
        if prompt:
            self.console.print(prompt, end="")
        line = read_line_capped(sys.stdin, PIPED_LINE_MAX_CHARS)
        if line is None:
            self.console.print(f"\n[yellow]that line holds more than "
                               f"{PIPED_LINE_MAX_CHARS:,} characters, more than any model's "
                               "context: it was not sent[/]")
            return ""
        return line

    def _ask(self, prompt: str, echo: bool = True) -> str:
        """One line of input after `prompt` (rich markup). Piped input is not echoed by a
        terminal, so it is printed after the prompt: a transcript of `chat < turns.txt` reads
        "you> Hi" rather than prompts and answers run together (`echo` False: piped, neither
        the prompt nor the line is printed). A byte-order mark at the start of the input (some
        Windows editors write one) is dropped, as `generate` drops it from stdin: it kept a
        script's opening fence line or first `/save` from being seen as such, and the model
        was answering "<U+FEFF>Hi" (a bad-input trial, 2026-12-06). Raises EOFError at the
        end of the input and KeyboardInterrupt on Ctrl-C, as input() does."""
        line = self._ask_line(prompt, echo)
        if not self._read_any:
            self._read_any = True
            line = line.removeprefix("\ufeff")
        return line

    def _ask_line(self, prompt: str, echo: bool) -> str:
        if not echo and self.echo_input:
            return self.console.input("")
        queued = queued_line(sys.stdin) if self.console.is_terminal else None
        if queued is not None:  # typed while the answer streamed: shown after its prompt
            self.console.print(prompt, end="")
            self.console.print(queued, highlight=False, markup=False)
            return queued
        partial = pending_text(sys.stdin) if self.console.is_terminal else ""
        with _prefilled(partial):  # a pasted piece with no line end: the user finishes it
            line = self.console.input(prompt)
        if self.echo_input:
            # a byte that is not UTF-8 reads as a lone surrogate, which stdout cannot encode;
            # control characters are shown, not obeyed (a piped file could drive the terminal)
            shown = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch
                            for ch in line[:ECHO_CHARS])
            if len(line) > ECHO_CHARS:  # a pasted file is not printed back whole
                shown += f" … ({len(line):,} characters)"
            self.console.print(printable(shown), highlight=False, markup=False)
        return line

    def _read_fenced(self, first: str) -> str | None:
        """The lines of a message fenced by FENCE (the opening line's rest is its first line),
        up to the line that ends with FENCE; None when the input ends first (quit)."""
        lines = [first]
        while not lines[-1].rstrip().endswith(FENCE) or len(lines) == 1 and not first.strip():
            try:
                # piped, a pasted file is printed back by its first ECHO_LINES lines only
                lines.append(self._ask("[bold green]...>[/] ", echo=len(lines) < ECHO_LINES))
            except EOFError:
                self.console.print(f"\n[yellow]the input ended inside a {FENCE} block: that "
                                   "text was not sent[/]")
                return None
            except KeyboardInterrupt:
                self.console.print("\n[dim](message dropped)[/]")
                return ""
        if self.echo_input and len(lines) > ECHO_LINES:
            self.console.print(f"[dim]... ({len(lines) - ECHO_LINES:,} more lines, to "
                               f"{FENCE})[/]")
        lines[-1] = lines[-1].rstrip()[:-len(FENCE)]
        return "\n".join(lines).strip("\n")

    def command(self, line: str) -> str | None:
        """Run one slash command; returns "exit" for /exit."""
        cmd, _, arg = line.partition(" ")
        if cmd in ("/exit", "/quit"):
            return "exit"
        if cmd == "/reset":
            self.reset()
            self.last_reasoning = ""
            self.console.print("[dim]conversation reset[/]")
        elif cmd == "/save":
            try:
                name = _file_argument(arg)
            except ValueError as e:
                self.console.print(f"[red]usage: /save FILE: {escape(str(e))}[/]")
                return None
            if all(m["role"] == "system" for m in self.messages):
                self.console.print("[dim]nothing to save yet: the conversation has no message "
                                   "(a new chat, or just after /reset)[/]")
                return None
            try:
                replaced: list = []
                path = save_transcript(name, self.messages, replaced, self.tools)
                existed = bool(replaced)
                note = " (replaced the existing file)" if existed else ""
                # escaped: a name such as "a[/]b.json" is rich markup (a bad-input trial)
                self.console.print(f"[dim]saved {len(self.messages)} messages to "
                                   f"{escape(str(path))}{note}[/]")
            except FlintError as e:
                self.console.print(f"[red]{escape(str(e))}[/]")
        elif cmd == "/reasoning":
            self.console.print(Text(printable(self.last_reasoning) or "(no reasoning yet)",
                                    style="dim"), soft_wrap=True)
        elif cmd == "/help":
            self.console.print(Text(HELP_LONG, style="dim"))
        else:
            # shown, not obeyed: no control character or rich markup of the user's reaches it
            name = cmd if len(cmd) <= 80 else cmd[:80] + "…"
            self.console.print(f"[red]unknown command {escape(printable(name))}[/] [dim](/help "
                               "lists the commands; a message that starts with / is sent as "
                               "is only inside \"\"\" lines)[/]")
        return None

    def answer(self) -> str | None:
        """Generate assistant turns until one ends without tool calls (or is stopped). At a
        tool-result prompt the slash commands still work (/reset ends the tool loop, /exit
        returns "exit"); an empty result, or one too long for the context, is asked for
        again."""
        pending = None  # the tool calls whose results were just added to the history
        while True:
            try:
                try:
                    stream = self.llm.stream_chat(self.messages, self.tools, self.params,
                                                  enable_thinking=self.enable_thinking)
                except KeyboardInterrupt:  # Ctrl-C while a long message is tokenized
                    self._stopped_early()
                    return None
                msg = self._show(stream)
            except Exception as e:  # keep the session (and its unsaved transcript) alive
                kind = "error" if isinstance(e, FlintError) else \
                    f"internal error: {type(e).__name__}"
                self.console.print(Text(f"{kind}: {e}", style="red"))
                if isinstance(e, ContextLengthError) and pending:
                    # the results just typed are what overflowed: kept, every later turn
                    # would fail the same way
                    del self.messages[-len(pending):]
                    self.console.print(f"[yellow]{RESULT_TOO_LONG}[/]")
                    done = self._read_results(pending)
                    if done:
                        return "exit" if done == "exit" else None
                    continue
                if isinstance(e, ContextLengthError):  # every later turn would fail the same way
                    # ... unless the new message is all there is: then /reset would not help.
                    alone = self.messages[-1:] and self.messages[-1]["role"] == "user" and all(
                        m["role"] == "system" for m in self.messages[:-1])
                    # a system prompt longer than the message is what to shorten
                    system = sum(len(m.get("content") or "") for m in self.messages[:-1]) > \
                        len(self.messages[-1].get("content") or "") if alone else False
                    hint = CONTEXT_FULL if not alone else \
                        too_long_with(bool(self.tools), system) if self.tools or system \
                        else MESSAGE_TOO_LONG
                    self.console.print(f"[yellow]{hint}[/]")
                if self.messages and self.messages[-1]["role"] == "user":
                    self.messages.pop()
                return None
            if msg.finish_reason == "abort" and not (msg.content or msg.reasoning_content
                                                     or msg.tool_calls):
                self._stopped_early()  # an empty assistant turn would mislead
                return None
            self.messages.append(msg.to_dict())
            if not msg.tool_calls or msg.finish_reason == "abort":
                return None
            pending = msg.tool_calls
            done = self._read_results(pending)
            if done:
                return "exit" if done == "exit" else None

    def _stopped_early(self) -> None:
        """Ctrl-C before the answer began: a user message goes back out of the history (a new
        user stopped a 7K-token paste while it was read, and each later turn read it again
        from the start, ~36 s on 2 cores); tool results stay (the calls wait for them)."""
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages.pop()
            self.console.print(f"[yellow]{STOPPED_EARLY}[/]")
        else:
            self.console.print(f"[yellow]{STOPPED_EARLY_RESULTS}[/]")

    def _read_results(self, calls) -> str | None:
        """Ask for each call's result and add it to the history as a tool message. Returns
        None when all were added, "exit" for /exit and the end of the input (Ctrl-D), "stop"
        when the tool loop ends otherwise (/reset, Ctrl-C). A result of several lines is fenced by FENCE,
        as a message is."""
        for call in calls:
            while True:  # a result that cannot be sent would fail every later turn
                try:
                    result = self._ask(f"[bold magenta]result of {call.name}>[/] ")
                except KeyboardInterrupt:
                    self.console.print("[dim]tool loop stopped[/]")
                    return "stop"
                except EOFError:  # Ctrl-D, or a piped script's end: the chat ends, as at you>
                    # (a new user's piped chat printed a dangling "you>" after this)
                    self.console.print("[dim]tool loop stopped (end of input)[/]")
                    return "exit"
                fenced = result.lstrip().startswith(FENCE)
                if fenced:
                    result = self._read_fenced(result.lstrip()[len(FENCE):])
                    if result is None:
                        return "exit"
                elif result.split(" ")[0] in COMMANDS:
                    done = self.command(result.strip())
                    if done == "exit":
                        return "exit"
                    if result.split(" ")[0] == "/reset":
                        return "stop"
                    continue
                if not result.strip():
                    self.console.print(f"[dim]type the result of {call.name} (e.g. its "
                                       "JSON), or /reset to drop this request[/]")
                    continue
                if self._text_ok(result, "result"):
                    break
            self._hint_json(result)
            self.messages.append({"role": "tool", "content": result, "tool_call_id": call.id})
        return None

    def _hint_json(self, result: str) -> None:
        """Once a session, a note when a tool result is not JSON: flint-nano was trained only
        on JSON results and answered "it is sunny and 25 degrees" with an invented
        {"sky": "rain"} (a new user's trial, 2026-12-06); the result is sent as typed."""
        if self.hinted_json:
            return
        try:
            jsonfile.loads(result)  # 3,000 '[' typed as a result ended the chat (RecursionError)
            return
        except ValueError:
            pass
        self.hinted_json = True
        example = '{"city": "Rome", "high": 25, "sky": "sun"}'
        self.console.print(Text("note: this result is not JSON; a model trained on JSON tool "
                                f"results (flint-nano: e.g. {example}) may misread plain text "
                                "and answer from a result it invents", style="dim"))

    def _text_ok(self, text: str, what: str) -> bool:
        """Whether typed text can be sent; if not (a byte that is not UTF-8, read as a lone
        surrogate), say where and ask for it again rather than keep it in the history."""
        try:
            text.encode("utf-8")
            return True
        except UnicodeEncodeError as e:
            self.console.print(Text(f"error: the {what} is {not_utf8(text, e)}; type it again",
                                    style="red"))
            return False

    def _show(self, stream):
        """Stream one answer (a live tail on a terminal), then print it once; returns the
        ChatMessage."""
        live = {"reasoning": "", "content": "", "calls": [], "prompt": None}
        stopped = False
        region = (Live(console=self.console, refresh_per_second=12, transient=True,
                       get_renderable=lambda: self._live_view(live))
                  if self.console.is_terminal else contextlib.nullcontext())
        engine = self.llm.engine
        # a long prompt's prefill shows its progress in the region on a terminal; piped, as
        # plain lines on stderr (terminal/progress.py, as `generate` does)
        piped = contextlib.nullcontext() if self.console.is_terminal else \
            prefill_bar(engine, True, terminal=False)
        if self.console.is_terminal:
            engine.prefill_progress = lambda req, done, total: live.update(prompt=(done, total))
        with region, piped:
            try:
                for d in stream:
                    live["reasoning"] += d.reasoning
                    live["content"] += d.content
                    live["calls"] += [getattr(c, "name", "") for c in d.tool_calls]
            except KeyboardInterrupt:
                stream.close()
                stopped = True
                if self.console.is_terminal:  # the rest of a paste is not sent line by line
                    drop_queued(sys.stdin)
            finally:
                engine.prefill_progress = None
        # The final split can differ from the streamed one (e.g. the model stopped without
        # closing </think>: that text becomes the answer), so print from the message.
        msg = stream.message
        self._print_message(msg)
        self.last_reasoning = msg.reasoning_content or ""
        out = msg.output
        for err in out.errors:
            self.console.print(Text(f"warning: {err}", style="yellow"))
        # the prompt's size on every turn, reuse or not, and the part KV reuse served (issue 22)
        footer = f"prompt {_count(len(out.prompt_token_ids), 'token')}"
        if out.cached_tokens:
            footer += f" ({out.cached_tokens} cached)"
        footer += f" · output {_count(len(out.token_ids), 'token')}"
        if out.ttft_ms is not None:
            footer += f" · TTFT {out.ttft_ms:.0f} ms"
        if out.ms_per_token:
            footer += f" · {1000 / out.ms_per_token:.1f} tokens/s"
        footer += " · stopped" if stopped else f" · {out.finish_reason}"
        room = self.llm.engine.context_limit - len(out.prompt_token_ids)
        if out.finish_reason == "length" and len(out.token_ids) >= room:
            footer += f" · {CONTEXT_FULL}"
        elif out.finish_reason == "length" and not msg.content and not msg.tool_calls:
            footer += (" · max tokens ran out while reasoning (raise --max-tokens; "
                       "--stop-on-repeat N ends reasoning that loops)")
        elif out.finish_reason == "repeat":
            footer += " · the answer looped (--stop-on-repeat)"
        self.console.print(f"[dim]{footer}[/]")
        from flint_graph.chat.tool_call_reader import CALL_OPEN
        from flint_graph.cli import DECLINED, DECLINED_HINT, call_as_text_hint

        if not self.tools and CALL_OPEN in (msg.content or ""):
            # as generate's note: without tools the call is markup in the answer (a new user's
            # trial, 2026-12-06: "Convert 120 km to mi." in a chat without --tools)
            self.console.print(Text(f"note: {call_as_text_hint(self.tools_path)}",
                                    style="dim"))
        elif not self.tools and not self.hinted_tools and \
                (msg.content or "").lstrip().startswith(DECLINED):
            # as generate's note (a new user's trial: the chat showed the bare refusal,
            # which lists the very skills that need --tools); once a chat
            self.hinted_tools = True
            self.console.print(Text(f"note: {DECLINED_HINT}", style="dim"))
        return msg

    def _live_view(self, live: dict[str, Any]) -> Text:
        # At most half the screen: a region taller than the screen scrolls, and the lines that
        # scrolled away can no longer be erased by the next redraw.
        width, height = self.console.size
        rows = max(1, height // 2)
        lines = [(line, "dim") for line in tail_lines(live["reasoning"], width, rows)] \
            if live["reasoning"] else []
        prompt = live.get("prompt")
        if prompt and prompt[0] < prompt[1] and not lines and not live["content"]:
            lines = [(line, "dim") for line in tail_lines(
                f"reading the prompt: {prompt[0]:,} of {prompt[1]:,} tokens", width, 1)]
        if live["content"]:
            lines += [(line, "") for line in tail_lines(live["content"], width, rows)]
        for name in list(live["calls"]):
            lines += [(line, "magenta") for line in tail_lines(f"tool call: {name}", width, 1)]
        view = Text(no_wrap=True, overflow="crop")
        for i, (line, style) in enumerate(lines[-rows:]):
            view.append("\n" if i else "")
            view.append(line, style)
        return view

    def _print_message(self, msg) -> None:
        """Print a finished message with its real text, once and append-only: soft wrap lets
        the terminal break the lines, so its own character widths are the only ones used."""
        c = self.console
        reasoning = msg.reasoning_content or ""
        if reasoning and self.show_reasoning:
            c.print(Text(printable(reasoning), style="dim"), soft_wrap=True)
        elif reasoning:
            c.print(Text(f"▸ reasoning ({len(reasoning)} chars, /reasoning shows it)",
                         style="dim italic"))
        if msg.content:
            c.print(Text(printable(msg.content)), soft_wrap=True)
        for call in msg.tool_calls:
            c.print(Panel(Text(printable(json.dumps(call.arguments, ensure_ascii=False,
                                                    indent=2))),
                          title=Text(f"tool call: {printable(call.name)}"),
                          border_style="magenta"))


# Ctrl-C before the answer's stream began (a long message being tokenized): the session goes on
STOPPED_EARLY = ("stopped (Ctrl-C) before the answer began; your message was taken back "
                 "(type it again to send it)")
STOPPED_EARLY_RESULTS = ("stopped (Ctrl-C) before the answer began; the tool results stay in the "
                         "history (/reset drops them)")
CONTEXT_FULL = ("the conversation fills the model's context: /reset starts a new one "
                "(/save FILE keeps this one first)")
RESULT_TOO_LONG = ("that result does not fit the model's context: type a shorter one, or /reset "
                   "to drop this request")
MESSAGE_TOO_LONG = ("that message alone does not fit the model's context (the conversation "
                    "holds nothing else): shorten it")
MESSAGE_AND_TOOLS_TOO_LONG = ("that message and the tool definitions do not fit the model's "
                              "context together: shorten the message, or use fewer or shorter "
                              "tools (--tools)")


def too_long_with(tools: bool, system: bool) -> str:
    """The hint for a first message that does not fit beside the tool definitions and/or the
    system prompt: a --system longer than the context was blamed on every message, even after
    /reset (a bad-input trial, 2026-12-06)."""
    if not system:
        return MESSAGE_AND_TOOLS_TOO_LONG
    return ("the system prompt (--system) is longer than that message, and together"
            + (" with the tool definitions" if tools else "") + " they do not fit the model's "
            "context: shorten the system prompt (start the chat again with a shorter --system)")


def read_line_capped(stream, most: int) -> str | None:
    """One line of the text `stream` without its line end, or None when it holds more than
    `most` characters (the rest of that line is then read in 1 MiB parts and dropped, so at
    most `most` + 1 MiB characters are held). Raises EOFError at the end of the input."""
    line = stream.readline(most + 1)
    if not line:
        raise EOFError
    if len(line) > most and not line.endswith("\n"):
        while True:
            part = stream.readline(1 << 20)
            if not part or part.endswith("\n"):
                return None
    return line.removesuffix("\n").removesuffix("\r")


def _read_bad_bytes_as_surrogates() -> None:
    """Let input() read a byte that is not UTF-8 as a lone surrogate (as `generate` reads its
    prompt), which `_text_ok` then reports with its position. A strict stdin decoder (e.g.
    LANG=en_US.UTF-8) raised UnicodeDecodeError instead, which ended the whole session."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stdin.reconfigure(errors="surrogateescape")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
