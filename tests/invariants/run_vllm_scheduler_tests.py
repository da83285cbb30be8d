"""Run vLLM's own scheduler unit tests against stock vLLM and against `PolicyScheduler`.

vLLM's wheels ship no tests and GitHub is not reachable from CI, so the tests are read
from a vLLM git checkout into a scratch directory (``.cache/vllm-tests/<commit>``,
git-ignored; vLLM's code is never committed here), then run once per scheduler under test
by pytest with `vllm_suite_plugin` (which swaps the scheduler class in that test process
only). The result is a table of the tests that pass on stock vLLM and fail on ours, why,
and the stock failures (tests that cannot run here, or that expect another vLLM).

    python -m tests.invariants.run_vllm_scheduler_tests \\
        --extract-from ~/src/vllm/.git --commit f80b66f548d855a104c9b2a0527e6c0b1a31750c
    python -m tests.invariants.run_vllm_scheduler_tests --under-test stock identity default
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINNED_COMMIT = "f80b66f548d855a104c9b2a0527e6c0b1a31750c"
"""vLLM main of 2026-08-13 (PR #50062): the newest upstream tests found for 0.32 (see
docs/invariants.md; v0.32.0's own tag was not reachable)."""
TEST_FILES = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_async_scheduler.py",
    "tests/v1/core/test_priority_scheduler_random.py",
    "tests/v1/core/test_priority_preemption_bug.py",
    "tests/v1/core/test_deferred_block_free.py",
    "tests/v1/core/test_swa_inflight_window_free.py",
    "tests/v1/core/test_worker_slot_overflow.py",
)
"""vLLM's test files that build a `Scheduler` or `AsyncScheduler` (``create_scheduler``)."""
SUPPORT_FILES = (
    "tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/__init__.py",
    "tests/v1/core/utils.py", "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py", "tests/v1/kv_connector/unit/utils.py",
)
"""What those files import from vLLM's ``tests`` package (not its heavy conftest)."""

REFUSED = "--scheduling-policy priority cannot be combined"
"""The start-up refusal of vLLM's ``priority`` policy with a pipeline that orders requests."""
KV_PRESSURE_TESTS = (
    "test_async_scheduler::test_kv_pressure_preemption_with_inflight_output",
    "test_async_scheduler::test_reset_prefix_cache_with_inflight_output_under_kv_pressure",
    "test_async_scheduler::test_kv_pressure_preempt_mid_handoff",
    "test_deferred_block_free::test_cow_retentions_deferred_until_copy_step_processed",
)
"""vLLM tests that add requests to a nearly full KV pool and expect them to start."""
FULL_POOL_START_TESTS = KV_PRESSURE_TESTS + (
    "test_scheduler::test_kv_connector_handles_preemption",
    "test_scheduler::test_preempt_during_execution",
    "test_scheduler::test_priority_scheduling_preemption",
)
"""...and those that fill more than half the pool with running requests to force preemption."""
DESIGN_DIFFERENCES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("test_scheduler::test_scheduler_reset_prefix_cache",), "any",
     "indexes `scheduler.waiting[i]`: vLLM's FCFS queue is a deque, `PolicyRequestQueue` "
     "(like vLLM's own `PriorityRequestQueue`) is not subscriptable; the FIFO re-queue order "
     "it checks is asserted by iteration in tests/invariants/test_lifecycle.py"),
    (("test_scheduler::test_schedule_order",), "length_order",
     "asserts FCFS head-of-line order (two 800-token prompts before two 10-token ones); the "
     "pipeline ranks short prompts first (QoSRanker length penalties, MLFQ skip-join)"),
    (KV_PRESSURE_TESTS, "watermarks",
     "KVWatermarks rejects arrivals (`kv_red`, 503) while KV usage is above 0.85: the test's "
     "5-block pool (or exhausted pool) is always red, so the rejected requests never start "
     "or finish as the test expects"),
    (FULL_POOL_START_TESTS, "start_gate",
     "DecodeStepGate starts a request only while KV usage stays at most 0.5: the test fills "
     "more of the pool than that to force a preemption, the gate holds the start instead"),
)
"""Tests that inspect what a pipeline changes by design: (test id prefixes, which pipelines
(`pipeline_traits`), why)."""


def pipeline_traits(name: str) -> set[str]:
    """The traits of scheduler ``name`` that `DESIGN_DIFFERENCES` refers to."""
    from integrations.vllm_v1.config.presets import preset
    from policies import MLFQ, QoSRanker

    traits = {"any"}
    if name in ("stock", "identity"):
        return traits
    pipeline = preset(name, {})
    if isinstance(pipeline.ranking, QoSRanker) or isinstance(pipeline.levels, MLFQ):
        traits.add("length_order")
    if pipeline.watermarks is not None:
        traits.add("watermarks")
    if pipeline.start_gate is not None:
        traits.add("start_gate")
    return traits


def explain(name: str, test_id: str, reason: str) -> str | None:
    """Why scheduler ``name`` fails ``test_id`` by design, or None (unexplained)."""
    if REFUSED in reason:
        return "refused at start-up: `priority` with a pipeline that orders requests"
    traits = pipeline_traits(name)
    for prefixes, trait, why in DESIGN_DIFFERENCES:
        if trait in traits and test_id.startswith(prefixes):
            return why
    return None


def extract(git_dir: Path, commit: str, target: Path) -> None:
    """Write vLLM's test files at ``commit`` of ``git_dir`` under ``target``."""
    for path in SUPPORT_FILES + TEST_FILES:
        text = subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"],
                              check=True, capture_output=True, text=True).stdout
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text)
    (target / "pytest.ini").write_text("[pytest]\naddopts = -p vllm_suite_plugin\n")
    (target / "COMMIT").write_text(commit + "\n")


def run(tests_dir: Path, under_test: str, files: list[str]) -> dict[str, tuple[str, str]]:
    """``test id -> (pass|fail|skip, first line of the failure)`` of one pytest run."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        env = {**os.environ, "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(tests_dir), str(ROOT),
                                              str(Path(__file__).parent)])}
        subprocess.run([sys.executable, "-m", "pytest", "-c", str(tests_dir / "pytest.ini"),
                        "--rootdir", str(tests_dir), "-q", "-p", "no:warnings",
                        f"--scheduler-under-test={under_test}", f"--junitxml={report}",
                        *files], cwd=tests_dir, env=env, check=False,
                       stdout=subprocess.DEVNULL)
        return parse(report)


def parse(report: Path) -> dict[str, tuple[str, str]]:
    results = {}
    for case in ET.parse(report).iter("testcase"):
        test_id = f"{case.get('classname').rsplit('.', 1)[-1]}::{case.get('name')}"
        bad = case.findall("failure") + case.findall("error")
        if bad:
            results[test_id] = ("fail", _reason(bad[0]))
        elif case.findall("skipped"):
            results[test_id] = ("skip", "")
        else:
            results[test_id] = ("pass", "")
    return results


def _reason(element: ET.Element) -> str:
    text = (element.get("message") or "") + "\n" + (element.text or "")
    if "llava" in text and "ModelConfig" in text:
        return "needs llava-hf/llava-1.5-7b-hf (multimodal: the hub, and torchvision)"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[0] if lines else "")[:200]


def compare(results: dict[str, dict[str, tuple[str, str]]]) -> dict:
    """Which tests each scheduler fails where stock passes; stock failures by reason."""
    stock = results["stock"]
    summary: dict = {"stock": dict(Counter(outcome for outcome, _ in stock.values())),
                     "stock_failures": dict(Counter(r for o, r in stock.values()
                                                    if o == "fail").most_common())}
    for name, result in results.items():
        if name == "stock":
            continue
        failing = {t: result[t][1] for t in sorted(result)
                   if result[t][0] == "fail" and stock.get(t, ("",))[0] == "pass"}
        explained = {t: explain(name, t, why) for t, why in failing.items()}
        summary[name] = {
            "outcomes": dict(Counter(outcome for outcome, _ in result.values())),
            "fail_where_stock_passes": failing,
            "by_design": {t: why for t, why in explained.items() if why is not None},
            "unexplained": {t: failing[t] for t, why in explained.items() if why is None},
            "pass_where_stock_fails": sorted(t for t in result if result[t][0] == "pass"
                                             and stock.get(t, ("",))[0] == "fail"),
        }
    return summary


def markdown(summary: dict) -> str:
    lines = ["| scheduler | passed | failed | fail where stock passes | of which refused "
             "(`priority`) | other by design | unexplained |", "|---|---|---|---|---|---|---|"]
    stock = summary["stock"]
    lines.append(f"| stock | {stock.get('pass', 0)} | {stock.get('fail', 0)} | - | - | - | - |")
    for name, entry in summary.items():
        if name.startswith("stock"):
            continue
        outcomes = entry["outcomes"]
        refused = sum(why.startswith("refused") for why in entry["by_design"].values())
        lines.append(f"| {name} | {outcomes.get('pass', 0)} | {outcomes.get('fail', 0)} | "
                     f"{len(entry['fail_where_stock_passes'])} | {refused} | "
                     f"{len(entry['by_design']) - refused} | {len(entry['unexplained'])} |")
    reasons: dict[str, dict[str, list[str]]] = {}  # why -> test -> schedulers
    for name, entry in summary.items():
        if name.startswith("stock"):
            continue
        for test, why in entry["by_design"].items():
            if not why.startswith("refused"):
                reasons.setdefault(why, {}).setdefault(test, []).append(name)
    if reasons:
        lines += ["", "**by design** (besides the `priority` refusals)", "",
                  "| test | schedulers | why |", "|---|---|---|"]
        lines += [f"| `{test}` | {', '.join(names)} | {why} |"
                  for why, tests in reasons.items() for test, names in tests.items()]
    for name, entry in summary.items():
        if not name.startswith("stock") and entry["unexplained"]:
            lines += ["", f"**{name}**: unexplained failures where stock passes", "",
                      "| test | failure |", "|---|---|"]
            lines += [f"| `{t}` | {why} |" for t, why in entry["unexplained"].items()]
    lines += ["", "**stock failures** (cannot run here, or written for another vLLM)", "",
              "| tests | reason |", "|---|---|"]
    lines += [f"| {n} | {why} |" for why, n in summary["stock_failures"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-tests", type=Path,
                        default=ROOT / ".cache" / "vllm-tests" / PINNED_COMMIT)
    parser.add_argument("--extract-from", type=Path, help="a vLLM git directory")
    parser.add_argument("--commit", default=PINNED_COMMIT)
    parser.add_argument("--under-test", nargs="+", default=["stock", "identity", "default"],
                        help="stock, identity, or pipeline preset names")
    parser.add_argument("--files", nargs="+", default=list(TEST_FILES))
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "vllm_scheduler_tests.json")
    args = parser.parse_args(argv)
    if args.extract_from is not None:
        extract(args.extract_from, args.commit, args.vllm_tests)
    if not (args.vllm_tests / "pytest.ini").exists():
        parser.error(f"no vLLM tests in {args.vllm_tests}: pass --extract-from a vLLM git dir")
    names = ["stock"] + [name for name in args.under_test if name != "stock"]
    results = {name: run(args.vllm_tests, name, args.files) for name in names}
    summary = compare(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"commit": (args.vllm_tests / "COMMIT").read_text().strip()
                                    if (args.vllm_tests / "COMMIT").exists() else None,
                                    "summary": summary, "results": results}, indent=1))
    print(markdown(summary))
    return 1 if any(entry.get("unexplained") for entry in summary.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
