"""`child_environment`: variables set only while a child process is started."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def child_environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """``overrides`` in ``os.environ`` while a child process is spawned (it copies the
    environment); each variable is restored, or removed, afterwards."""
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
