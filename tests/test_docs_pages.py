"""The site reads as a product: guide pages fit in about four screens and carry no issue
numbers, raw result data stays in the repository (out of the built site), the README links to
the published site, and the replay demo is the command the docs show."""

from __future__ import annotations

import re
from pathlib import Path

import pathspec
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RESULTS_DIR = DOCS / "results"
CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))

SCREEN_CHARS = 5_000
"""Characters of markdown one screen of the rendered page holds (prose with a table or two)."""
MAX_SCREENS = 4.5
"""A guide page fits in about four screens."""
ISSUE_NUMBER = re.compile(r"\bissues? ?#?\d+", re.IGNORECASE)


def guide_pages(entries) -> list[str]:
    """The markdown pages of the nav outside Results and the generated API pages."""
    pages = []
    for entry in entries:
        items = entry.items() if isinstance(entry, dict) else [("", entry)]
        for title, value in items:
            if title in ("Results", "API"):
                continue
            if isinstance(value, list):
                pages += guide_pages(value)
            elif value.endswith(".md"):
                pages.append(value)
    return pages


GUIDES = guide_pages(CONFIG["nav"])


def test_the_nav_walk_finds_guides_and_leaves_out_results_and_api():
    assert {"index.md", "slo.md", "tutorials/serve_slo.md", "reference/http.md"} <= set(GUIDES)
    assert not [page for page in GUIDES if page.startswith(("results/", "api/"))]


@pytest.mark.parametrize("page", GUIDES)
def test_guide_page_fits_in_about_four_screens(page):
    chars = len((DOCS / page).read_text(encoding="utf-8"))
    assert chars <= MAX_SCREENS * SCREEN_CHARS, (
        f"docs/{page}: {chars / SCREEN_CHARS:.1f} screens ({chars:,} characters); split it or "
        f"move results to docs/results/")


def test_docs_outside_results_name_no_issue_numbers():
    pages = [path for path in sorted(DOCS.rglob("*.md")) if RESULTS_DIR not in path.parents]
    pages += sorted((ROOT / "notebooks").glob("*.py"))
    assert ISSUE_NUMBER.search("as issue 32 asked") and not ISSUE_NUMBER.search("no issues")
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
             for path in pages
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if ISSUE_NUMBER.search(line)]
    assert not found, "issue numbers belong to results pages or a changelog:\n" + "\n".join(found)


SITE_KINDS = {".md", ".png"}
"""What a results folder may put on the site: pages and the plots they show."""


def test_raw_result_data_is_excluded_from_the_site():
    excluded = pathspec.GitIgnoreSpec.from_lines(CONFIG["exclude_docs"].splitlines())
    assert excluded.match_file("results/x/summary.json")
    data = [path.relative_to(DOCS).as_posix() for path in RESULTS_DIR.rglob("*")
            if path.is_file() and path.suffix not in SITE_KINDS]
    assert data, "docs/results holds no raw data: the check reads nothing"
    shipped = [path for path in data if not excluded.match_file(path)]
    assert not shipped, f"mkdocs.yml exclude_docs lets raw data into the site: {shipped[:10]}"


def test_the_readme_links_the_published_site():
    site = CONFIG["site_url"]
    assert site.startswith("https://")
    assert site in (ROOT / "README.md").read_text(encoding="utf-8")


def _shell(text: str) -> str:
    return " ".join(text.replace("\\\n", " ").split())


def test_replay_demo_runs_the_command_the_replay_guide_shows():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^replay-demo:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "the Makefile has no replay-demo recipe"
    command = _shell(recipe.group(1)).replace("$(PY)", "python").replace("$(OUT)", "out")
    assert "pipeline:slo" in command
    guide = (DOCS / "replay.md").read_text(encoding="utf-8")
    assert "`make replay-demo` runs exactly this" in guide
    shown = [_shell(block) for block in re.findall(r"^```bash\n(.*?)^```$", guide,
                                                   re.MULTILINE | re.DOTALL)]
    assert command in shown, f"docs/replay.md does not show the replay-demo command {command!r}"


def test_the_replay_guide_defines_every_check_the_replay_prints():
    from benchmarks.replay.targets import RATIO, TTFT_SLACK, decode_protection_targets

    by_class = {"short": {"itl_jitter": 2.0, "ttft_p99_s": 1.0}, "long": {"ttft_p99_s": 2.0}}
    system = {"by_priority": {"-1": {"tpot_p99_s": 0.05}}, "by_class": by_class}
    printed = {entry["target"] for entry in decode_protection_targets(
        {"systems": {"fcfs": system, "pipeline:slo": system}})}
    assert printed, "the replay prints no checks: the test reads nothing"
    guide = " ".join((DOCS / "replay.md").read_text(encoding="utf-8").split())
    assert not [name for name in printed if f"`{name}`" not in guide], printed
    assert f"at most {RATIO:g} times `fcfs`" in guide
    assert f"at most {TTFT_SLACK:g} times `pipeline:default`" in guide
