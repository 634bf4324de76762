"""The simulator's knobs: how many slots, how fast, how long a reply is.

``SimConfig`` is a frozen value, validated in its constructor (a NaN or
negative rate is a ``ValueError`` there, not a hang later). Safe to build and
share from any thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SimConfig"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated llama.cpp server behaves (docs/protocol.md, "The simulator").

    - ``slots``: requests decoded at once; the rest wait in a FIFO queue.
    - ``tokens_per_second``: decode rate of each slot.
    - ``prompt_ms``: time from taking a slot to the first token, whatever the
      prompt; a client that closed meanwhile is noticed when it has passed.
    - ``prompt_tokens_per_second``: None keeps ``prompt_ms``. Set, the prompt
      is processed instead at this rate (its size counted as
      ``count_prompt_tokens`` does), in batches of ``prompt_batch`` tokens,
      and a client that closed is noticed only between batches, as llama.cpp
      notices a cancelled task only between batches of ``n_batch`` tokens
      (docs/cancellation-limits.md).
    - ``prompt_batch``: tokens per prompt batch (llama.cpp's default ``n_batch``).
    - ``reply_tokens``: length of a generated reply (``max_tokens`` still caps it).
    - ``endless``: ignore ``reply_tokens``; decode up to the request's
      ``max_tokens``, or without end when it gives none.
    - ``model``: the id that ``/v1/models`` lists.
    - ``multibyte_every``: 0 keeps generated replies ASCII. N > 0 makes every
      Nth word of a generated reply multi-byte text, whose characters are
      several tokens each (a token per UTF-8 byte), so a stream carries fewer
      chunks than tokens, as llama.cpp's does for such text.
    """

    slots: int = 1
    tokens_per_second: float = 20.0
    prompt_ms: float = 300.0
    prompt_tokens_per_second: float | None = None
    prompt_batch: int = 2048
    reply_tokens: int = 48
    endless: bool = False
    model: str = "wirecut-sim"
    multibyte_every: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.slots, bool) or not isinstance(self.slots, int) or self.slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {self.slots!r}")
        if not _finite(self.tokens_per_second) or self.tokens_per_second <= 0:
            raise ValueError(
                f"tokens_per_second must be a finite number > 0, got {self.tokens_per_second!r}"
            )
        if not _finite(self.prompt_ms) or self.prompt_ms < 0:
            raise ValueError(f"prompt_ms must be a finite number >= 0, got {self.prompt_ms!r}")
        if self.prompt_tokens_per_second is not None and (
            not _finite(self.prompt_tokens_per_second) or self.prompt_tokens_per_second <= 0
        ):
            raise ValueError(
                "prompt_tokens_per_second must be None or a finite number > 0, "
                f"got {self.prompt_tokens_per_second!r}"
            )
        if (
            isinstance(self.prompt_batch, bool)
            or not isinstance(self.prompt_batch, int)
            or self.prompt_batch < 1
        ):
            raise ValueError(f"prompt_batch must be an int >= 1, got {self.prompt_batch!r}")
        if (
            isinstance(self.reply_tokens, bool)
            or not isinstance(self.reply_tokens, int)
            or self.reply_tokens < 0
        ):
            raise ValueError(f"reply_tokens must be an int >= 0, got {self.reply_tokens!r}")
        if not self.model:
            raise ValueError("model must be a non-empty string")
        if (
            isinstance(self.multibyte_every, bool)
            or not isinstance(self.multibyte_every, int)
            or self.multibyte_every < 0
        ):
            raise ValueError(f"multibyte_every must be an int >= 0, got {self.multibyte_every!r}")

    @property
    def token_interval(self) -> float:
        """Seconds between two tokens of one slot."""
        return 1.0 / self.tokens_per_second


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
