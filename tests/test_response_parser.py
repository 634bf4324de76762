"""ResponseParser: an HTTP/1.1 response, however the bytes are split, through httptools."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wirecut.http._response_parser import ResponseParser, ResponseProtocolError

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
    b"6\r\ndata: \r\n5\r\nhello\r\n2\r\n\n\n\r\n0\r\n\r\n"
)


def parse(pieces: list[bytes]) -> ResponseParser:
    parser = ResponseParser()
    for piece in pieces:
        parser.feed(piece)
    return parser


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(st.lists(st.integers(min_value=0, max_value=len(CHUNKED)), max_size=12))
def test_a_chunked_body_is_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    parser = ResponseParser()
    body = b""
    for piece in split(CHUNKED, cuts):
        parser.feed(piece)
        body += parser.take_body()
    assert (parser.status_code, parser.complete, parser.keep_alive) == (200, True, True)
    assert body == b"data: hello\n\n"
    assert (b"Content-Type", b"text/event-stream") in parser.headers


def test_a_length_delimited_body_completes_at_its_length() -> None:
    parser = parse([b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nhi"])
    assert (parser.status_code, parser.reason, parser.take_body()) == (201, b"Created", b"hi")
    assert parser.complete
    assert parser.keep_alive


def test_a_body_until_the_close_completes_at_the_eof_and_keeps_no_connection() -> None:
    parser = parse([b"HTTP/1.1 200 OK\r\n\r\nto the end"])
    assert not parser.complete
    parser.feed_eof()
    assert parser.take_body() == b"to the end"
    assert (parser.complete, parser.keep_alive) == (True, False)


@pytest.mark.parametrize(
    "sent",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nContent-",
    ],
)
def test_an_eof_inside_a_delimited_body_or_the_head_is_a_protocol_error(sent: bytes) -> None:
    parser = parse([sent])
    with pytest.raises(ResponseProtocolError, match="closed the connection in the middle"):
        parser.feed_eof()


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(ResponseProtocolError, match=r"not HTTP/1\.1"):
        parse([b"SSH-2.0-OpenSSH_9.2\r\n"])


def test_an_informational_response_is_skipped() -> None:
    parser = parse(
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: b\r\n\r\nok"]
    )
    assert (parser.status_code, parser.headers, parser.take_body()) == (
        200,
        [(b"Content-Length", b"2"), (b"X-A", b"b")],
        b"ok",
    )


def test_what_follows_a_complete_response_keeps_the_connection_from_reuse() -> None:
    parser = parse([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n"])
    assert parser.take_body() == b"ok"
    assert (parser.complete, parser.keep_alive) == (True, False)


def test_connection_close_keeps_no_connection() -> None:
    parser = parse([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"])
    assert (parser.complete, parser.keep_alive) == (True, False)
