"""Property: the per-answer header paths done in C (map, filter, set operations) give exactly
what the plain rules give, pair by pair: the region's head decoded, the headers filtered on
each leg, Server-Timing rendered."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from router.core import upstream
from router.core.timing import server_timing
from router.net.http1 import _decode

_KNOWN = [
    *sorted(upstream._REQUEST_DROP | upstream._RESPONSE_DROP),
    "access-control-allow-origin",
    "Access-Control-Max-Age",
    "x-request-id",
    "content-type",
    "x-custom",
]
_names = st.one_of(
    st.sampled_from(_KNOWN).flatmap(
        lambda n: st.lists(st.booleans(), min_size=len(n), max_size=len(n)).map(
            lambda ups: "".join(c.upper() if u else c for c, u in zip(n, ups, strict=True))
        )
    ),
    st.text(alphabet="abcXYZ-_0", min_size=1, max_size=8),
)
_values = st.text(alphabet=st.characters(max_codepoint=255, blacklist_categories=("Cs",)))
_fields = st.lists(st.tuples(_names, _values), max_size=14)


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.tuples(st.binary(max_size=12), st.binary(max_size=12)), max_size=10))
def test_a_head_decodes_as_pair_by_pair(fields: list[tuple[bytes, bytes]]) -> None:
    plain = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in fields]
    assert list(_decode(fields).items()) == plain


@settings(max_examples=300, deadline=None)
@given(fields=_fields, connection=st.lists(_names, max_size=4), auth=st.booleans())
def test_request_headers_filter_as_the_plain_rule(
    fields: list[tuple[str, str]], connection: list[str], auth: bool
) -> None:
    if connection:
        fields = [*fields, ("Connection", " , ".join(connection))]
    client = CIMultiDictProxy(CIMultiDict(fields))
    named = client.get("Connection")
    hop = {h.strip().lower() for h in named.split(",")} if named else set()
    expected: CIMultiDict[str] = CIMultiDict(
        [
            (k, v)
            for k, v in client.items()
            if k.lower() not in upstream._REQUEST_DROP and k.lower() not in hop
        ]
    )
    region = SimpleNamespace(auth="Bearer k" if auth else None, id_header="X-Request-Id")
    if auth:
        expected["Authorization"] = "Bearer k"
    expected["Accept-Encoding"] = "identity"
    expected["X-Request-Id"] = upstream.upstream_id("abc")
    got = upstream.Upstream.request_headers(region, client, "abc")  # type: ignore[arg-type]
    assert list(got.items()) == list(expected.items())


@settings(max_examples=300, deadline=None)
@given(fields=_fields)
def test_response_headers_filter_as_the_plain_rule(fields: list[tuple[str, str]]) -> None:
    region = CIMultiDictProxy(CIMultiDict(fields))
    expected = [
        (k, v)
        for k, v in region.items()
        if k.lower() not in upstream._RESPONSE_DROP and not k.lower().startswith("access-control-")
    ]
    assert list(upstream.response_headers(region).items()) == expected


@settings(max_examples=300, deadline=None)
@given(
    durations=st.dictionaries(
        st.sampled_from(["auth", "cache", "x", "total"]), st.integers(0, 10**13)
    ),
    only=st.one_of(st.none(), st.lists(st.sampled_from(["auth", "total", "queue"]), max_size=4)),
)
def test_server_timing_renders_as_the_plain_rule(
    durations: dict[str, int], only: list[str] | None
) -> None:
    names = durations if only is None else [n for n in only if n in durations]
    expected = ", ".join(f"{n};dur={durations[n] / 1e6:.3f}" for n in names)
    assert server_timing(durations, only) == expected


@settings(max_examples=200, deadline=None)
@given(fields=_fields)
def test_a_request_heads_fields_render_as_f_strings(fields: list[tuple[str, str]]) -> None:
    from multidict import istr

    from router.net import http1

    pairs = [(istr(n), v) for n, v in fields] + fields
    rendered = "".join(map(http1._FIELD.__mod__, pairs))
    assert rendered == "".join([f"\r\n{name}: {value}" for name, value in pairs])
