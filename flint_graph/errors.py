"""Typed errors for bad user input: every message names the file, tensor, field or argument.

The CLI catches `FlintError`, prints its message on one line and exits non-zero; the Python API
lets it propagate. `ValueError` subclasses keep `except ValueError` working for callers that
validate arguments generically.
"""


class FlintError(Exception):
    """Base class of every error flint_graph raises for bad input or an unusable checkpoint."""


class ConfigError(FlintError, ValueError):
    """A config.json / GGUF metadata field is missing, malformed or inconsistent."""


class CheckpointError(FlintError):
    """A checkpoint file is missing, truncated, corrupt or does not match its config."""


class TemplateError(FlintError):
    """The checkpoint's chat template failed to render."""


class InvalidRequestError(FlintError, ValueError):
    """A request argument (prompt, sampling value, tools) is invalid."""


class ContextLengthError(InvalidRequestError):
    """A prompt (plus max_tokens) does not fit the model's context limit."""
