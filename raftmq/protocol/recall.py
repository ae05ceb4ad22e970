"""Recall handles of timer messages (RocketMQ 5's RecallMessageHandle.HandleV1).

A send of a timer message is answered with `recallHandle` (SendMessageResponseHeader);
RECALL_MESSAGE (370) hands it back to cancel the delivery. The handle names the topic,
the broker group holding the message, its due time and its UNIQ_KEY, so a client can
route the recall without asking anyone: URL-safe Base64 without padding (commons-codec's
encodeBase64URLSafeString) of "v1 <topic> <brokerName> <TIMER_OUT_MS + 1> <UNIQ_KEY>".
"""

from __future__ import annotations

import base64
import binascii

import attrs


def recall_handle(topic: str, broker_name: str, due_ms: int, uniq_key: str) -> str:
    """The handle of a timer message due at `due_ms` (its TIMER_OUT_MS)."""
    raw = f"v1 {topic} {broker_name} {due_ms + 1} {uniq_key}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@attrs.frozen
class RecallHandle:
    topic: str
    broker_name: str
    timestamp_ms: int  # TIMER_OUT_MS + 1
    uniq_key: str

    @classmethod
    def parse(cls, handle: str) -> RecallHandle:
        """ValueError for anything but a v1 handle (padded or not)."""
        try:
            raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4)).decode()
        except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"not Base64: {exc}") from None
        parts = raw.split(" ")
        if len(parts) != 5 or parts[0] != "v1" or not parts[3].isascii() or not parts[3].isdigit():
            raise ValueError("not a v1 handle")
        return cls(parts[1], parts[2], int(parts[3]), parts[4])
