"""Every scheduler under test, synchronous and asynchronous (`tests.invariants.driver.CASES`)."""

import pytest

from tests.invariants.driver import CASE_IDS, CASES


@pytest.fixture(params=CASES, ids=CASE_IDS)
def case(request):
    """(preset or ``stock``, vLLM scheduling policy)."""
    return request.param


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def is_async(request):
    """vLLM's `Scheduler` (ours: `PolicyScheduler`) or `AsyncScheduler` (`AsyncPolicyScheduler`)."""
    return request.param
