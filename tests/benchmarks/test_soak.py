"""The soak benchmark's accounting: every offered request has exactly one known outcome."""

from collections import Counter

from benchmarks.soak import accounting


def test_offered_is_completed_rejected_cancelled_and_invalid():
    counts = accounting(Counter(completed=5, rejected=2, cancelled=3, invalid=1))
    assert counts["offered"] == 11 and counts["balanced"]
    assert counts["unexpected"] == 0


def test_an_unexpected_outcome_breaks_the_balance():
    assert not accounting(Counter(completed=5, unexpected=1))["balanced"]
