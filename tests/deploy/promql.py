"""The vector selectors of a PromQL expression (metric names and label matchers), for checking that
the chart's dashboard, alerts and autoscaler only query metrics the services export.

A small lexer and a token walk, not a full parser: enough of PromQL to tell metric names from
function names, aggregation and grouping label lists, label matchers, strings, numbers, durations,
ranges / subqueries and modifiers. Anything it does not know (an unknown function, a stray
character, unbalanced brackets, a selector without a metric name) is an error rather than a guess,
so a query it misreads cannot hide a metric name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# PromQL's functions (start and end are the @ modifier's) and aggregation operators.
FUNCTIONS = frozenset(
    [
        "abs",
        "absent",
        "absent_over_time",
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "avg_over_time",
        "ceil",
        "changes",
        "clamp",
        "clamp_max",
        "clamp_min",
        "cos",
        "cosh",
        "count_over_time",
        "day_of_month",
        "day_of_week",
        "day_of_year",
        "days_in_month",
        "deg",
        "delta",
        "deriv",
        "double_exponential_smoothing",
        "end",
        "exp",
        "floor",
        "histogram_avg",
        "histogram_count",
        "histogram_fraction",
        "histogram_quantile",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_sum",
        "holt_winters",
        "hour",
        "idelta",
        "increase",
        "info",
        "irate",
        "label_join",
        "label_replace",
        "last_over_time",
        "ln",
        "log10",
        "log2",
        "mad_over_time",
        "max_over_time",
        "min_over_time",
        "minute",
        "month",
        "pi",
        "predict_linear",
        "present_over_time",
        "quantile_over_time",
        "rad",
        "rate",
        "resets",
        "round",
        "scalar",
        "sgn",
        "sin",
        "sinh",
        "sort",
        "sort_by_label",
        "sort_by_label_desc",
        "sort_desc",
        "sqrt",
        "start",
        "stddev_over_time",
        "stdvar_over_time",
        "sum_over_time",
        "tan",
        "tanh",
        "time",
        "timestamp",
        "vector",
        "year",
    ]
)
AGGREGATIONS = frozenset(
    [
        "avg",
        "bottomk",
        "count",
        "count_values",
        "group",
        "limit_ratio",
        "limitk",
        "max",
        "min",
        "quantile",
        "stddev",
        "stdvar",
        "sum",
        "topk",
    ]
)
# Keywords followed by a list of label names: `by (le)`, `on (pod)`, `group_left (node)`.
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# group_left / group_right may stand without a label list.
OPTIONAL_LABEL_LISTS = frozenset({"group_left", "group_right"})
BINARY_KEYWORDS = frozenset({"and", "or", "unless", "atan2", "bool"})
MATCH_OPERATORS = frozenset({"=", "!=", "=~", "!~"})

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
    |(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
    |(?P<range>\[[^\[\]]*\])
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![\w.:])
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.:])
    |(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=(){},@])
    """,
    re.VERBOSE,
)


class PromQLError(ValueError):
    """An expression this reader does not understand."""


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str


@dataclass(frozen=True)
class Selector:
    """One vector selector: `metric{label="value", ...}`."""

    metric: str
    matchers: tuple[Matcher, ...] = ()


def tokens(expr: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None:
            raise PromQLError(f"unexpected {expr[pos : pos + 20]!r} at {pos} in {expr!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind != "space":
            out.append(Token(kind, match.group()))
        pos = match.end()
    return out


def _unquote(text: str) -> str:
    if text[0] == "`":
        return text[1:-1]
    return re.sub(r"\\(.)", r"\1", text[1:-1])


class _Reader:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.toks = tokens(expr)
        self.pos = 0
        self.selectors: list[Selector] = []

    def peek(self) -> Token | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self, text: str | None = None, kind: str | None = None) -> Token:
        tok = self.peek()
        if tok is None or (text is not None and tok.text != text) or (kind is not None and tok.kind != kind):
            want = text or kind
            raise PromQLError(f"expected {want!r}, found {tok.text if tok else 'the end'!r} in {self.expr!r}")
        self.pos += 1
        return tok

    def is_next(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind in ("op", "ident") and tok.text == text

    def label_list(self) -> None:
        self.take("(")
        while not self.is_next(")"):
            self.take(kind="ident")
            if not self.is_next(")"):
                self.take(",")
        self.take(")")

    def matchers(self) -> tuple[Matcher, ...]:
        self.take("{")
        found: list[Matcher] = []
        while not self.is_next("}"):
            label = self.take(kind="ident").text
            op = self.take(kind="op").text
            if op not in MATCH_OPERATORS:
                raise PromQLError(f"label {label!r}: unknown matcher {op!r} in {self.expr!r}")
            found.append(Matcher(label, op, _unquote(self.take(kind="string").text)))
            if not self.is_next("}"):
                self.take(",")
        self.take("}")
        return tuple(found)

    def read(self) -> list[Selector]:
        depth = 0
        while (tok := self.peek()) is not None:
            if tok.kind == "ident":
                self.ident(tok.text)
                continue
            self.pos += 1
            if tok.text == "(":
                depth += 1
            elif tok.text == ")":
                depth -= 1
                if depth < 0:
                    raise PromQLError(f"unbalanced ')' in {self.expr!r}")
            elif tok.text == "{":  # a selector without a leading name: {__name__="x", ...}
                self.pos -= 1
                found = self.matchers()
                names = [m.value for m in found if m.label == "__name__" and m.op == "="]
                if len(names) != 1:
                    raise PromQLError(f'a selector names no metric (one __name__="..." needed) in {self.expr!r}')
                self.selectors.append(Selector(names[0], tuple(m for m in found if m.label != "__name__")))
            elif tok.text == "}":
                raise PromQLError(f"unbalanced {tok.text!r} in {self.expr!r}")
        if depth:
            raise PromQLError(f"unbalanced '(' in {self.expr!r}")
        return self.selectors

    def ident(self, name: str) -> None:
        self.pos += 1
        nxt = self.peek()
        if name in LABEL_LISTS:
            if self.is_next("(") or name not in OPTIONAL_LABEL_LISTS:
                self.label_list()
        elif name in BINARY_KEYWORDS or name.lower() in ("inf", "nan"):
            return
        elif name == "offset":
            if self.is_next("-"):
                self.pos += 1
            self.take(kind="duration")
        elif nxt is not None and nxt.text == "(":
            if name not in FUNCTIONS and name not in AGGREGATIONS:
                raise PromQLError(f"unknown function {name!r} in {self.expr!r}")
        elif name in AGGREGATIONS and nxt is not None and nxt.text in ("by", "without"):
            return  # `sum by (le) (...)`: the label list comes next
        else:
            self.selectors.append(Selector(name, self.matchers() if self.is_next("{") else ()))


def selectors(expr: str) -> list[Selector]:
    """Every vector selector of `expr`, in order."""
    return _Reader(expr).read()


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` queries."""
    return {s.metric for s in selectors(expr)}
