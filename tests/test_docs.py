"""The docs site's code runs: tested examples execute, API pages name importable modules.

A fenced ``python`` block in ``docs/`` is executed when the line before it (blank lines
aside) is the marker ``<!-- test: run -->`` (invisible on the site). Each block runs in a
fresh module of its own, so classes it defines can be pickled (pipelines are), and must hold
at least one ``assert`` of its own. A block after ``<!-- test: same-as PATH -->`` must appear
verbatim in the repository file PATH (a copy shown on the site). The pages also list every
`Pipeline` slot and preset, and the commands they show name real pipelines.
"""

import ast
import re
import sys
import types
from pathlib import Path

import attrs
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARKER = "<!-- test: run -->"
SAME_AS = re.compile(r"^<!-- test: same-as (\S+) -->$")
FENCE = re.compile(r"^```python\s*$")
HEADING = re.compile(r"^#{1,6}\s+(.*)$")
API_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)\s*$", re.MULTILINE)


@attrs.frozen
class CodeBlock:
    path: Path
    line: int  # 1-based line of the first line of code (after the fence)
    code: str
    tested: bool
    heading: str  # the nearest heading above the block
    marker: str = ""  # the line before the fence, blank lines aside

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_blocks(path: Path) -> list[CodeBlock]:
    """Every fenced python block of a markdown file, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, heading, previous, index = [], "", "", 0
    while index < len(lines):
        text = lines[index]
        if match := HEADING.match(text):
            heading = match.group(1)
        if FENCE.match(text):
            end = index + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            if end == len(lines):
                raise AssertionError(f"{path}:{index + 1}: unclosed code fence")
            blocks.append(CodeBlock(path, index + 2, "\n".join(lines[index + 1:end]) + "\n",
                                    previous.strip() == MARKER, heading, previous.strip()))
            index = end
        if text.strip():
            previous = text
        index += 1
    return blocks


def marked_blocks() -> list[CodeBlock]:
    return [block for path in sorted(DOCS.rglob("*.md")) for block in python_blocks(path)
            if block.tested]


def run_block(block: CodeBlock) -> types.ModuleType:
    """Execute the block as the body of a new module; tracebacks show docs line numbers."""
    tree = ast.parse(block.code)
    assert any(isinstance(node, ast.Assert) for node in ast.walk(tree)), (
        f"{block.where}: a tested example must check its own result with assert")
    name = f"docs_example_{abs(hash(block.where))}"
    module = types.ModuleType(name)
    module.__file__ = str(block.path)
    sys.modules[name] = module
    try:
        source = "\n" * (block.line - 1) + block.code
        exec(compile(source, str(block.path), "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


def test_the_quickstart_is_a_tested_example():
    index = python_blocks(DOCS / "index.md")
    quickstart = [block for block in index if "quickstart" in block.heading.lower()]
    assert quickstart, "docs/index.md needs a python block under a 'Quickstart' heading"
    assert quickstart[0].tested, f"{quickstart[0].where}: mark the quickstart with {MARKER}"
    assert quickstart[0] in marked_blocks()


@pytest.mark.parametrize("block", marked_blocks(), ids=lambda block: block.where)
def test_tested_example_runs(block):
    run_block(block)


def api_modules() -> list[tuple[str, str]]:
    return [(page.name, module) for page in sorted((DOCS / "api").glob("*.md"))
            for module in API_DIRECTIVE.findall(page.read_text(encoding="utf-8"))]


def test_api_pages_document_every_public_policies_module():
    documented = {module for _, module in api_modules()}
    public = {f"policies.{path.stem}" for path in (ROOT / "policies").iterdir()
              if not path.name.startswith("_") and (path.suffix == ".py" or path.is_dir())}
    missing = {m for m in public if not any(d == m or d.startswith(m + ".") for d in documented)}
    assert not missing, f"no API page documents {sorted(missing)}"


def nav_files(entries) -> list[str]:
    files = []
    for entry in entries:
        if isinstance(entry, str):
            files.append(entry)
        elif isinstance(entry, dict):
            for value in entry.values():
                files += nav_files(value) if isinstance(value, list) else [value]
    return files


def test_every_nav_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    missing = [name for name in nav_files(config["nav"]) if not (DOCS / name).is_file()]
    assert not missing, f"mkdocs.yml nav names files missing from docs/: {missing}"


def copied_blocks() -> list[tuple[CodeBlock, str]]:
    return [(block, match.group(1)) for path in sorted(DOCS.rglob("*.md"))
            for block in python_blocks(path) if (match := SAME_AS.match(block.marker))]


def test_there_are_copied_blocks():
    assert copied_blocks(), "no python block is marked <!-- test: same-as PATH --> in docs/"


@pytest.mark.parametrize(("block", "source"), copied_blocks(),
                         ids=lambda value: getattr(value, "where", value))
def test_copied_block_matches_its_source(block, source):
    text = (ROOT / source).read_text(encoding="utf-8")
    assert block.code in text, f"{block.where}: the block is no longer a verbatim part of {source}"


def pipeline_slots() -> list[attrs.Attribute]:
    """`Pipeline`'s slots: its fields less the declarations (what it serves, not a policy)."""
    from integrations.vllm_v1.pipeline import DECLARATIONS, Pipeline

    return [field for field in attrs.fields(Pipeline) if field.name not in DECLARATIONS]


def test_concepts_lists_every_pipeline_slot():
    rows = [line for line in (DOCS / "concepts.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    for field in pipeline_slots():
        assert any(line.startswith(f"| `{field.name}` (default") for line in rows), (
            f"docs/concepts.md: the protocol table has no row for Pipeline.{field.name}")


def test_serving_lists_every_preset():
    from integrations.vllm_v1.config.presets import PRESETS

    text = (DOCS / "serving.md").read_text(encoding="utf-8")
    missing = [name for name in PRESETS if f"| `{name}` |" not in text]
    assert not missing, f"docs/serving.md: the presets table lacks {missing}"


def test_scheduling_example_fills_every_slot():
    blocks = [block for block in marked_blocks() if block.path.name == "scheduling.md"]
    assert blocks, "docs/scheduling.md needs a tested example"
    assert any(all(f"{field.name}=" in block.code for field in pipeline_slots())
               for block in blocks), "docs/scheduling.md: no tested example fills every slot"


SHELL_FENCE = re.compile(r"^```(?:bash|console)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PIPELINE_SPEC = re.compile(r"(?:--pipeline\s+|pipeline:)([\w./-]+(?::\w+)?)")


def shown_pipeline_specs() -> list[tuple[str, str]]:
    """``(page, spec)`` for every pipeline a shell block in docs/ names."""
    return [(str(path.relative_to(ROOT)), spec)
            for path in sorted(DOCS.rglob("*.md"))
            for shell in SHELL_FENCE.findall(path.read_text(encoding="utf-8"))
            for spec in PIPELINE_SPEC.findall(shell.replace("\\\n", " "))]


def test_shell_blocks_name_pipelines():
    assert any(spec == "default" for _, spec in shown_pipeline_specs())


@pytest.mark.parametrize(("page", "spec"), shown_pipeline_specs(), ids=lambda value: value)
def test_shown_pipeline_exists(page, spec):
    from integrations.vllm_v1.config.presets import PRESETS

    if ":" not in spec:
        assert spec in PRESETS, f"{page}: {spec!r} is not a preset"
    elif not spec.rsplit(":", 1)[0].endswith(".py"):  # package.module:attr
        from integrations.vllm_v1 import Pipeline
        from integrations.vllm_v1.config.spec import resolve_pipeline

        assert isinstance(resolve_pipeline(spec), Pipeline), f"{page}: {spec!r}"
    else:
        location, attr = spec.rsplit(":", 1)
        tree = ast.parse((ROOT / location).read_text(encoding="utf-8"))
        names = {target.id for node in tree.body if isinstance(node, ast.Assign)
                 for target in node.targets if isinstance(target, ast.Name)}
        assert attr in names, f"{page}: {location} assigns no {attr}"
