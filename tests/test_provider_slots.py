"""``provider_slots``: how many requests a provider runs at once, asked over real sockets.

llama.cpp's ``/slots`` (the simulator answers it too) or ``/props``; a
provider that says neither is a settled unknown; one that cannot answer yet
(nothing listens, or 503 while llama.cpp loads its model) is asked again.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from _loopback import Exchange, LoopbackServer
from _sim import sim_factory
from wirecut.provider import SlotCount, provider_slots, slots_in_listing, slots_in_props
from wirecut.simulator import SimulatorServer

sim = pytest.fixture(sim_factory)


def test_the_simulators_slots_are_read_from_its_slots_listing(
    sim: Callable[..., SimulatorServer],
) -> None:
    server = sim(slots=3)
    assert provider_slots(server.base_url) == SlotCount(3, settled=True, source="/slots")


def _routes(answers: dict[str, tuple[int, object]]) -> Callable[[Exchange], None]:
    def handler(exchange: Exchange) -> None:
        status, body = answers.get(exchange.request.path, (404, {"error": "not found"}))
        exchange.json(body, status=status)

    return handler


def test_props_total_slots_counts_when_slots_is_off() -> None:
    answers = {
        "/slots": (501, {"error": {"message": "This server does not support slots endpoint."}}),
        "/props": (200, {"default_generation_settings": {}, "total_slots": 4}),
    }
    with LoopbackServer(_routes(answers)) as server:
        assert provider_slots(server.url + "/v1") == SlotCount(4, settled=True, source="/props")
        assert [r.path for r in server.requests] == ["/slots", "/props"]


def test_a_provider_loading_its_model_has_not_said_yet() -> None:
    loading = (503, {"error": {"code": 503, "message": "Loading model"}})
    with LoopbackServer(_routes({"/slots": loading, "/props": loading})) as server:
        assert provider_slots(server.url + "/v1") == SlotCount(None, settled=False)


def test_a_provider_with_no_slot_endpoint_is_a_settled_unknown() -> None:
    with LoopbackServer(_routes({"/v1/models": (200, {"data": []})})) as server:
        assert provider_slots(server.url + "/v1") == SlotCount(None, settled=True)


def test_nothing_listening_is_not_an_answer() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert provider_slots(f"http://127.0.0.1:{port}/v1") == SlotCount(None, settled=False)


@pytest.mark.parametrize(
    ("listing", "slots"),
    [
        ([{"id": 0, "is_processing": False}, {"id": 1, "is_processing": True}], 2),
        ([], None),
        ([{"id": 0}], None),
        ({"slots": 2}, None),
        (None, None),
    ],
)
def test_a_slots_listing_counts_only_when_every_entry_is_a_slot(
    listing: object, slots: int | None
) -> None:
    assert slots_in_listing(listing) == slots


@pytest.mark.parametrize(
    ("props", "answer"),
    [
        ({"total_slots": 2}, (True, 2)),
        ({"default_generation_settings": {}}, (True, None)),
        ({"total_slots": 0}, (True, None)),
        ({"total_slots": True}, (True, None)),
        ({"total_slots": "2"}, (True, None)),
        ({"version": "1"}, (False, None)),
        ([], (False, None)),
    ],
)
def test_props_say_llama_cpp_and_a_positive_whole_slot_count(
    props: object, answer: tuple[bool, int | None]
) -> None:
    assert slots_in_props(props) == answer
