"""`benchmarks.ray_live` without Ray: its flags, the counters per run and the goals judged."""

import pytest

from benchmarks.ray_live.__main__ import COUNTERS, build_parser, counter_deltas, judge, plan


def args(*argv: str):
    return build_parser().parse_args(["--out", "out/x", *argv])


def test_flags_name_the_routers_and_seeds() -> None:
    assert plan(args()) == (["slo", "pow2", "session-sticky"], [0, 1, 2])
    assert plan(args("--routers", "slo,pow2", "--seeds", "4")) == (["slo", "pow2"], [4])
    with pytest.raises(SystemExit, match="--routers: unknown or none \\['rr'\\]"):
        plan(args("--routers", "slo,rr"))
    with pytest.raises(SystemExit, match="--seeds must be comma-separated integers"):
        plan(args("--seeds", "0,x"))
    with pytest.raises(SystemExit, match="--duration-s must be > 0"):
        plan(args("--duration-s", "0"))
    with pytest.raises(SystemExit, match="--load must be > 0"):
        plan(args("--load", "-1"))


def test_counters_are_deltas_except_for_rays_own_router() -> None:
    before = dict.fromkeys(COUNTERS, 3.0)
    after = {COUNTERS[0]: 3.0, COUNTERS[1]: 10.0}
    assert counter_deltas("slo", before, after) == {COUNTERS[0]: 0.0, COUNTERS[1]: 7.0}
    assert counter_deltas("pow2", before, after) == dict.fromkeys(COUNTERS)


def run(goodput: float, attainment: float | None, room: float | None = 0.0) -> dict:
    return {"goodput_rps": goodput, "admitted_slo_attainment": attainment, COUNTERS[0]: room}


def test_goals_are_judged_per_seed_against_the_best_peer() -> None:
    runs = {
        "0": {"slo": run(4.95, 0.846), "pow2": run(2.85, 0.877, None),
              "session-sticky": run(6.60, 0.971, 303)},
        "1": {"slo": run(7.65, 0.956), "pow2": run(2.85, 1.0, None),
              "session-sticky": run(5.70, 0.966, 277)},
        "2": {"slo": run(7.20, None, 1), "pow2": run(3.90, 1.0, None)},
        "3": {"pow2": run(1.0, 1.0, None)},  # ours did not run: not judged
    }
    goals = judge(runs)
    assert goals["of"] == 3 and set(goals["seeds"]) == {"0", "1", "2"}
    zero = goals["seeds"]["0"]
    assert zero["best_peer"] == "session-sticky"
    assert zero["goodput_ratio"] == pytest.approx(4.95 / 6.60)
    assert not zero["goodput_met"] and not zero["admitted_met"] and zero["room_met"]
    assert goals["seeds"]["1"]["goodput_met"] and goals["seeds"]["1"]["admitted_met"]
    two = goals["seeds"]["2"]
    assert two["best_peer"] == "pow2" and not two["admitted_met"] and not two["room_met"]
    assert goals["met"] == {"admitted_met": 1, "goodput_met": 2, "room_met": 2}
    assert judge({}) == {"seeds": {}, "met": dict.fromkeys(
        ("admitted_met", "goodput_met", "room_met"), 0), "of": 0}


def test_with_a_noisy_team_the_quiet_teams_attainment_and_share_are_judged() -> None:
    def with_teams(goodput: float, quiet_met: int, quiet_admitted: int) -> dict:
        # 10 s window; acme (quiet) offered 60, globex the rest; equal weights declared
        return {**run(goodput, 0.97), "window_s": 10.0, "by_tenant": {
            "acme": {"offered": 60, "admitted": quiet_admitted, "met": quiet_met},
            "globex": {"offered": 180, "admitted": 100, "met": 97}}}

    runs = {"0": {"slo": with_teams(16.0, 58, 60), "pow2": run(12.0, 0.5, None)},
            "1": {"slo": with_teams(16.0, 50, 60), "pow2": run(12.0, 0.5, None)}}
    goals = judge(runs, noisy_team=True)
    zero, one = goals["seeds"]["0"], goals["seeds"]["1"]
    # fair share: the smaller of what it offered (6 req/s) and half the goodput (8 req/s)
    assert zero["quiet_fair_share_rps"] == pytest.approx(6.0)
    assert zero["quiet_goodput_rps"] == pytest.approx(5.8) and zero["quiet_share_met"]
    assert zero["quiet_admitted_met"]
    assert not one["quiet_admitted_met"] and not one["quiet_share_met"]  # 5.0 < 0.9 x 6
    assert goals["met"]["quiet_share_met"] == 1 and goals["met"]["quiet_admitted_met"] == 1
    assert "quiet_share_met" not in judge(runs)["met"]
    assert args("--noisy-team").noisy_team and not args().noisy_team
