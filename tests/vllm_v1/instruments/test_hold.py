"""`HoldHook`: no start while the hold file exists; steps paced by ``hold_step_s``; a bad
pace named at start-up."""

import time
from types import SimpleNamespace

import pytest

from integrations.vllm_v1.config.spec import CONFIG_KEY
from integrations.vllm_v1.instruments.hold import HoldHook


class FakeScheduler:
    def __init__(self, entry):
        self.vllm_config = SimpleNamespace(additional_config={CONFIG_KEY: entry})
        self.limits = []

    def limit_starts(self, n):
        self.limits.append(n)


def test_holds_while_the_file_exists_and_paces_each_step(tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    scheduler = FakeScheduler({"hold_path": str(hold), "hold_step_s": 0.05})
    hook = HoldHook(scheduler)
    started = time.monotonic()
    hook.before_schedule(0.0)
    assert time.monotonic() - started >= 0.05
    hold.unlink()
    hook.before_schedule(0.0)
    assert scheduler.limits == [0]


@pytest.mark.parametrize("pace", ["fast", -0.1, 10, float("nan")])
def test_a_bad_pace_is_named(tmp_path, pace):
    with pytest.raises(ValueError, match="hold_step_s"):
        HoldHook(FakeScheduler({"hold_path": str(tmp_path / "hold"), "hold_step_s": pace}))
