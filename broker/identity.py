"""A controller-mode broker's identity files (RocketMQ 5.1.1+'s `BrokerMetadata` and
`TempBrokerMetadata`, `storePathBrokerIdentity`): the brokerId the controller gave it.

`<file>-temp` holds `cluster#brokerName#brokerId#registerCheckCode` while the id is
being applied for (a retry after a lost answer applies with the same check code, which
the controller takes as the same broker); `<file>` holds `cluster#brokerName#brokerId`
once it is granted, and a broker that has it skips the steps that assign one.

RocketMQ writes these in place (the old content copied to `.bak`) without fsync, so a
crash can leave a torn or empty file; here each write is atomic and durable (temp file,
fsync, rename, fsync of the directory: `atomic_write`), and the granted id is on disk
before the temp file goes.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from raftmq.disk.filesystem import atomic_write, fsync_dir

IDENTITY_FILE = "brokerIdentity"  # storePathBrokerIdentity's default name in storePathRootDir
TEMP_SUFFIX = "-temp"


class IdentityMismatch(ValueError):
    """The identity file names another cluster or group than the config does, or does
    not parse (edited by hand: these writes are atomic)."""


@attrs.frozen
class Identity:
    cluster: str
    broker_name: str
    broker_id: int
    check_code: str | None = None  # only while applying (the temp file)

    def encode(self) -> bytes:
        fields = [self.cluster, self.broker_name, str(self.broker_id)]
        return "#".join(fields + ([self.check_code] if self.check_code else [])).encode()

    @classmethod
    def decode(cls, text: str) -> Identity:
        parts = text.strip().split("#", 3)
        if len(parts) < 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"not cluster#brokerName#brokerId[#checkCode]: {text.strip()!r}")
        return cls(parts[0], parts[1], int(parts[2]), parts[3] if len(parts) == 4 else None)


class IdentityFiles:
    def __init__(self, path: Path, cluster: str, broker_name: str) -> None:
        self.path = path
        self.temp = path.with_name(path.name + TEMP_SUFFIX)
        self.cluster, self.broker_name = cluster, broker_name

    def _read(self, path: Path) -> Identity | None:
        if not path.exists():
            return None
        try:
            identity = Identity.decode(path.read_text())
        except ValueError as exc:
            raise IdentityMismatch(f"{path}: {exc}") from None
        if (identity.cluster, identity.broker_name) != (self.cluster, self.broker_name):
            raise IdentityMismatch(
                f"{path} is {identity.cluster}/{identity.broker_name}'s, and this broker is"
                f" {self.cluster}/{self.broker_name}: fix the config or remove the file"
            )
        return identity

    def granted(self) -> int | None:
        """The brokerId the controller gave this broker, if it has one."""
        identity = self._read(self.path)
        return None if identity is None else identity.broker_id

    def applying(self) -> Identity | None:
        """The id being applied for (with its check code), if a start was cut short."""
        return self._read(self.temp)

    def apply(self, broker_id: int, check_code: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        identity = Identity(self.cluster, self.broker_name, broker_id, check_code)
        atomic_write(self.temp, identity.encode())

    def refused(self) -> None:
        self.temp.unlink(missing_ok=True)
        fsync_dir(self.temp.parent)

    def grant(self, broker_id: int) -> None:
        atomic_write(self.path, Identity(self.cluster, self.broker_name, broker_id).encode())
        self.refused()
