"""Decode-protection targets: judged against fcfs, with the best stock system beside."""

from benchmarks.replay.targets import decode_protection_targets, format_targets


def system(jitter, tpot, short_ttft, long_ttft):
    return {"by_class": {"short": {"itl_jitter": jitter, "ttft_p99_s": short_ttft},
                         "long": {"ttft_p99_s": long_ttft}},
            "by_priority": {"-1": {"tpot_p99_s": tpot}, "1": {"tpot_p99_s": 1.0}}}


SUMMARY = {"systems": {
    "fcfs": system(6.0, 0.070, 26.0, 26.0),
    "stock+queue-caps": system(4.0, 0.060, 2.0, 3.0),
    "pipeline:default": system(8.0, 0.071, 0.7, 5.0),
    "pipeline:new": system(3.0, 0.040, 0.5, 5.6),
}}


def test_each_pipeline_is_judged_against_fcfs_and_the_best_stock_system_is_reported():
    entries = {(e["system"], e["target"]): e for e in decode_protection_targets(SUMMARY)}
    jitter = entries["pipeline:new", "short_itl_jitter"]
    assert jitter["ratio_to_fcfs"] == 0.5 and jitter["passed"]
    assert jitter["best_stock_system"] == "stock+queue-caps" and jitter["best_stock"] == 4.0
    tpot = entries["pipeline:new", "high_priority_tpot"]
    assert tpot["value"] == 0.040 and tpot["passed"], "priority -1 is the most urgent tier"
    assert not entries["pipeline:default", "short_itl_jitter"]["passed"]
    assert entries["pipeline:new", "ttft_kept_short"]["passed"]
    long = entries["pipeline:new", "ttft_kept_long"]
    assert long["reference_system"] == "pipeline:default" and not long["passed"], "1.12x > 1.1x"
    assert "MISSED  pipeline:new" in format_targets(list(entries.values()))


def test_nothing_is_judged_without_fcfs():
    assert decode_protection_targets({"systems": {"pipeline:new": SUMMARY["systems"]["fcfs"]}}) == []
