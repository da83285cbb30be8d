"""Hooks use only what `SchedulerAccess` names: read from every hook module's source
(``ast``), and `PolicyScheduler` provides all of it."""

import ast
import inspect
from pathlib import Path

import pytest

from integrations.vllm_v1 import Pipeline
from integrations.vllm_v1.hooks import SchedulerAccess
from integrations.vllm_v1.instruments import SchedulerHarness

ROOT = Path(__file__).resolve().parents[3]
ALLOWED = set(SchedulerAccess.__annotations__) | {
    name for name, value in vars(SchedulerAccess).items() if callable(value)
    and not name.startswith("_")}


def _is_scheduler(node: ast.expr) -> bool:
    """``scheduler``, ``self.scheduler`` or ``self._scheduler``."""
    if isinstance(node, ast.Name):
        return node.id == "scheduler"
    return (isinstance(node, ast.Attribute) and node.attr in ("scheduler", "_scheduler")
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _defines_a_hook(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.ClassDef) and any(
        isinstance(base, ast.Name) and base.id == "SchedulerHook" for base in node.bases)
        for node in tree.body)


def hook_modules() -> list[tuple[str, ast.Module]]:
    trees = ((str(path.relative_to(ROOT)), ast.parse(path.read_text()))
             for path in sorted((ROOT / "integrations").rglob("*.py")))
    return [(name, tree) for name, tree in trees if _defines_a_hook(tree)]


def scheduler_members(tree: ast.Module) -> set[str]:
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _is_scheduler(node.value)}


def test_the_hook_modules_are_found():
    names = {name for name, _ in hook_modules()}
    assert {"integrations/vllm_v1/cache/eviction.py", "integrations/vllm_v1/cache/warming.py",
            "integrations/vllm_v1/scheduling/start_gate.py",
            "integrations/vllm_v1/speculative/budget.py"} <= names


@pytest.mark.parametrize(("name", "tree"), [pytest.param(*module, id=module[0])
                                             for module in hook_modules()])
def test_a_hook_uses_only_what_scheduler_access_names(name, tree):
    assert scheduler_members(tree) - ALLOWED == set(), name


def test_the_check_sees_a_private_member():
    tree = ast.parse("class H(SchedulerHook):\n    def f(self):\n"
                     "        return self.scheduler._tracked, self.scheduler.running\n")
    assert scheduler_members(tree) - ALLOWED == {"_tracked"}


def test_the_policy_scheduler_provides_every_member():
    scheduler = SchedulerHarness.build(Pipeline()).scheduler
    assert isinstance(scheduler, SchedulerAccess)
    assert [name for name in sorted(ALLOWED) if not hasattr(scheduler, name)] == []


def test_scheduler_access_names_a_type_for_every_member():
    """No ``Any``: each member and parameter is annotated with the vLLM or project type."""
    annotations = dict(SchedulerAccess.__annotations__)
    for name, value in vars(SchedulerAccess).items():
        if callable(value) and not name.startswith("_"):
            annotations.update({f"{name}.{p}": str(a) for p, a in
                                inspect.signature(value).parameters.items() if p != "self"})
    assert [name for name, annotation in annotations.items() if "Any" in str(annotation)] == []
