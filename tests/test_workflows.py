"""The GitHub workflows run the Makefile's own targets, and only targets the Makefile has.

``ci.yml`` runs what ``.ci/run`` runs (``make test``); ``docs.yml`` executes the notebooks
with the target ``make test`` uses and builds the site with ``docs-build`` before deploying
it. A workflow step naming a target the Makefile lacks fails here, not on GitHub; so does a
``make`` command in the README, CONTRIBUTING.md or the docs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
RULE = re.compile(r"^([A-Za-z0-9_.$()/ -]+?)\s*::?(?!=)", re.MULTILINE)
SEPARATORS = {"&&", "||", ";", "|"}
SHELL_BLOCK = re.compile(r"^```(?:bash|console|sh)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
INLINE_MAKE = re.compile(r"`(make [^`]+)`")


def makefile_targets(text: str) -> set[str]:
    """Every target a rule of the Makefile ``text`` defines (variables' own rules aside)."""
    return {target for match in RULE.finditer(text) for target in match.group(1).split()
            if "$" not in target and not target.startswith(".")}


def _words(line: str) -> list[str]:
    """A shell line's words, comments dropped (split on blanks where its quotes do not close:
    a line of a longer quoted argument)."""
    line = line.replace(";", " ; ")
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return line.partition(" #")[0].split()


def make_targets(command: str) -> list[str]:
    """The targets each ``make`` of a shell ``command`` names (``make`` alone: ``all``)."""
    words = [word for line in command.replace("\\\n", " ").splitlines()
             if re.search(r"\bmake\b", line) for word in [*_words(line), ";"]]
    targets: list[str] = []
    for index, word in enumerate(words):
        if word != "make":
            continue
        named = []
        for arg in words[index + 1:]:
            if arg in SEPARATORS:
                break
            if not arg.startswith("-") and "=" not in arg:
                named.append(arg)
        targets += named or ["all"]
    return targets


def workflow_commands(path: Path) -> list[str]:
    """The ``run`` commands of every step of every job of a workflow file."""
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [step["run"] for job in workflow["jobs"].values()
            for step in job.get("steps", ()) if "run" in step]


def workflow_targets(path: Path) -> list[str]:
    return [target for command in workflow_commands(path) for target in make_targets(command)]


def documented_targets(text: str) -> list[str]:
    """The targets of every ``make`` in a markdown page's shell blocks and inline code."""
    commands = SHELL_BLOCK.findall(text) + INLINE_MAKE.findall(text)
    return [target for command in commands for target in make_targets(command)]


TARGETS = makefile_targets((ROOT / "Makefile").read_text(encoding="utf-8"))
WORKFLOW_FILES = sorted(WORKFLOWS.glob("*.yml"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_parsers_read_the_makefile_and_commands():
    assert {"test", "notebooks", "docs-build", "demo", "replay-demo", "lint"} <= TARGETS
    assert not any(target.startswith("$") for target in TARGETS)
    assert make_targets("make test PYTHON=python3.11") == ["test"]
    assert make_targets("make -j2 notebooks docs-build && make lint") == [
        "notebooks", "docs-build", "lint"]
    assert make_targets("cd x; make") == ["all"]
    assert make_targets("echo make-believe  # make nothing") == []
    assert make_targets("#!/bin/sh\n# make lint\nmake \\\n  test\nmake demo") == ["test", "demo"]


def test_a_target_the_makefile_lacks_is_caught(tmp_path):
    workflow = tmp_path / "bad.yml"
    workflow.write_text("on: push\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n"
                        "      - run: make test\n      - run: make docs-biuld\n")
    assert [t for t in workflow_targets(workflow) if t not in TARGETS] == ["docs-biuld"]


def test_there_are_workflows():
    assert {path.name for path in WORKFLOW_FILES} >= {"ci.yml", "docs.yml"}


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda path: path.name)
def test_workflow_names_only_makefile_targets(path):
    targets = workflow_targets(path)
    assert targets, f"{path.name} runs no make target"
    missing = [target for target in targets if target not in TARGETS]
    assert not missing, f"{path.name} runs make targets the Makefile lacks: {missing}"


def test_ci_runs_what_ci_run_runs():
    ci = workflow_targets(WORKFLOWS / "ci.yml")
    assert ci == make_targets((ROOT / ".ci" / "run").read_text(encoding="utf-8")) == ["test"]


def test_docs_executes_notebooks_as_make_test_does_then_builds_strict():
    docs = workflow_targets(WORKFLOWS / "docs.yml")
    assert docs == ["notebooks", "docs-build"], docs
    test_rule = re.search(r"^test:(.*)$", (ROOT / "Makefile").read_text(encoding="utf-8"),
                          re.MULTILINE)
    assert test_rule and {"notebooks", "docs-build"} <= set(test_rule.group(1).split())
    build = re.search(r"^docs-build:.*\n((?:\t.*\n)+)",
                      (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE)
    assert build and "mkdocs build --strict" in build.group(1)


def test_docs_deploys_the_built_site_from_main_only():
    workflow = yaml.safe_load((WORKFLOWS / "docs.yml").read_text(encoding="utf-8"))
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    upload = [s for s in build["steps"] if s.get("uses", "").startswith(
        "actions/upload-pages-artifact@")]
    assert upload and upload[0]["with"]["path"] == "site"  # make docs-build's --site-dir
    assert "--site-dir site" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert deploy["needs"] == "build"
    assert "refs/heads/main" in deploy["if"] and "push" in deploy["if"]
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in deploy["steps"])
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}


def test_documented_make_commands_are_makefile_targets():
    assert documented_targets("Run `make demo`, then:\n```bash\nmake test  # all\n```\n") == [
        "test", "demo"]
    found = {page.relative_to(ROOT).as_posix(): documented_targets(page.read_text(
        encoding="utf-8")) for page in PAGES}
    assert {"serve-slo", "demo", "test", "replay-demo"} <= set(found["README.md"])
    missing = {page: sorted(set(targets) - TARGETS) for page, targets in found.items()
               if set(targets) - TARGETS}
    assert not missing, f"make targets the Makefile lacks: {missing}"
