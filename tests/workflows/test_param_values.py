"""Every parameter value is refused with one line (ParamError) or accepted: never another
exception, whatever it is (non-finite, huge, NUL-bearing, wrong-typed); admission of a
graph's size from the parameters alone, in bounded time."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spillway import workflows
from spillway.options.errors import ParamError
from spillway.workflows.params import Target

NASTY_TEXT = st.sampled_from(["1e400GB", "\u0000", "a\u0000b", "nanGB", "infGB", "-1GB", "1e18GB", "9" * 5000,
                              "x", "1x", "0x0", "auto", "", " ", "1e400", "NaN", "all", "0", "1", "float64",
                              "1" * 4300 + "GB", "\u0000GB", "10GiB", "2" * 80 + "x2"])
NASTY = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**70, max_value=2**70),
              st.floats(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30), NASTY_TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6)


@pytest.mark.parametrize("name", sorted(workflows.names()))
def test_named_bad_values_are_one_line(name):
    workflow = workflows.get(name)
    for p in workflow.params:
        for value in ("1e400GB", "\u0000", float("inf"), float("nan"), 10**400, [10**30, 10**30], {"a": 1}):
            try:
                workflow.validate({p.name: value}, Target())
            except ParamError as e:
                assert "\n" not in str(e) and len(str(e)) < 400
                # sizes past what Python parses still name the value and the limit
                if p.kind in ("size", "chunks") and value == "1e400GB":
                    assert str(e).startswith(f"{p.name}: '1e400GB' exceeds the largest supported size")
                if value == "\u0000" and p.kind in ("str", "path"):
                    assert "NUL" in str(e)


EXAMPLES = 3000


# the suite's hang net (300 s a test) cut this at its two-thousandth example or so beside a
# 2-core CPU hog: its work is these examples (about 15 ms of CPU each), so its net is a
# second each, which only a hang outlasts
@pytest.mark.timeout(EXAMPLES)
@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(sorted(workflows.names())), data=st.data())
def test_any_value_gives_a_param_error_or_passes(name, data):
    workflow = workflows.get(name)
    keys = [p.name for p in workflow.params]
    raw = data.draw(st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=4)), NASTY, max_size=4))
    try:
        workflow.validate(raw, Target(kind=data.draw(st.sampled_from(["cpu", "gpu"]))))
    except ParamError as e:
        assert "\n" not in str(e)


def test_axis_takes_the_integer_and_the_string():
    reduction = workflows.get("reduction")
    assert reduction.validate({"axis": 0})["axis"] == reduction.validate({"axis": "0"})["axis"]
    assert reduction.validate({"axis": 1})["axis"] == "1"
    with pytest.raises(ParamError, match=r"axis: 2 is not one of all, 0, 1"):
        reduction.validate({"axis": 2})
    # the schema offers both spellings
    assert {0, "0"} <= set(reduction.schema()["properties"]["axis"]["enum"])


def test_gather_graph_refused_from_parameters_in_bounded_time():
    import resource

    gather = workflows.get("gather")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ParamError) as refused:
        gather.validate({"size": [100, 100], "count": 134217728}, Target())
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 50_000  # KiB: nothing built
    # both numbers: the graph's and the limit's
    assert refused.value.args[0].startswith("count: gather would build a graph of about 5,368,716 tasks")
    assert "more than the limit of 200,000" in str(refused.value)


def test_chunk_count_bound_from_parameters():
    with pytest.raises(ParamError, match="tasks .*more than the limit"):
        workflows.get("matmul").validate({"size": [20000, 20000], "chunks": [200, 200]}, Target())
    with pytest.raises(ParamError, match="column panels"):
        workflows.get("rechunk").validate({"size": [100000, 100000], "chunks": [100, 100000]}, Target())


def test_check_values_needs_no_cluster():
    slice_ = workflows.get("slice")
    slice_.check_values({"step": 2, "size": "40x40"})
    with pytest.raises(ParamError, match="stpe: not a parameter of slice .did you mean step"):
        slice_.check_values({"stpe": 2})
    with pytest.raises(ParamError, match="step: 0 is below the minimum"):
        slice_.check_values({"step": 0})
    assert math.isfinite(1.0)
