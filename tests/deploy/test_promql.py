"""The PromQL reader of tests/deploy/promql.py: it must find every metric name, and only those, or fail."""

from __future__ import annotations

import pytest

from tests.deploy.promql import Matcher, PromQLError, Selector, metric_names, selectors


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ("recording:rule_name:rate5m", {"recording:rule_name:rate5m"}),
        ("rate(x_total[5m])", {"x_total"}),
        ("sum by (le) (rate(x_bucket[5m]))", {"x_bucket"}),
        ("histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m])))", {"x_bucket"}),
        ("sum(rate(a_sum[1h30m])) / sum(rate(a_count[$__rate_interval]))", {"a_sum", "a_count"}),
        ("sum(rate(x[5m])) by (pod, namespace)", {"x"}),
        ("sum without (instance) (x)", {"x"}),
        ('a{state="queued", le=~"0.5|1"} > 0', {"a"}),
        ('a{job="by (x) rate(y[5m])"}', {"a"}),  # selectors and keywords inside strings are not read
        ("a{name='sum(b)'} + c{v=`d{e=\"f\"}`}", {"a", "c"}),
        ('a{state="quo\\"ted"}', {"a"}),
        ("a offset 5m", {"a"}),
        ("rate(a[5m] offset -1h) @ 1609746000", {"a"}),
        ("a @ start() - b @ end()", {"a", "b"}),
        ("max_over_time(rate(a[5m])[30m:1m])", {"a"}),
        ("a * on(pod) group_left(node) b", {"a", "b"}),
        ("a / ignoring(code) group_right c", {"a", "c"}),
        ("a + on() group_left b", {"a", "b"}),
        ("clamp_min(max(a), scalar(b * c / clamp_min(max(d), 1))) + on() (sum(e) or vector(0))", set("abcde")),
        ("a and b or c unless d", set("abcd")),
        ("a > bool 1e-3", {"a"}),
        ("a * 0x1F + 1.5e3 - .5 + Inf - NaN", {"a"}),
        ('topk(5, a) or bottomk(3, b) or quantile(0.9, c) or count_values("v", d)', set("abcd")),
        ('label_replace(a, "dst", "$1", "src", "(.*)")', {"a"}),
        ('{__name__="a", job="x"}', {"a"}),
        ("atan2(a, b) + a atan2 b", {"a", "b"}),
        ("-a ^ 2 % 3", {"a"}),
        ("a  # a comment naming b\n + c", {"a", "c"}),
        ("1 + 2", set()),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_selectors_keep_their_matchers() -> None:
    found = selectors('sum by (state) (inferix_sessions{namespace="ns", state!~"completed|failed",}) / x{__name__="y"}')
    assert found == [
        Selector("inferix_sessions", (Matcher("namespace", "=", "ns"), Matcher("state", "!~", "completed|failed"))),
        Selector("x", (Matcher("__name__", "=", "y"),)),
    ]


@pytest.mark.parametrize(
    "expr",
    [
        "rat(a[5m])",  # an unknown function would hide a metric name
        "sum(a",
        "sum(a))",
        "a{job=x}",
        'a{job=="x"}',
        'a{job="x"',
        "a}",
        "a[5m",
        '{job="x"}',  # no metric name
        "a offset",
        "5x",
        "a $ b",
        "sum by le (a)",
    ],
)
def test_what_it_cannot_read_is_an_error(expr: str) -> None:
    with pytest.raises(PromQLError):
        selectors(expr)
