"""Hypothesis workloads for driving the real scheduler through the harness, and their replay."""

from hypothesis import strategies as st


def workloads(*, max_output_tokens: int, max_requests: int):
    """Lists of ``(arrival step, prompt tokens, output tokens, shared-prefix group)``;
    requests of one group share a prefix, so they hit vLLM's prefix cache."""
    return st.lists(
        st.tuples(
            st.integers(0, 6),
            st.integers(1, 200),
            st.integers(1, max_output_tokens),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=max_requests,
    )


def replay_workload(harness, workload, *, check=None, priority=None, limit=2000):
    """Per-step (scheduled tokens, preempted ids, finished ids) of ``workload`` (from
    `workloads`) until everything finishes; ``check(scheduler)`` after every step,
    ``priority(index)`` for each request's priority (default 0)."""
    trace, step = [], 0
    pending = sorted(enumerate(workload), key=lambda item: item[1][0])
    while pending or harness.has_requests():
        while pending and pending[0][1][0] <= step:
            index, (_, prompt, output, group) = pending.pop(0)
            harness.add_request(f"r{index}", [group * 1000 + i % 50 for i in range(prompt)],
                                output, priority=priority(index) if priority else 0)
        result = harness.step()
        if check is not None:
            check(harness.scheduler)
        out = result.scheduler_output
        trace.append((dict(out.num_scheduled_tokens), sorted(out.preempted_req_ids or ()),
                      result.finished_request_ids))
        harness.clock.advance(0.01)
        step += 1
        assert step < limit, "workload did not drain"
    return trace
