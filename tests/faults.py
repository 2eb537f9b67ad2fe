"""Fault injection for tests: a callable that raises on one chosen call."""


def failing_on_call(fn, n: int, exc: BaseException):
    """`fn` wrapped to raise `exc` on its n-th call (1-based) and pass every other call
    through; `.calls` counts the calls so far."""
    def wrapped(*args, **kwargs):
        wrapped.calls += 1
        if wrapped.calls == n:
            raise exc
        return fn(*args, **kwargs)

    wrapped.calls = 0
    return wrapped
