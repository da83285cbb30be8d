"""The vLLM surface: every vLLM name the project touches exists, with the parameters it
expects, in each supported release — vLLM 0.32 as installed, and 0.33 from its sources.

vLLM 0.33's wheel needs CUDA torch 2.14, which cannot load beside the CPU torch here,
so both releases are checked by reading their sources (`vllm_surface.check`, ``ast``);
0.32 is also imported. ``make vllm-sources`` unpacks 0.33.0's Python sources into
``.cache/vllm-0.33.0`` (``make test`` does it first and sets VLLM_SURFACE_REQUIRE=1, so CI
cannot skip the check).
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from integrations.vllm_v1.vllm_surface import check
from integrations.vllm_v1.vllm_surface.touches import TOUCHES, Touch

SOURCES_033 = Path(os.environ.get("VLLM_033_SOURCES", Path(__file__).resolve().parents[1]
                                  / ".cache" / "vllm-0.33.0"))


def installed_root() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parents[1]


def test_every_touch_exists_in_the_installed_vllm_032():
    import vllm

    assert vllm.__version__.startswith("0.32"), vllm.__version__
    assert check.problems(installed_root()) == []


def test_every_touch_exists_in_vllm_033_sources():
    if not (SOURCES_033 / "vllm" / "__init__.py").is_file():
        if os.environ.get("VLLM_SURFACE_REQUIRE"):
            pytest.fail(f"vLLM 0.33 sources missing at {SOURCES_033}: run `make vllm-sources`")
        pytest.skip("vLLM 0.33 sources not unpacked (make vllm-sources)")
    assert check.problems(SOURCES_033) == []


def test_the_surface_module_imports_and_its_override_check_passes():
    from integrations.vllm_v1.vllm_surface import names

    assert names.Scheduler.__module__ == "vllm.v1.core.sched.scheduler"


def test_every_override_of_the_scheduler_is_listed_as_a_touch():
    """A new private override must be pinned too: the class's own vLLM-named methods."""
    from integrations.vllm_v1.scheduling.scheduler import PolicySchedulerMixin
    from integrations.vllm_v1.vllm_surface.names import Scheduler

    listed = {t.name.split(".", 1)[1] for t in TOUCHES
              if t.name.startswith("Scheduler.") and t.use == "override"}
    overridden = {name for name, value in vars(PolicySchedulerMixin).items()
                  if callable(value) and hasattr(Scheduler, name)}
    assert overridden <= listed, overridden - listed


FAKE_SCHEDULER = '''
class Scheduler:
    def __init__(self, vllm_config, kv_cache_config, structured_output_manager, block_size):
        self.waiting = []
    def _reserve_prefill_lookahead(self, request, num_computed, num_new_tokens):
        pass
'''


def test_a_renamed_parameter_and_a_missing_member_are_reported(tmp_path):
    module = tmp_path / "vllm" / "v1" / "core" / "sched"
    module.mkdir(parents=True)
    (module / "scheduler.py").write_text(textwrap.dedent(FAKE_SCHEDULER))
    sched = "vllm.v1.core.sched.scheduler"
    touches = (Touch(sched, "Scheduler._reserve_prefill_lookahead", "override",
                     ("request", "num_computed_tokens", "num_new_tokens")),
               Touch(sched, "Scheduler._free_request", "override", ("request",)),
               Touch(sched, "Scheduler.waiting", "assign"),
               Touch(sched, "Scheduler.kv_holding_waiting", "assign"))
    found = check.problems(tmp_path, touches)
    assert found == [
        f"{sched}.Scheduler._reserve_prefill_lookahead (override): parameters "
        "['request', 'num_computed', 'num_new_tokens'], expected to start with "
        "['request', 'num_computed_tokens', 'num_new_tokens']",
        f"{sched}.Scheduler._free_request (override): no member _free_request",
        f"{sched}.Scheduler.kv_holding_waiting (assign): no member kv_holding_waiting",
    ]
