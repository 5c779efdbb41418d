"""The indexer's measurement knobs: environment variables that replace a shipped constant so
that a benchmark can time another value in its own process (benchmarks/device_run.sh). Unset,
each returns the shipped value; a malformed value is an error naming the variable."""

import os


def int_knob(name: str, default: int) -> int:
    """The integer in ``$name``, or ``default`` when unset."""
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {os.environ[name]!r}") from None


def tile_knob(name: str, default):
    """The tile in ``$name`` (its fields' integers, comma-separated, in the order of
    ``type(default)``, a NamedTuple), or ``default`` when unset."""
    text = os.environ.get(name)
    if not text:
        return default
    cls = type(default)
    try:
        return cls(*(int(x) for x in text.split(",")))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected '{','.join(f.upper() for f in cls._fields)}' "
                         f"({len(cls._fields)} integers), got {text!r}") from None
