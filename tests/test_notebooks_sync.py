"""Each tutorial notebook matches its paired jupytext source, cell for cell.

The ``notebooks/NN_topic.py`` files (jupytext "percent" format, linted by ruff) are
the tutorials' source; ``notebooks/jupytext.toml`` pairs each with its ``.ipynb``,
which keeps the executed outputs the docs site shows. After editing either side,
``jupytext --sync notebooks/NN_topic.py`` brings the other along (outputs are kept).
"""

from __future__ import annotations

import difflib
import json
import tomllib
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
IPYNBS = sorted(NOTEBOOKS.glob("*.ipynb"))

Cell = tuple[str, str, tuple[str, ...]]


def cells(path: Path) -> list[Cell]:
    """(cell type, source, tags) of every cell of a notebook or of its percent source."""
    fmt = "py:percent" if path.suffix == ".py" else None
    notebook = jupytext.read(path, fmt=fmt)
    return [(cell.cell_type, cell.source, tuple(cell.metadata.get("tags", ())))
            for cell in notebook.cells]


def first_difference(ipynb: Path, py: Path) -> str | None:
    """None when the pair is in sync, else where it first differs, for a failure message."""
    left, right = cells(ipynb), cells(py)
    hint = f"after editing either side, run `jupytext --sync notebooks/{py.name}`"
    for index, (a, b) in enumerate(zip(left, right, strict=False)):  # lengths: below
        if a == b:
            continue
        fields = [name for name, x, y in zip(("type", "source", "tags"), a, b, strict=True)
                  if x != y]
        if a[1] != b[1]:
            diff = difflib.unified_diff(a[1].splitlines(), b[1].splitlines(), ipynb.name,
                                        py.name, n=0, lineterm="")
            detail = "\n" + "\n".join(list(diff)[:12])
        elif a[2] != b[2]:
            detail = f"\ntags {list(a[2])} in {ipynb.name}, {list(b[2])} in {py.name}"
        else:
            detail = f"\n{a[0]} in {ipynb.name}, {b[0]} in {py.name}"
        return (f"{ipynb.name} and {py.name} differ at cell {index} "
                f"({', '.join(fields)}; {hint}):{detail}")
    if len(left) != len(right):
        return (f"{ipynb.name} has {len(left)} cells, {py.name} {len(right)}: the first "
                f"{min(len(left), len(right))} agree ({hint})")
    return None


def test_every_notebook_has_a_paired_source():
    assert IPYNBS, f"no notebooks under {NOTEBOOKS}"
    sources = {path.stem for path in NOTEBOOKS.glob("[0-9]*.py")}
    assert sources == {path.stem for path in IPYNBS}
    config = tomllib.loads((NOTEBOOKS / "jupytext.toml").read_text())
    assert config["formats"] == "ipynb,py:percent"


@pytest.mark.parametrize("ipynb", IPYNBS, ids=[path.stem for path in IPYNBS])
def test_notebook_matches_its_source(ipynb: Path):
    difference = first_difference(ipynb, ipynb.with_suffix(".py"))
    assert difference is None, difference


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the first notebook pair (with at least one tagged cell) in tmp_path."""
    for ipynb in IPYNBS:
        if any(tags for _, _, tags in cells(ipynb)):
            break
    else:
        pytest.skip("no notebook has a tagged cell")
    for path in (ipynb, ipynb.with_suffix(".py")):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path / ipynb.name, tmp_path / ipynb.with_suffix(".py").name


def test_an_edit_to_the_source_alone_is_caught(pair: tuple[Path, Path]):
    ipynb, py = pair
    assert first_difference(ipynb, py) is None
    lines = py.read_text().splitlines(keepends=True)
    marker = next(i for i, line in enumerate(lines)
                  if line.startswith("# %%") and "[markdown]" not in line)
    lines.insert(marker + 1, "edited = True\n")
    py.write_text("".join(lines))
    first_code = next(i for i, (kind, _, _) in enumerate(cells(ipynb)) if kind == "code")
    difference = first_difference(ipynb, py)
    assert difference is not None
    assert f"{ipynb.name} and {py.name} differ at cell {first_code} (source" in difference
    assert "+edited = True" in difference


def test_an_edit_to_the_notebook_alone_is_caught(pair: tuple[Path, Path]):
    ipynb, py = pair
    notebook = json.loads(ipynb.read_text())
    notebook["cells"][0]["source"] = ["# A new title"]
    ipynb.write_text(json.dumps(notebook))
    difference = first_difference(ipynb, py)
    assert difference is not None and "differ at cell 0 (source" in difference


def test_a_tag_on_one_side_only_is_caught(pair: tuple[Path, Path]):
    ipynb, py = pair
    tagged = next(i for i, (_, _, tags) in enumerate(cells(ipynb)) if tags)
    notebook = json.loads(ipynb.read_text())
    del notebook["cells"][tagged]["metadata"]["tags"]
    ipynb.write_text(json.dumps(notebook))
    difference = first_difference(ipynb, py)
    assert difference is not None and f"differ at cell {tagged} (tags" in difference


def test_a_cell_added_at_the_end_is_caught(pair: tuple[Path, Path]):
    ipynb, py = pair
    py.write_text(py.read_text() + "\n# %%\nprint('one more')\n")
    difference = first_difference(ipynb, py)
    assert difference is not None and "cells" in difference
