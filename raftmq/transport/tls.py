"""TLS for the remoting port and the DLedger peer port, as RocketMQ configures it.

RocketMQ reads these as system properties or from `tls.properties`
(`TlsSystemConfig`); raftmq reads them from broker.conf / namesrv.conf (and `-D` on the
command line), under the same names:

  tls.server.mode                disabled | permissive | enforcing
  tls.server.certPath            PEM certificate chain the server presents
  tls.server.keyPath             its PEM private key
  tls.server.keyPassword         the key's password, if it is encrypted
  tls.server.need.client.auth    none | optional | require
  tls.server.trustCertPath       PEM CAs a client certificate must chain to
  tls.enable                     connect to other servers (the name server) over TLS
  tls.client.certPath, tls.client.keyPath, tls.client.keyPassword
                                 the certificate a client presents, if the server asks
  tls.client.trustCertPath       PEM CAs the server's certificate must chain to
  tls.test.mode.enable           a client does not verify the server's certificate

Permissive accepts TLS and plain connections on one port: a TLS connection opens with a
handshake record, whose first byte is 0x16 (22), which no remoting frame begins with (a
frame starts with its 4-byte big-endian length, and no frame is 360 MB long), so the first
byte decides, as in RocketMQ's `TlsModeHandler`.

Where raftmq differs: RocketMQ's server defaults to permissive with a self-signed
certificate generated at start (`tls.test.mode.enable=true`); raftmq defaults to
disabled and needs a certificate and key for any other mode, and its client verifies
the server's certificate unless `tls.test.mode.enable=true`. Host names are not
checked on the remoting port (RocketMQ does not check them; brokers are addressed by
IP). DLedger peer links use `PeerTls`: mutual authentication, both ways.
"""

from __future__ import annotations

import socket
import ssl

import attrs
import trio

from raftmq.config.keys import Key, boolean, choice, file_path, text

__all__ = [
    "CLIENT_AUTH",
    "SERVER_MODES",
    "TLS_CLIENT_KEYS",
    "TLS_KEYS",
    "TLS_SECRET_KEYS",
    "TLS_SERVER_KEYS",
    "TLS_UNUSED_KEYS",
    "ClientTls",
    "PeerTls",
    "ServerTls",
    "starts_with_tls",
    "with_tls",
]

SERVER_MODES = ("disabled", "permissive", "enforcing")
CLIENT_AUTH = ("none", "optional", "require")
_TLS_HANDSHAKE_RECORD = 0x16
_VERIFY_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}


@attrs.frozen
class ServerTls:
    """A remoting server's TLS settings (the `tls.server.*` keys)."""

    mode: str = "disabled"
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = None
    need_client_auth: str = "none"
    trust_cert_path: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.mode not in SERVER_MODES:
            raise ValueError(f"tls.server.mode: expected one of {', '.join(SERVER_MODES)}")
        if self.need_client_auth not in CLIENT_AUTH:
            raise ValueError(
                f"tls.server.need.client.auth: expected one of {', '.join(CLIENT_AUTH)}"
            )
        if self.enabled and not (self.cert_path and self.key_path):
            raise ValueError(
                f"tls.server.mode={self.mode} needs tls.server.certPath and tls.server.keyPath"
            )
        if self.need_client_auth != "none" and not self.trust_cert_path:
            raise ValueError(
                f"tls.server.need.client.auth={self.need_client_auth} needs "
                "tls.server.trustCertPath"
            )

    @property
    def enabled(self) -> bool:
        return self.mode != "disabled"

    def context(self) -> ssl.SSLContext:
        """The server's context; raises OSError / ssl.SSLError for a bad file."""
        assert self.enabled, "no TLS context for a disabled server"
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_path, self.key_path, self.key_password)
        context.verify_mode = _VERIFY_MODES[self.need_client_auth]
        if self.trust_cert_path:
            context.load_verify_locations(self.trust_cert_path)
        return context


@attrs.frozen
class ClientTls:
    """A client's TLS settings (`tls.enable` and the `tls.client.*` keys)."""

    enable: bool = False
    cert_path: str | None = None
    key_path: str | None = None
    key_password: str | None = None
    trust_cert_path: str | None = None
    test_mode: bool = False  # tls.test.mode.enable: accept any server certificate

    def context(self) -> ssl.SSLContext:
        assert self.enable, "no TLS context for a client without tls.enable"
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.trust_cert_path)
        context.check_hostname = False
        if self.test_mode:
            context.verify_mode = ssl.CERT_NONE
        if self.cert_path:
            context.load_cert_chain(self.cert_path, self.key_path, self.key_password)
        return context


@attrs.frozen
class PeerTls:
    """Mutual TLS for DLedger peer links: every member presents `cert_path` and accepts
    only certificates that chain to `trust_cert_path`, on both ends of each link.

    With `check_host`, a member's certificate must also name the host its address in
    the peers list gives (an outgoing link checks the listener's; an incoming
    connection's is not checked by name: it is bound to a member by `tcp.py`).
    """

    cert_path: str
    key_path: str
    trust_cert_path: str
    check_host: bool = False

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.trust_cert_path)
        context.load_cert_chain(self.cert_path, self.key_path)
        context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.trust_cert_path)
        context.load_cert_chain(self.cert_path, self.key_path)
        context.check_hostname = self.check_host
        return context


# RocketMQ's names (TlsSystemConfig) for the fields of a config's `tls_server` (ServerTls)
# and `tls_client` (ClientTls); `with_tls` builds those two from what a KeyTable read.
TLS_SERVER_KEYS = tuple(
    Key(name, f"tls_server.{field}", parse)
    for name, field, parse in (
        ("tls.server.mode", "mode", choice(SERVER_MODES)),
        ("tls.server.certPath", "cert_path", file_path),
        ("tls.server.keyPath", "key_path", file_path),
        ("tls.server.keyPassword", "key_password", text),
        ("tls.server.need.client.auth", "need_client_auth", choice(CLIENT_AUTH)),
        ("tls.server.trustCertPath", "trust_cert_path", file_path),
    )
)
TLS_CLIENT_KEYS = tuple(
    Key(name, f"tls_client.{field}", parse)
    for name, field, parse in (
        ("tls.enable", "enable", boolean),
        ("tls.client.certPath", "cert_path", file_path),
        ("tls.client.keyPath", "key_path", file_path),
        ("tls.client.keyPassword", "key_password", text),
        ("tls.client.trustCertPath", "trust_cert_path", file_path),
        ("tls.test.mode.enable", "test_mode", boolean),
    )
)
TLS_KEYS = TLS_SERVER_KEYS + TLS_CLIENT_KEYS
TLS_SECRET_KEYS = frozenset({"tls.server.keyPassword", "tls.client.keyPassword"})
# Accepted and not used: raftmq's need.client.auth says whether a client certificate is
# checked, and its client always checks the server's unless in test mode.
TLS_UNUSED_KEYS = frozenset({"tls.server.authClient", "tls.client.authServer", "tls.config.file"})


_PARTS = {"tls_server": ServerTls, "tls_client": ClientTls}


def with_tls(
    fields: dict[str, object], parts: tuple[str, ...] = ("tls_server", "tls_client")
) -> dict[str, object]:
    """`fields` (attribute: value, as `KeyTable.read` returns them) with the `tls_server.*`
    and `tls_client.*` ones replaced by `tls_server` and `tls_client` (those of `parts`);
    ValueError when the server's settings cannot work."""
    given: dict[str, dict[str, object]] = {part: {} for part in parts}
    rest = {}
    for name, value in fields.items():
        owner, _, field = name.partition(".")
        if field:
            given[owner][field] = value
        else:
            rest[name] = value
    return {**rest, **{part: _PARTS[part](**values) for part, values in given.items()}}


async def starts_with_tls(stream: trio.SocketStream) -> bool:
    """True if the first byte waiting on `stream` opens a TLS handshake; the byte stays
    unread. False for a connection closed before sending anything."""
    first = await stream.socket.recv(1, socket.MSG_PEEK)
    return first[:1] == bytes([_TLS_HANDSHAKE_RECORD])
