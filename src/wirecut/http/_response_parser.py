"""``ResponseParser``: one HTTP/1.1 response at a time, parsed by httptools (llhttp, in C).

A provider streams one chunk per token, and h11, the pure-Python parser under
httpcore, makes two state-machine steps of every chunk: that was most of the
CPU a relayed token cost. llhttp parses the head and the chunked (or
length-delimited) body in C and hands over the body as it goes.

Feed it what the socket gave (``feed``); it keeps the head (``status_code``,
``headers``, ``reason``) and the body bytes not taken yet (``take_body``),
and says when the response is ``complete`` and whether the connection may
carry another (``keep_alive``). Informational responses (1xx) are skipped.
A response whose body ends with the connection (no length, not chunked) is
complete at ``feed_eof``. Pure; used by one thread (or one event loop) at a
time.
"""

from __future__ import annotations

import httptools

__all__ = ["ResponseParser", "ResponseProtocolError"]


class ResponseProtocolError(Exception):
    """The peer's bytes are not an HTTP/1.1 response, or it ended one early; the message says."""


class ResponseParser:
    """The state of one response being read; see the module docstring."""

    __slots__ = (
        "_body",
        "_chunked",
        "_delimited",
        "_parser",
        "_status_text",
        "complete",
        "headers",
        "headers_complete",
        "keep_alive",
        "status_code",
    )

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._body: list[bytes] = []
        self._status_text = b""
        self._chunked = False
        self._delimited = False
        self.status_code = 0
        #: The head's fields, as sent (names not folded).
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_complete = False
        self.complete = False
        self.keep_alive = False

    @property
    def reason(self) -> bytes:
        return self._status_text

    def feed(self, data: bytes) -> None:
        """Parse ``data``; ``ResponseProtocolError`` if it is not HTTP/1.1.

        Bytes after the end of the response are ignored, and the connection
        is not kept: a server that sends more than it was asked for cannot
        be trusted with the next request on it.
        """
        if self.complete:
            if data:
                self.keep_alive = False
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.complete:
                self.keep_alive = False  # What followed the response was not one.
                return
            raise ResponseProtocolError(f"the server's response is not HTTP/1.1: {exc}") from None

    def feed_eof(self) -> None:
        """The peer closed: the response ends here, or ``ResponseProtocolError`` if it cannot."""
        if self.complete:
            return
        if self.headers_complete and not self._delimited:
            self.complete = True  # Its body was "until the connection closes".
            self.keep_alive = False
            return
        where = "its body" if self.headers_complete else "the response head"
        raise ResponseProtocolError(f"the server closed the connection in the middle of {where}")

    def take_body(self) -> bytes:
        """The body bytes parsed since the last call (b"" if none)."""
        if not self._body:
            return b""
        if len(self._body) == 1:
            data = self._body[0]
        else:
            data = b"".join(self._body)
        self._body.clear()
        return data

    # -- httptools' callbacks ---------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self.keep_alive = False  # A second response to one request.

    def on_status(self, status: bytes) -> None:
        if not self.complete:
            self._status_text += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        lowered = name.lower()
        if lowered == b"transfer-encoding" and b"chunked" in value.lower():
            self._chunked = True
        elif lowered == b"content-length":
            self._delimited = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        code = self._parser.get_status_code()
        if 100 <= code < 200 and code != 101:
            # Informational (100 Continue, 103 Early Hints): the response follows.
            self.headers = []
            self._status_text = b""
            self._chunked = self._delimited = False
            return
        self.status_code = code
        self._delimited = self._delimited or self._chunked or code in (204, 304)
        self.headers_complete = True

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if not self.headers_complete or self.complete:
            return  # The end of an informational response, or of one that followed ours.
        self.keep_alive = self._parser.should_keep_alive()
        self.complete = True
