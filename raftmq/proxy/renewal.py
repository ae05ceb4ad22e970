"""Receipt handles kept invisible while a PushConsumer works (`auto_renew` receives),
as Apache's proxy does (`DefaultReceiptHandleManager`).

The official clients never renew a handle themselves: a PushConsumer's receives ask
for `auto_renew`, get `default_invisible_ms` (60 s) of invisibility, and the proxy
extends it while the client is alive (it called within the last 30 s): every
`period_s`, each handle within `ahead_ms` of its expiry gets CHANGE_MESSAGE_INVISIBLETIME
for another `default_invisible_ms`, for at most `max_ms` (3 h) after it was received. An
ack,
a change of invisibility or a forward to the DLQ for that message (by client, group
and message id) uses the newest handle and ends the renewal; so does the client's
NotifyClientTermination, or the client falling silent. A renewal that fails is retried
at the next period and dropped once the handle has expired (the broker redelivers the
message then).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from raftmq.protocol.pop import ReceiptHandle

__all__ = ["Renewals"]

log = logging.getLogger(__name__)

# (client id, group, topic, message id)
Key = tuple[str, str, str, str]
Change = Callable[[str, str, ReceiptHandle, int], Awaitable[ReceiptHandle]]


@attrs.define
class _Held:
    handle: ReceiptHandle
    received_ms: int


class Renewals:
    def __init__(
        self,
        change: Change,
        *,
        alive: Callable[[str], bool] = lambda _client_id: True,
        default_invisible_ms: int = 60_000,
        ahead_ms: int = 10_000,
        period_s: float = 5.0,
        max_ms: int = 3 * 3600 * 1000,
    ) -> None:
        self._change = change  # (topic, group, handle, invisible_ms) -> the new handle
        self.alive = alive
        self.default_invisible_ms = default_invisible_ms
        self.ahead_ms = ahead_ms
        self.period_s = period_s
        self.max_ms = max_ms
        self._held: dict[Key, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: Key, handle: ReceiptHandle) -> None:
        """Renew `handle` from now on."""
        self._held[key] = _Held(handle, int(time.time() * 1000))

    def release(self, key: Key) -> ReceiptHandle | None:
        """Stop renewing; the newest handle, if it was held."""
        held = self._held.pop(key, None)
        return None if held is None else held.handle

    def release_client(self, client_id: str) -> None:
        for key in [key for key in self._held if key[0] == client_id]:
            del self._held[key]

    async def run(self) -> None:
        """Renew what is due every period, until cancelled."""
        while True:
            await trio.sleep(self.period_s)
            await self.renew_due()

    async def renew_due(self) -> None:
        now_ms = int(time.time() * 1000)
        for key, held in list(self._held.items()):
            handle = held.handle
            if handle.visible_at_ms - now_ms > self.ahead_ms:
                continue  # not due yet
            if now_ms - held.received_ms >= self.max_ms or handle.visible_at_ms <= now_ms:
                self._held.pop(key, None)  # held too long, or too late: the broker redelivers
                continue
            client_id, group, topic, _message_id = key
            if not self.alive(client_id):
                self._held.pop(key, None)  # the broker redelivers it to a live consumer
                continue
            try:
                renewed = await self._change(topic, group, handle, self.default_invisible_ms)
            except Exception as exc:  # noqa: BLE001 - any failure waits for the next period
                log.info("renewal of %s failed: %s", key, exc)
                continue
            if self._held.get(key) is held:  # not acked meanwhile
                held.handle = renewed
