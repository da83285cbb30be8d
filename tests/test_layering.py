"""The layers' import directions, read from the source (``ast``): what imports what.

policies <- integrations <- benchmarks; integrations never imports benchmarks;
inside integrations only `integrations.vllm_v1.vllm_surface.names` imports vLLM;
benchmarks never import vLLM (they use `integrations.vllm_v1.instruments`); every
package imports only packages at or below its place in `PACKAGE_ORDER` (docs/concepts.md),
and the packages that share a place never import each other; no import cycle anywhere
(module- or function-level; ``TYPE_CHECKING`` imports aside). Modules named by string count
as imports of whoever imports them: each `Pipeline` slot's hook is imported by the scheduler,
each config key's hook by the composition root. Test modules reach vLLM through the surface
too, but for the few listed in `TEST_VLLM_IMPORTS`.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

from integrations.vllm_v1.composition import KEY_HOOKS
from integrations.vllm_v1.pipeline import hooked_slots
from integrations.vllm_v1.scheduling.features import COMPOSITION_ROOT

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("policies", "integrations", "benchmarks")
SURFACE = "integrations.vllm_v1.vllm_surface.names"
V1 = "integrations.vllm_v1"
PACKAGE_ORDER: tuple[tuple[str, ...], ...] = (
    ("policies",),
    (f"{V1}.vllm_surface",),
    (f"{V1}.pipeline", f"{V1}.hooks", f"{V1}.rejection", f"{V1}.metrics"),
    ("integrations", V1),  # the package roots: re-exports (the rest lazily, by name)
    (f"{V1}.config",),
    (f"{V1}.cache", f"{V1}.speculative", f"{V1}.slo"),
    (f"{V1}.scheduling",),
    (f"{V1}.serving",),
    (f"{V1}.pd",),
    (f"{V1}.instruments", f"{V1}.plugin"),
    (f"{V1}.composition",),
    ("integrations.ray_serve",),
    ("benchmarks",),
)
"""Bottom to top: the pure policies; the one vLLM surface; the shared values and the hook
interface; the package roots; naming a pipeline; the feature packages (which plug into the scheduler as hooks,
named by import path); the scheduler; serving; PD deployment; test and replay instruments
and the vLLM plugin; the composition root (config keys -> hooks); Ray Serve; the benchmarks."""
RESOLVER = f"{V1}.scheduling.features"
"""The module that imports every slot's hook and the composition root by name."""


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
               and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


GRAPH = {_module(path): _imports(path) for package in PACKAGES
         for path in sorted((ROOT / package).rglob("*.py"))}


def _named_imports() -> dict[str, set[str]]:
    """The imports the registries make by name (``package.module:factory``): the scheduler
    imports each slot's hook (`Pipeline` field metadata), the composition root each config
    key's. The scheduler's one import of the composition root itself is the exception every
    composition root is (checked apart)."""
    return {RESOLVER: {path.split(":")[0] for _, path in hooked_slots()},
            COMPOSITION_ROOT: {path.split(":")[0] for _, path in KEY_HOOKS}}


NAMED = _named_imports()


def _offenders(package: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list:
    return sorted((module, target) for module, targets in GRAPH.items()
                  if module.split(".")[0] == package and module not in allowed
                  for target in targets if target.split(".")[0] in forbidden)


def _place(name: str) -> tuple[int, str] | None:
    """``(place in PACKAGE_ORDER, package)`` of a module or imported name (longest match)."""
    matches = [(len(unit), place, unit) for place, units in enumerate(PACKAGE_ORDER)
               for unit in units if name == unit or name.startswith(unit + ".")]
    return max(matches)[1:] if matches else None


def _order_offenders(named: dict[str, set[str]] = NAMED) -> list[tuple[str, str]]:
    found = []
    graph = {module: targets | named.get(module, set()) for module, targets in GRAPH.items()}
    for module, targets in graph.items():
        here = _place(module)
        for target in targets:
            there = _place(target)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:  # above it, or a sibling at the same place
                found.append((module, target))
    return sorted(found)


BOTTOM = ("policies.views", "policies.decisions", "policies.protocols", "policies.needs",
          "policies.validators")
"""The floor of ``policies``: the views, decisions, protocols and needs policies exchange with
the scheduler. They import only each other, never a policy."""


def _above_the_floor(module: str) -> list[str]:
    """What ``module`` imports from ``policies`` outside `BOTTOM`."""
    return sorted(target for target in GRAPH[module] if target.split(".")[0] == "policies"
                  and not any(target == b or target.startswith(b + ".") for b in BOTTOM))


def test_the_protocols_and_decisions_import_no_policy():
    assert {module: _above_the_floor(module) for module in BOTTOM} == {m: [] for m in BOTTOM}


def test_the_floor_check_sees_a_policy_import():
    GRAPH["policies.views"].add("policies.admission.controller.QueueDepthLimit")
    try:
        assert _above_the_floor("policies.views") == ["policies.admission.controller.QueueDepthLimit"]
    finally:
        GRAPH["policies.views"].discard("policies.admission.controller.QueueDepthLimit")


def test_every_module_has_a_place_in_the_package_order():
    assert [module for module in GRAPH if _place(module) is None] == []


def test_packages_import_only_packages_below_them():
    assert _order_offenders() == []


def test_every_name_a_registry_imports_is_a_module():
    assert [target for targets in NAMED.values() for target in targets
            if target not in GRAPH] == []


def test_the_order_check_sees_a_slot_hook_above_the_scheduler():
    planted = {RESOLVER: {f"{V1}.serving.rejection_channel", f"{V1}.cache.eviction"}}
    assert _order_offenders(planted) == [(RESOLVER, f"{V1}.serving.rejection_channel")]


def test_the_composition_root_sits_above_every_package_it_names():
    assert _place(COMPOSITION_ROOT)[0] > max(_place(target)[0]
                                             for target in NAMED[COMPOSITION_ROOT])
    assert _place(COMPOSITION_ROOT)[0] > _place(f"{V1}.serving")[0]
    assert _place(COMPOSITION_ROOT)[0] > _place(f"{V1}.instruments")[0]


def test_the_order_check_sees_an_upward_and_a_sibling_import():
    planted = {f"{V1}.cache._planted": {f"{V1}.scheduling.scheduler", f"{V1}.slo.step_timing",
                                        f"{V1}.hooks", "policies"}}
    GRAPH.update(planted)
    try:
        assert [edge for edge in _order_offenders() if edge[0] in planted] == [
            (f"{V1}.cache._planted", f"{V1}.scheduling.scheduler"),
            (f"{V1}.cache._planted", f"{V1}.slo.step_timing")]
    finally:
        for module in planted:
            del GRAPH[module]


@pytest.mark.parametrize(("package", "forbidden", "allowed"), [
    ("policies", ("vllm", "torch", "integrations", "benchmarks"), ()),
    ("integrations", ("benchmarks",), ()),
    ("integrations", ("vllm",), (SURFACE,)),
    ("benchmarks", ("vllm",), ()),
])
def test_imports_point_down_the_layers(package, forbidden, allowed):
    assert _offenders(package, forbidden, allowed) == []


TEST_VLLM_IMPORTS: dict[str, tuple[str, ...]] = {
    # the surface's own test reads the installed release
    "tests.test_vllm_surface": ("vllm",),
    # plays the worker: a connector's config and the KV transfer report the product never builds
    "tests.invariants.driver": ("vllm.config", "vllm.v1.outputs"),
    # vLLM's own CPU offloading manager and LRU policy, the control for ours
    "tests.vllm_v1.cache.test_offload_cache_policy": (
        "vllm.v1.kv_offload.base", "vllm.v1.kv_offload.cpu.manager",
        "vllm.v1.kv_offload.cpu.policies.factory", "vllm.v1.kv_offload.cpu.policies.lru"),
    # reads the engine's counters as a user of LLM.get_metrics() does
    "tests.vllm_v1.cache.test_engine_eviction": ("vllm.v1.metrics.reader",),
    # the plugin's entries in vLLM's own registries
    "tests.vllm_v1.test_plugin": ("vllm.distributed.kv_transfer.kv_connector.factory",
                                  "vllm.v1.kv_offload.cpu.policies.factory"),
    # stock vLLM's queue caps, the control for ours
    "tests.benchmarks.replay.test_queue_caps": ("vllm.exceptions", "vllm.v1.engine.async_llm"),
    # vLLM's own OpenAI app, built around our routes
    **{f"tests.vllm_v1.serving.{name}": ("vllm.entrypoints.launchers.app",
                                         "vllm.entrypoints.launchers.cli_args",
                                         "vllm.utils.argparse_utils")
       for name in ("test_routes", "test_route_tenants")},
}
"""The test modules that import vLLM directly, and what: the rest reach it through
`integrations.vllm_v1.vllm_surface.names`, so an upgrade that renames a name fails there."""
TEST_GRAPH = {_module(path): _imports(path) for path in sorted((ROOT / "tests").rglob("*.py"))}


def _direct_vllm_imports(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """The vLLM modules each test module imports beyond `TEST_VLLM_IMPORTS`."""
    found = {}
    for module, targets in graph.items():
        allowed = TEST_VLLM_IMPORTS.get(module, ())
        extra = sorted(target for target in targets if target.split(".")[0] == "vllm"
                       and not any(target == a or target.startswith(a + ".") for a in allowed))
        if extra:
            found[module] = extra
    return found


def test_tests_reach_vllm_through_the_surface():
    assert _direct_vllm_imports(TEST_GRAPH) == {}


def test_every_exception_is_still_imported():
    assert [(module, name) for module, names in TEST_VLLM_IMPORTS.items() for name in names
            if name not in TEST_GRAPH.get(module, set())] == []


def test_the_test_import_check_sees_a_direct_import():
    assert _direct_vllm_imports({"tests.planted": {"vllm.v1.request", "vllm.v1.request.Request"},
                                 "tests.invariants.driver": {"vllm.config"}}) == {
        "tests.planted": ["vllm.v1.request", "vllm.v1.request.Request"]}


def test_no_import_cycles():
    # a module importing its own package's re-exports (``from policies.speculative import
    # _kernels`` inside policies.speculative.automaton) is not a cycle worth breaking
    own = {module: {t for t in targets if t in GRAPH and t != module
                    and not module.startswith(t + ".")}
           for module, targets in GRAPH.items()}
    try:
        tuple(graphlib.TopologicalSorter(own).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle: {' -> '.join(error.args[1])}")


def test_the_layering_check_sees_a_violation(tmp_path, monkeypatch):
    """The checks read real edges: one planted forbidden import is found."""
    GRAPH["policies._planted"] = {"vllm.v1.request"}
    try:
        assert _offenders("policies", ("vllm",)) == [("policies._planted", "vllm.v1.request")]
    finally:
        del GRAPH["policies._planted"]


def test_importing_policies_loads_no_vllm_or_torch():
    code = ("import sys, policies\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in {'vllm', 'torch'})))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == ""
