"""Every built-in trace ships with its notice: a row in ATTRIBUTION.md and in docs/data.md."""

from pathlib import Path

import pytest

from benchmarks.replay.datasets import BUILTIN_TRACES, DATA_DIR

DOCS = Path(__file__).resolve().parents[3] / "docs"


@pytest.mark.parametrize("name", sorted(BUILTIN_TRACES))
def test_builtin_trace_is_attributed(name):
    path, _format = BUILTIN_TRACES[name]
    assert (DATA_DIR / path).is_file()
    notice = (DATA_DIR / "ATTRIBUTION.md").read_text(encoding="utf-8")
    assert f"`{path}`" in notice, f"{path} has no row in benchmarks/data/ATTRIBUTION.md"
    assert f"`{name}`" in (DOCS / "data.md").read_text(encoding="utf-8"), \
        f"built-in trace {name} is not listed in docs/data.md"

