"""The simulator's one tokenizer: its rule, llama.cpp's routes for it, and the counts it makes.

The claim a proxy relies on: ``usage`` is what ``/tokenize`` says of the same
text, for the relayed reply and for the prompt (``/apply-template``), on every
route, multi-byte text included; and a stream of multi-byte text carries
fewer chunks than tokens, as llama.cpp's does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from _sim import HELLO, sse_events
from wirecut.simulator import SimulatorServer
from wirecut.simulator._tokenizer import Tokenizer, UnknownToken, split
from wirecut.simulator._words import MULTIBYTE_WORDS, WORDS

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def _joined(pieces: list[str | bytes]) -> str:
    data = b"".join(p if isinstance(p, bytes) else p.encode() for p in pieces)
    return data.decode()


def tokenize(client: httpx.Client, sim: SimulatorServer, text: str, **flags: Any) -> list[Any]:
    resp = client.post(sim.url + "/tokenize", json={"content": text, **flags})
    assert resp.status_code == 200, resp.text
    tokens = resp.json()["tokens"]
    assert isinstance(tokens, list)
    return tokens


# -- the rule ---------------------------------------------------------------------


@given(st.text())
def test_split_joins_back_to_the_text(text: str) -> None:
    assert _joined(split(text)) == text


@given(st.text(alphabet=st.characters(max_codepoint=0x7F)).filter(lambda t: "<|" not in t))
def test_ascii_text_splits_as_scripted_replies_always_were(text: str) -> None:
    # Default behaviour unchanged: a scripted ASCII reply streams the same tokens as before.
    assert split(text) == re.findall(r"\s*\S+\s*|\s+", text)


@given(st.lists(st.sampled_from([*WORDS, *MULTIBYTE_WORDS]), max_size=30))
def test_a_generated_reply_splits_into_its_words_tokens(words: list[str]) -> None:
    # A reply is streamed word by word: the whole text must count the same.
    text = "".join(w + " " for w in words)
    assert split(text) == [token for w in words for token in split(w + " ")]


def test_each_non_ascii_character_is_a_token_per_utf8_byte() -> None:
    assert split("é🙂") == [b"\xc3", b"\xa9", b"\xf0", b"\x9f", b"\x99", b"\x82"]
    assert split("the slot 日 ") == ["the ", "slot ", b"\xe6", b"\x97", b"\xa5", " "]


def test_a_word_of_ascii_is_one_token_with_the_whitespace_around_it() -> None:
    # The rule scripted replies were always cut by: a run, however long, is one token.
    assert split("a" * 40 + " x") == ["a" * 40 + " ", "x"]
    assert split("  hi there\n\n") == ["  hi ", "there\n\n"]
    # Leading whitespace joins a word only at the start of the text.
    assert split("日 hi") == [b"\xe6", b"\x97", b"\xa5", " ", "hi"]


def test_special_tokens_are_one_token_only_when_parsed() -> None:
    assert split("<|im_start|>user\n") == ["<|im_start|>", "user\n"]
    assert split("<|im_start|>user\n", parse_special=False) == ["<|im_start|>user\n"]


def test_tokenizer_forgets_hashed_ids_beyond_what_it_remembers() -> None:
    tokenizer = Tokenizer(remember=2)
    first = tokenizer.tokenize("alpha")[0].id
    tokenizer.tokenize("beta gamma")
    with pytest.raises(UnknownToken) as caught:
        tokenizer.detokenize([first])
    assert caught.value.token == first
    # The simulator's own words and bytes are never forgotten.
    fixed = tokenizer.tokenize("slot é")
    assert tokenizer.detokenize([t.id for t in fixed]) == "slot é"


# -- llama.cpp's routes --------------------------------------------------------------


def test_tokenize_answers_with_llama_cpp_field_names(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    ids = tokenize(client, sim, "the slot á")
    pieces = tokenize(client, sim, "the slot á", with_pieces=True)
    assert all(isinstance(i, int) for i in ids)
    assert [p["id"] for p in pieces] == ids
    # As llama.cpp's README shows it for 'á': a byte that is no UTF-8 alone is a list.
    assert [p["piece"] for p in pieces] == ["the ", "slot ", [195], [161]]
    assert tokenize(client, sim, "", with_pieces=True) == []
    assert client.post(sim.url + "/tokenize", json={}).json() == {"tokens": []}


def test_tokenize_parses_special_tokens_unless_told_not_to(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    parsed = tokenize(client, sim, "<|im_end|>\n")
    plain = tokenize(client, sim, "<|im_end|>\n", parse_special=False)
    assert len(parsed) == 2
    assert len(plain) == 1
    assert parsed[0] != plain[0]


@pytest.mark.parametrize(
    "text", ["hello there, simulator", "日本 данные 🙂 and a-very-long-word-indeed"]
)
def test_detokenize_gives_back_what_tokenize_split(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, text: str
) -> None:
    sim = make_sim()
    ids = tokenize(client, sim, text)
    assert client.post(sim.url + "/detokenize", json={"tokens": ids}).json() == {"content": text}
    # A mixed content of text and ids, as llama.cpp's tokenize_mixed takes it.
    mixed = tokenize(client, sim, [text, *ids])  # type: ignore[arg-type]
    assert mixed == ids + ids


@pytest.mark.parametrize(
    ("path", "payload", "param"),
    [
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}, "with_pieces"),
        ("/tokenize", {"content": [1, 2**40]}, "content"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [2_000_000_000]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/apply-template", {}, "messages"),
        ("/apply-template", {"messages": [{"content": "no role"}]}, "messages[0].role"),
    ],
)
def test_bad_tokenizer_request_is_an_openai_400_naming_the_field(
    make_sim: Callable[..., SimulatorServer],
    client: httpx.Client,
    path: str,
    payload: dict[str, Any],
    param: str,
) -> None:
    sim = make_sim()
    resp = client.post(sim.url + path, json=payload)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert "\n" not in error["message"]


def test_apply_template_renders_chatml_with_the_assistants_turn(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim()
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}],
        },
    ]
    prompt = client.post(sim.url + "/apply-template", json={"messages": messages}).json()
    assert prompt == {
        "prompt": "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    }


def test_props_reports_total_slots_and_the_template(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(slots=3)
    props = client.get(sim.url + "/props").json()
    assert props["total_slots"] == 3
    assert "default_generation_settings" in props
    assert props["model_alias"] == "wirecut-sim"
    assert "<|im_start|>" in props["chat_template"]


# -- the counts agree --------------------------------------------------------------


def _prompt_tokens(client: httpx.Client, sim: SimulatorServer, messages: list[Any]) -> int:
    """What a proxy would count: the template of the messages, tokenized."""
    prompt = client.post(sim.url + "/apply-template", json={"messages": messages}).json()["prompt"]
    return len(tokenize(client, sim, prompt, add_special=True))


def test_prompt_usage_of_every_route_is_the_tokenized_template(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(reply_tokens=1)
    system, user = "be brief, 日本", "hello there 🙂"
    chat = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    expected = _prompt_tokens(client, sim, chat)
    reported = {
        "chat": client.post(sim.base_url + "/chat/completions", json={"messages": chat}).json()[
            "usage"
        ]["prompt_tokens"],
        "responses": client.post(
            sim.base_url + "/responses", json={"input": user, "instructions": system}
        ).json()["usage"]["input_tokens"],
        "messages": client.post(
            sim.base_url + "/messages",
            json={"system": system, "messages": [{"role": "user", "content": user}]},
        ).json()["usage"]["input_tokens"],
        "count_tokens": client.post(
            sim.base_url + "/messages/count_tokens",
            json={"system": system, "messages": [{"role": "user", "content": user}]},
        ).json()["input_tokens"],
    }
    assert reported == dict.fromkeys(reported, expected)
    # A text completion's prompt is the prompt itself, no template.
    text = client.post(sim.base_url + "/completions", json={"prompt": user}).json()
    assert text["usage"]["prompt_tokens"] == len(tokenize(client, sim, user)) == 6


def _relayed(sim: SimulatorServer, route: str) -> tuple[str, int, int]:
    """Stream from ``route`` with its official SDK: the text, the chunks that carried text,
    and the completion tokens the last event reported."""
    if route == "/v1/messages":
        with (
            anthropic.Anthropic(base_url=sim.url, api_key="sim", max_retries=0) as sdk,
            sdk.messages.stream(model="m", max_tokens=1000, messages=HELLO) as stream,
        ):
            deltas = [e.delta.text for e in stream if e.type == "content_block_delta"]  # type: ignore[union-attr]
            return "".join(deltas), len(deltas), stream.get_final_message().usage.output_tokens
    with openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0) as sdk:
        if route == "/v1/responses":
            with sdk.responses.stream(model="m", input="hello") as rstream:
                deltas = [e.delta for e in rstream if e.type == "response.output_text.delta"]
                usage = rstream.get_final_response().usage
            assert usage is not None
            return "".join(deltas), len(deltas), usage.output_tokens
        if route == "/v1/completions":
            chunks = list(sdk.completions.create(model="m", prompt="hello", stream=True))
            deltas = [c.choices[0].text for c in chunks if c.choices[0].text]
            last = chunks[-1].usage
        else:
            options: Any = {"include_usage": True}
            chunks_ = list(
                sdk.chat.completions.create(
                    model="m", messages=HELLO, stream=True, stream_options=options
                )
            )
            deltas = [c.choices[0].delta.content or "" for c in chunks_ if c.choices]
            deltas = [d for d in deltas if d]
            last = chunks_[-1].usage
    assert last is not None
    return "".join(deltas), len(deltas), last.completion_tokens


@pytest.mark.parametrize("route", ROUTES)
def test_completion_usage_of_every_route_is_the_tokenized_relayed_text(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, route: str
) -> None:
    sim = make_sim(multibyte_every=2, reply_tokens=30, tokens_per_second=2000.0)
    text, chunks, reported = _relayed(sim, route)
    assert reported == len(tokenize(client, sim, text)) >= 30
    # Multi-byte characters are several tokens and one chunk each.
    assert chunks < reported
    assert any(ord(c) > 0x7F for c in text)


@pytest.mark.parametrize("route", ROUTES)
def test_by_default_every_token_is_one_chunk_of_ascii(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, route: str
) -> None:
    sim = make_sim(reply_tokens=12, tokens_per_second=2000.0)
    text, chunks, reported = _relayed(sim, route)
    assert chunks == reported == len(tokenize(client, sim, text)) == 12
    assert text.isascii()


@pytest.mark.parametrize("reply_tokens", range(1, 9))
def test_a_generated_reply_never_ends_inside_a_character(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client, reply_tokens: int
) -> None:
    sim = make_sim(multibyte_every=1, reply_tokens=reply_tokens, tokens_per_second=5000.0)
    reply = client.post(sim.base_url + "/chat/completions", json={"messages": HELLO}).json()
    text = reply["choices"][0]["message"]["content"]
    assert "\ufffd" not in text
    assert reply["choices"][0]["finish_reason"] == "stop"
    # Whole characters: at most three continuation bytes past the length asked for.
    assert reply_tokens <= reply["usage"]["completion_tokens"] <= reply_tokens + 3
    assert reply["usage"]["completion_tokens"] == len(tokenize(client, sim, text))


def test_a_token_limit_inside_a_character_sends_none_of_its_bytes(
    make_sim: Callable[..., SimulatorServer], client: httpx.Client
) -> None:
    sim = make_sim(multibyte_every=1, tokens_per_second=5000.0)
    # Every word is multi-byte: one token is the first byte of its first character.
    body = {"messages": HELLO, "max_tokens": 1, "stream": True}
    with client.stream("POST", sim.base_url + "/chat/completions", json=body) as resp:
        events = sse_events(resp.iter_lines())
    chunks = [json.loads(data) for _, data in events if data != "[DONE]"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == ["length"]
    whole = client.post(sim.base_url + "/chat/completions", json={**body, "stream": False}).json()
    # Non-stream, the cut byte shows as U+FFFD, as llama.cpp's JSON replaces it.
    assert whole["choices"][0]["message"]["content"] == "\ufffd"
    assert whole["usage"]["completion_tokens"] == 1
