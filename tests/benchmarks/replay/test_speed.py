"""`benchmarks.replay.speed`: both modes in one run, the same records, a summary that says so."""

import json

import attrs

from benchmarks.replay import speed


def test_both_modes_replay_the_same_records(tmp_path):
    summary = speed.main(["--trace", "azure-conv", "--max-requests", "300", "--rate-scale", "4",
                          "--system", "fcfs", "--out", str(tmp_path)])
    assert summary["records_equal"] is True
    fast, step = summary["modes"]["fast_forward"], summary["modes"]["step_by_step"]
    assert fast["steps"] == step["steps"]
    assert fast["fast_forwarded_steps"] > 0 and step["fast_forwarded_steps"] == 0
    assert summary["requests"] == 300 and summary["order"] == ["fast_forward", "step_by_step"]
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["target"]["limit_s"] == speed.TARGET_S
    assert set(written["target"]) >= {"total_wall_s", "total_cpu_s", "passed_wall", "passed_cpu"}
    assert (tmp_path / "speed.png").stat().st_size > 0


def test_same_result_sees_a_changed_record_and_ignores_speed():
    from benchmarks.replay.cost_model import StepCostModel
    from benchmarks.replay.driver import replay
    from benchmarks.replay.workloads import load_workload
    from integrations.vllm_v1.instruments import EngineShape

    trace = load_workload("azure-conv", max_requests=20)
    run = replay(trace, "fcfs", shape=EngineShape(), cost_model=StepCostModel.preset("h100"))
    assert speed.same_result(run, attrs.evolve(run, wall_s=run.wall_s + 1.0,
                                               fast_forwarded_steps=0))
    first = run.records[0]
    copy = attrs.evolve(first, token_times_s=list(first.token_times_s))
    same = attrs.evolve(run, records=(copy, *run.records[1:]))
    assert speed.same_result(run, same)  # equal fields, another object
    copy.token_times_s[-1] += 1e-6
    assert not speed.same_result(run, same)
    assert not speed.same_result(run, attrs.evolve(run, steps=run.steps + 1))
