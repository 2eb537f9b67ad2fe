"""Typed errors for bad user input: every message names the file, tensor, field or argument.

The CLI catches `FlintError`, prints its message on one line and exits non-zero; the Python API
lets it propagate. `ValueError` subclasses keep `except ValueError` working for callers that
validate arguments generically.
"""


MAX_MESSAGE = 1000  # characters of a message kept whole; longer ones are cut in the middle


def found(value: object, limit: int = 40) -> str:
    """"found ..." in an error message: the value's JSON kind and the value ("found string
    "x"", "found array [1, 2]"), the kind alone where it says it all (null)."""
    return "null" if value is None else f"{kind(value)} {shown(value, limit)}"


def shown(value: object, limit: int = 60) -> str:
    """`value` for an error message, at most `limit` characters: JSON where it is JSON (true,
    null, "text", [1, 2]: what an HTTP client sent, and readable from Python too), else repr.
    An integer too long for Python to print (over 4,300 digits) is described by its size."""
    import json

    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # not JSON (a tuple inside is fine; an object is not)
        try:
            text = repr(value)
        except ValueError:
            return (f"an integer of {value.bit_length():,} bits" if isinstance(value, int)
                    else f"a {type(value).__name__} that cannot be shown")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def terminal_safe(text: str) -> str:
    """`text` with control characters other than newline and tab written as escapes (\\x1b,
    \\x9b), and format characters too (\\u202e, \\u200b: bidirectional overrides and
    zero-width marks reorder or hide what is shown, a re-trial of 2026-12-07): an error
    message or a saved file's name must not move the cursor, recolour, retitle or rearrange
    the terminal it is printed on."""
    import unicodedata

    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf")
                   else ascii(ch)[1:-1] for ch in text)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """"1 case", "2 cases", "1,000 cases": a count and its noun in the right number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


_JSON_KINDS = {type(None): "null", bool: "boolean", int: "integer", float: "number",
               str: "string", list: "array", tuple: "array", dict: "object"}


def kind(value: object) -> str:
    """The JSON kind of `value` for an error message ("null", "boolean", "integer", "number",
    "string", "array", "object"), or its Python type's name when it has none."""
    return _JSON_KINDS.get(type(value), type(value).__name__)


def not_utf8(text: str, error: UnicodeEncodeError) -> str:
    """Why `text` has no UTF-8 form, for an error message: the lone surrogate at the position
    `error` names; one of U+DC80–U+DCFF is also how Python reads an undecodable input byte
    (surrogateescape), so that byte is named too."""
    cp = ord(text[error.start])
    byte = f" (an undecodable input byte 0x{cp - 0xDC00:02X} reads as one)" \
        if 0xDC80 <= cp <= 0xDCFF else ""
    return f"not valid UTF-8 text: a lone surrogate U+{cp:04X} at character {error.start}{byte}"


class FlintError(Exception):
    """Base class of every error flint_graph raises for bad input or an unusable checkpoint.

    Messages quote untrusted text (a config's architecture name, a token, a key): one longer
    than MAX_MESSAGE characters keeps its head and tail with the cut counted, so a 100 KB
    name or a 100 MB token never floods a terminal or a log (issue 26)."""

    def __init__(self, *args):
        if len(args) == 1 and isinstance(args[0], str) and len(args[0]) > MAX_MESSAGE:
            m = args[0]
            cut = len(m) - (MAX_MESSAGE - 200) - 200
            args = (f"{m[:MAX_MESSAGE - 200]} … [{cut:,} characters cut] … {m[-200:]}",)
        super().__init__(*args)


class ConfigError(FlintError, ValueError):
    """A config.json / GGUF metadata field is missing, malformed or inconsistent."""


class CheckpointError(FlintError):
    """A checkpoint file is missing, truncated, corrupt or does not match its config."""


class TemplateError(FlintError):
    """The checkpoint's chat template failed to render."""


class InvalidRequestError(FlintError, ValueError):
    """A request argument (prompt, sampling value, tools) is invalid. `field` (the API field,
    e.g. "top_p") and `detail` ("expected …, found …") are set where one field is at fault, so
    a caller can name its own flag or field for it instead."""

    def __init__(self, message: str = "", *, field: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.field, self.detail = field, detail


class ContextLengthError(InvalidRequestError):
    """A prompt (plus max_tokens) does not fit the model's context limit."""
