"""Property tests (hypothesis, fixed budgets) on the parsers every hop runs on untrusted input:
the JSON <-> protobuf transcoder and the Server-Timing parser. Each property that found a bug
keeps its regression example (``@example``)."""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st
from pathprobe import jsoncodec, timing
from pathprobe.errors import InvalidArgument
from pathprobe.v1 import llm_pb2

BUDGET = settings(max_examples=300, deadline=None, derandomize=True)

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
# float32 values next to FLT_MAX / in the subnormal range do not survive protobuf's own JSON printer
# and parser (json_format rejects them as out of range: a clean 400, not a crash); sampling past them
FLOAT32 = st.floats(width=32, min_value=-1048576.0, max_value=1048576.0, allow_subnormal=False)
requests = st.builds(
    llm_pb2.GenerateRequest,
    prompt=st.text(max_size=40),
    prompt_token_ids=st.lists(INT32, max_size=5),
    max_tokens=INT32,
    temperature=FLOAT32,
    top_p=FLOAT32,
    seed=INT64,
    ignore_eos=st.booleans(),
    stop=st.lists(st.text(max_size=5), max_size=3),
    request_id=st.text(max_size=10),
    model=st.text(max_size=10),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@BUDGET
@given(requests)
@example(llm_pb2.GenerateRequest(seed=5))  # int64 is a JSON string in to_dict's output: it must parse back
def test_request_round_trips_through_json(msg) -> None:
    obj = jsoncodec.to_dict(msg)
    back = jsoncodec.request_from_dict(json.loads(jsoncodec.dumps(obj)))
    assert back == msg


@BUDGET
@given(
    st.dictionaries(
        st.sampled_from([*llm_pb2.GenerateRequest.DESCRIPTOR.fields_by_name, "stream", "x"]), json_values, max_size=6
    )
)
def test_any_json_object_is_a_request_or_a_named_invalid_argument(obj) -> None:
    try:
        jsoncodec.request_from_dict(obj)
        jsoncodec.stream_flag(obj)
    except InvalidArgument as exc:
        assert exc.field and exc.message


@BUDGET
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(b"[" * 100_000)  # nesting past the recursion limit was a RecursionError (HTTP 500)
@example(b'{"a":' * 50_000)
def test_any_body_is_an_object_or_a_body_error(body) -> None:
    try:
        obj = jsoncodec.loads_object(body)
    except InvalidArgument as exc:
        assert exc.field == "body"
    else:
        assert isinstance(obj, dict)


NAMES = st.from_regex(r"[a-z][a-z0-9_.-]{0,12}", fullmatch=True)
DURS = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@BUDGET
@given(st.dictionaries(NAMES, DURS, max_size=8))
def test_timing_round_trip(entries) -> None:
    got = timing.parse(timing.format_entries(entries))
    assert got.keys() == entries.keys()
    for k, v in entries.items():
        assert math.isclose(got[k], v, abs_tol=5e-4, rel_tol=1e-9)


@BUDGET
@given(st.text(max_size=300))
@example("a;dur=nan, b;dur=inf, c;dur=-inf, d;dur=1e999")  # non-finite durations poisoned every statistic
@example('x;desc="a;b";dur=1, ;dur=2, y;dur')
def test_timing_parse_never_raises_and_durations_are_finite(value) -> None:
    for parsed in (timing.parse(value), timing.parse_chain(value)):
        assert all(isinstance(v, float) and math.isfinite(v) for v in parsed.values())
    chain = timing.parse_chain(value)
    assert all(h.entries for h in chain.hops)


@BUDGET
@given(st.dictionaries(NAMES.map(lambda n: "srv." + n), DURS, max_size=5), st.lists(DURS, min_size=4, max_size=4))
def test_append_keeps_the_gateway_hop_last(upstream, durs) -> None:
    own = dict(zip(("gw.decode", "gw.encode", "gw.upstream", "gw.total"), durs))  # gw.total last, as sent
    chain = timing.parse_chain(timing.append(timing.format_entries(upstream) or None, own))
    assert chain.hops[-1].entries == {k: round(v, 3) for k, v in own.items()}
