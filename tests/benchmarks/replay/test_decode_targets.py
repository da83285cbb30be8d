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


def test_every_setting_of_the_queue_caps_sweep_counts_as_stock():
    sweep = {"settings": [
        {"setting": "stock+queue-caps:fcfs:reqs=128", "short_itl_jitter": 9.0,
         "top_priority_tpot_p99_s": 0.030, "short_ttft_p99_s": 0.3, "long_ttft_p99_s": 0.4},
        {"setting": "stock+queue-caps:priority:reqs=256", "short_itl_jitter": 3.5,
         "top_priority_tpot_p99_s": 0.074, "short_ttft_p99_s": None, "long_ttft_p99_s": 0.5}]}
    entries = {(e["system"], e["target"]): e
               for e in decode_protection_targets({**SUMMARY, "queue_caps_sweep": sweep})}
    tpot = entries["pipeline:new", "high_priority_tpot"]
    assert tpot["best_stock_system"] == "stock+queue-caps:fcfs:reqs=128"
    assert tpot["passed"] and not tpot["passed_vs_best_stock"], "0.040 > 0.6 x 0.030"
    jitter = entries["pipeline:new", "short_itl_jitter"]
    assert (jitter["best_stock_system"], jitter["best_stock"]) == (
        "stock+queue-caps:priority:reqs=256", 3.5)
    assert not jitter["passed_vs_best_stock"], "3.0 > 0.6 x 3.5"
    short = entries["pipeline:new", "ttft_kept_short"]
    assert short["best_stock_system"] == "stock+queue-caps:fcfs:reqs=128"
    assert "missed against it" in format_targets(list(entries.values()))


def test_strict_verdict_passes_when_the_value_beats_every_stock_system_by_the_ratio():
    entries = {(e["system"], e["target"]): e for e in decode_protection_targets(SUMMARY)}
    assert entries["pipeline:new", "high_priority_tpot"]["passed_vs_best_stock"] is False
    strong = {"systems": {**SUMMARY["systems"],
                          "pipeline:strong": system(2.0, 0.030, 0.5, 5.0)}}
    entries = {(e["system"], e["target"]): e for e in decode_protection_targets(strong)}
    assert entries["pipeline:strong", "short_itl_jitter"]["passed_vs_best_stock"], "2 <= 0.6 x 4"
    assert entries["pipeline:strong", "high_priority_tpot"]["passed_vs_best_stock"], \
        "0.030 <= 0.6 x 0.060"
