"""RocketMQ 4.x ACL request signatures (`AclClientRPCHook`, `AclUtils`, `AclSigner`).

A client with credentials adds `AccessKey` (and `SecurityToken`, when it has one) to a
request's ext fields, then `Signature`: HmacSHA1, keyed with the secret key's UTF-8
bytes, over the values of every ext field except `Signature`, sorted by field name and
concatenated (UTF-8), followed by the body; base64. The broker recomputes it from what
arrived (broker.acl). The secret never travels; the signature does not cover the
request code, the opaque or the remark, so it proves who sent the fields and the body,
not that the request is fresh (RocketMQ has no nonce or timestamp either).

The `ali-ons` npm client signs the same way, with an `OnsChannel` field it also sends.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import attrs

from raftmq.remoting.codec import java_string
from raftmq.remoting.command import RemotingCommand

__all__ = [
    "ACCESS_KEY",
    "SECURITY_TOKEN",
    "SIGNATURE",
    "SessionCredentials",
    "Signer",
    "content_to_sign",
    "sign",
    "signature",
]

ACCESS_KEY = "AccessKey"  # SessionCredentials.ACCESS_KEY
SECURITY_TOKEN = "SecurityToken"
SIGNATURE = "Signature"


@attrs.frozen(repr=False)
class SessionCredentials:
    """An account of the broker's `plain_acl.yml`: what a client signs with."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    def __repr__(self) -> str:  # never the secret in a log line
        return f"SessionCredentials(access_key={self.access_key!r})"


def content_to_sign(ext_fields: dict[str, str], body: bytes, skip: str | None = None) -> bytes:
    """The bytes a signature covers: values sorted by field name, `Signature` (and
    `skip`) left out, then the body. Field names are ASCII, so Python's order is Java's
    TreeMap order."""
    values = [ext_fields[name] for name in sorted(ext_fields) if name != SIGNATURE and name != skip]
    try:
        text = "".join(values)  # what a broker decoded: strings only
    except TypeError:  # a client's own request: ints and bools, spelt as Java spells them
        text = "".join(java_string(value) or "" for value in values)
    return text.encode("utf-8", "replace") + body


class Signer:
    """`AclSigner.calSignature` with one secret key: base64 of HmacSHA1(key, content).
    The keyed HMAC is prepared once and copied per call (a broker keeps one per
    account)."""

    __slots__ = ("_mac",)

    def __init__(self, secret_key: str) -> None:
        self._mac = hmac.new(secret_key.encode("utf-8"), digestmod=hashlib.sha1)

    def __call__(self, content: bytes) -> str:
        mac = self._mac.copy()
        mac.update(content)
        return base64.b64encode(mac.digest()).decode("ascii")


def signature(content: bytes, secret_key: str) -> str:
    """`AclSigner.calSignature(content, secretKey)`."""
    return Signer(secret_key)(content)


def sign(request: RemotingCommand, credentials: SessionCredentials) -> None:
    """`AclClientRPCHook.doBeforeRequest`: add AccessKey, SecurityToken and Signature."""
    ext = request.ext_fields
    ext[ACCESS_KEY] = credentials.access_key
    if credentials.security_token is not None:
        ext[SECURITY_TOKEN] = credentials.security_token
    ext[SIGNATURE] = signature(content_to_sign(ext, request.body), credentials.secret_key)
