"""Telling a verdict from a bug: once a model is prepared, an exception from inside a kernel is a bug, and so
is any refusal that wraps one. Used by the fuzz child process and by the op tests' "both rejected" cases."""

from __future__ import annotations

BUGS = (IndexError, KeyError, TypeError, AttributeError, MemoryError, AssertionError, ZeroDivisionError)


def wrapped_bug(e: BaseException) -> BaseException | None:
    """The internal error behind a refusal (along its cause/context chain), or None for a verdict. The model
    reader's own "corrupt or truncated flatbuffer" verdict on bytes its accessors cannot walk is a verdict,
    whatever it wraps."""
    if "corrupt or truncated flatbuffer" in str(e):
        return None
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, BUGS):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None
