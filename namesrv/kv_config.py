"""`KVConfigManager`: the name server's key/value settings, by namespace (RocketMQ's).

Operators write them with `mqadmin updateKvConfig`/`deleteKvConfig`; the one namespace
RocketMQ itself reads is ORDER_TOPIC_CONFIG (`mqadmin updateOrderConf`): a topic's
"brokerName:queues;..." that the route carries as `orderTopicConf` when the name
server's `orderMessageEnable` is true, and that every broker registration is answered
with.

With `kvConfigPath` set the table is kept in that file, in Java's format
(KVConfigSerializeWrapper: `{"configTable": {namespace: {key: value}}}`), written to a
temporary file and renamed over the old one after every change, so a name server
restarted (or a Java one pointed at the file) keeps them; without it they last as long
as the process.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["ORDER_TOPIC_CONFIG", "KVConfigManager"]

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG


class KVConfigManager:
    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path) if path else None
        self.table: dict[str, dict[str, str]] = {}
        if self.path is not None and self.path.exists():
            self.table = self._read(self.path)

    @staticmethod
    def _read(path: Path) -> dict[str, dict[str, str]]:
        """The file's table; ValueError naming the file when it is not Java's format."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            table = doc.get("configTable") or {}
            return {str(ns): {str(k): str(v) for k, v in kv.items()} for ns, kv in table.items()}
        except (OSError, UnicodeDecodeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: not a kvConfig.json: {exc}") from None

    def _persist(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps({"configTable": self.table}, indent=4), encoding="utf-8")
        os.replace(temporary, self.path)

    def put(self, namespace: str, key: str, value: str) -> None:
        self.table.setdefault(namespace, {})[key] = value
        self._persist()

    def delete(self, namespace: str, key: str) -> None:
        entries = self.table.get(namespace)
        if entries is None or entries.pop(key, None) is None:
            return
        if not entries:
            del self.table[namespace]
        self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self.table.get(namespace, {}).get(key)

    def namespace(self, namespace: str) -> dict[str, str]:
        return dict(self.table.get(namespace, {}))
