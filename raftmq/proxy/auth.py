"""MQv2-HMAC-SHA1: the `authorization` header of RocketMQ 5's gRPC clients, checked
against the brokers' plain_acl.yml accounts (raftmq.broker.acl, the same check the
brokers make of remoting signatures).

    authorization: MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time, Signature=<hex>

The signature is HMAC-SHA1 keyed by the secret key over the exact x-mq-date-time value,
in hex; it is compared as raw digest bytes (hex case does not matter), as Apache's
`DefaultAuthenticationHandler` does. Only the date header is signed, not the body,
so a captured request can be replayed: use TLS where that matters.
"""

from __future__ import annotations

import base64
import binascii

import yaml

from raftmq.broker.acl.plain import PlainAcl

__all__ = ["AUTHORIZATION", "DATE_TIME", "Authenticator", "parse_authorization"]

AUTHORIZATION = "authorization"
DATE_TIME = "x-mq-date-time"
ALGORITHM = "MQv2-HMAC-SHA1"


def parse_authorization(value: str) -> tuple[str, str]:
    """(access key, base64 signature) of an authorization header; ValueError why not.
    The credential is read up to its first '/' (some SDKs append a scope)."""
    algorithm, _, rest = value.partition(" ")
    if algorithm != ALGORITHM:
        raise ValueError(f"authorization: algorithm {algorithm!r} is not {ALGORITHM}")
    items = {}
    for item in rest.split(","):
        name, _, text = item.strip().partition("=")
        items[name] = text
    access_key = items.get("Credential", "").split("/", 1)[0]
    if not access_key:
        raise ValueError("authorization: no Credential (access key)")
    try:
        digest = binascii.unhexlify(items.get("Signature", ""))
    except binascii.Error:
        raise ValueError("authorization: Signature is not hex") from None
    if not digest:
        raise ValueError("authorization: no Signature")
    return access_key, base64.b64encode(digest).decode("ascii")


class Authenticator:
    """The accounts of one plain_acl.yml, read at start."""

    def __init__(self, acl_path: str) -> None:
        try:
            with open(acl_path, encoding="utf-8") as f:
                doc = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"aclFile {acl_path}: {exc}") from None
        try:
            self.acl = PlainAcl(doc)
        except ValueError as exc:
            raise ValueError(f"aclFile {acl_path}: {exc}") from None

    def refusal(self, metadata: dict[str, str], host: str) -> str | None:
        """Why a call with `metadata` from `host` is refused (UNAUTHORIZED); None if not."""
        value = metadata.get(AUTHORIZATION)
        if value is None:
            return "username cannot be null: the call carries no authorization header"
        date_time = metadata.get(DATE_TIME)
        if date_time is None:
            return f"the call carries authorization but no {DATE_TIME} header"
        try:
            access_key, signature = parse_authorization(value)
        except ValueError as exc:
            return str(exc)
        return self.acl.signature_refusal(access_key, date_time.encode(), signature, host)
