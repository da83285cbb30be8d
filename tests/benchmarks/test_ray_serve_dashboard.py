"""The Ray Serve dashboard's evaluator: every query is namespaced, and the expressions it uses
evaluate on scrapes the way Prometheus computes them."""

import pytest

from benchmarks import ray_serve_dashboard as dashboard


def test_dashboard_queries_are_namespaced_and_evaluate_on_scrapes():
    board = dashboard.load_dashboard()
    titles = {title for title, _, _ in dashboard.queries(board)}
    assert {"Prefix-cache hit rate", "Queue by tenant", "Rejections by reason",
            "Routing decisions by reason"} <= titles
    for _, expr, _ in dashboard.queries(board):
        assert dashboard.metric_names(expr), expr
    series = dashboard.Series()
    for t, hits in ((0.0, 0.0), (10.0, 30.0)):
        series.add(t, dashboard.parse_samples(
            f'vllm:prefix_cache_hits_total {hits}\nvllm:prefix_cache_queries_total {hits * 2}\n'
            f'vllm:time_to_first_token_seconds_bucket{{le="0.1"}} {hits}\n'
            f'vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {hits * 2}\n',
            {"replica": "r0"}))
    ratio = dashboard.evaluate("sum by (replica) (rate(vllm:prefix_cache_hits_total[10s])) / "
                               "sum by (replica) (rate(vllm:prefix_cache_queries_total[10s]))",
                               series, 10.0)
    assert ratio == {(("replica", "r0"),): 0.5}
    p25 = dashboard.evaluate("histogram_quantile(0.25, sum by (le) "
                             "(rate(vllm:time_to_first_token_seconds_bucket[10s])))", series, 10.0)
    assert p25 == {(): pytest.approx(0.05)}
    with pytest.raises(ValueError):
        dashboard.evaluate("sum(rate(x[1m])) ) )", series, 10.0)
