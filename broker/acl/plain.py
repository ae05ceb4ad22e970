"""`plain_acl.yml`: the document, its accounts, and the check of one request against
them (RocketMQ's `PlainPermissionManager.validate`).

The document is RocketMQ's: `globalWhiteRemoteAddresses` (patterns, broker.acl.
addresses), `accounts` (accessKey, secretKey, whiteRemoteAddress, admin,
defaultTopicPerm, defaultGroupPerm, topicPerms, groupPerms) and `dataVersion`
([{counter, timestamp}], bumped by every change made through mqadmin). The changes
`mqadmin` asks for are functions from one document to the next (`with_account`,
`without_account`, `with_global_white`), so the master can put the whole result in the
replicated log and every replica writes the same file.

The check, in RocketMQ's order: a globally white address passes; otherwise the request
must name a known AccessKey; its signature must match unless the account's
whiteRemoteAddress admits the address; admin-only codes need `admin: true`; every
topic and group the request touches needs its permission (broker.acl.permissions).
Unlike RocketMQ, an account's white address spares only the signature: the account's
permissions still apply (RocketMQ lets such a request through unchecked).
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Callable

import attrs
from raftmq.broker.acl.addresses import address_matcher
from raftmq.broker.acl.permissions import (
    ADMIN_CODES,
    PUB,
    TRACE_TOPIC,
    check_permission,
    describe,
    needed_resources,
    parse_perm,
    parse_resource_perms,
    perm_name,
)
from raftmq.broker.store.metadata import RETRY_PREFIX

from raftmq.remoting import RemotingCommand
from raftmq.remoting.signing import ACCESS_KEY, SIGNATURE, Signer, content_to_sign

KEY_MIN_LENGTH = 6  # AclConstants: an accessKey or secretKey must be longer than this
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"  # MixAll.UNIQUE_MSG_QUERY_FLAG
_HOST_CACHE_LIMIT = 4096  # white-list answers remembered per loaded document

ACCOUNT_FIELDS = (
    "accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm",
    "defaultGroupPerm", "topicPerms", "groupPerms",
)  # fmt: skip


def _text(value) -> str | None:
    """A scalar as Java reads it into a String field (`secretKey: 12345678` is a YAML int)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check_keys(access_key: str | None, secret_key: str | None) -> None:
    """`checkPlainAccessConfig`: both present and longer than 6 characters."""
    if (
        access_key is None
        or secret_key is None
        or len(access_key) <= KEY_MIN_LENGTH
        or len(secret_key) <= KEY_MIN_LENGTH
    ):
        raise ValueError(
            f"accessKey={access_key!r}: the accessKey and secretKey must be given and "
            f"longer than {KEY_MIN_LENGTH} characters"
        )


@attrs.frozen
class Account:
    access_key: str
    signer: Signer
    white: Callable[[str], bool]
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    perms: dict[str, int]  # topic or %RETRY%group -> permission

    @classmethod
    def parse(cls, entry) -> Account:
        if not isinstance(entry, dict):
            raise ValueError(f"accounts: expected a mapping, not {entry!r}")
        access_key, secret_key = _text(entry.get("accessKey")), _text(entry.get("secretKey"))
        check_keys(access_key, secret_key)
        try:
            return cls(
                access_key,
                Signer(secret_key),
                address_matcher(_text(entry.get("whiteRemoteAddress"))),
                _text(entry.get("admin")) == "true",
                parse_perm(_text(entry.get("defaultTopicPerm")), "defaultTopicPerm"),
                parse_perm(_text(entry.get("defaultGroupPerm")), "defaultGroupPerm"),
                {
                    **parse_resource_perms(entry.get("groupPerms"), is_topic=False),
                    **parse_resource_perms(entry.get("topicPerms"), is_topic=True),
                },
            )
        except ValueError as exc:
            raise ValueError(f"account {access_key}: {exc}") from None


def _white_list(doc: dict) -> list[str]:
    value = doc.get("globalWhiteRemoteAddresses") or []
    if not isinstance(value, list):
        raise ValueError(f"globalWhiteRemoteAddresses: expected a list, not {value!r}")
    return [_text(v) for v in value if v is not None]


class PlainAcl:
    """One loaded document, ready to check requests. Raises ValueError (naming the
    account or pattern) for a document RocketMQ would also refuse, and for a
    permission it would quietly read as DENY."""

    def __init__(self, doc: dict) -> None:
        accounts = doc.get("accounts") or []
        if not isinstance(accounts, list):
            raise ValueError(f"accounts: expected a list, not {accounts!r}")
        self.accounts: dict[str, Account] = {}
        for entry in accounts:
            account = Account.parse(entry)
            if account.access_key in self.accounts:
                raise ValueError(f"accessKey {account.access_key} is defined twice")
            self.accounts[account.access_key] = account
        self._global_white = [address_matcher(p) for p in _white_list(doc)]
        self._white_hosts: dict[tuple[str | None, str], bool] = {}

    def _white(self, account: Account | None, host: str) -> bool:
        """Whether `host` is globally white (account None) or white for `account`."""
        key = (None if account is None else account.access_key, host)
        known = self._white_hosts.get(key)
        if known is None:
            if len(self._white_hosts) >= _HOST_CACHE_LIMIT:
                self._white_hosts.clear()
            matchers = self._global_white if account is None else (account.white,)
            known = self._white_hosts[key] = any(match(host) for match in matchers)
        return known

    def refusal(self, request: RemotingCommand, host: str) -> str | None:
        """Why `request` from `host` is refused, naming the account, resource and
        permission; None when it may go on."""
        if self._global_white and self._white(None, host):
            return None
        ext = request.ext_fields
        access_key = ext.get(ACCESS_KEY)
        code = request.code
        if access_key is None:
            return f"No accessKey is configured: request code {code} from {host} is not signed"
        account = self.accounts.get(access_key)
        if account is None:
            return f"No acl config for accessKey={access_key}"
        if not self._white(account, host) and not _signed(account, request):
            return f"Check signature failed for accessKey={access_key} (wrong secretKey?)"
        if code in ADMIN_CODES and not account.admin:
            return (
                f"Need admin permission for request code={code}, but accessKey={access_key} is not"
            )
        try:
            needed = needed_resources(request)
        except ValueError as exc:
            return f"accessKey={access_key}, request code {code}: {exc}"
        if not needed or (account.admin and not account.perms):
            return None
        for resource, perm in needed.items():
            if resource == TRACE_TOPIC and perm == PUB:
                continue
            owned = account.perms.get(resource)
            if owned is None:
                is_group = resource.startswith(RETRY_PREFIX)
                owned = account.default_group_perm if is_group else account.default_topic_perm
            if not check_permission(perm, owned):
                return (
                    f"accessKey={access_key} has no {perm_name(perm)} permission on "
                    f"{describe(resource)} (has {perm_name(owned)}; request code {code})"
                )
        return None

    def signature_refusal(self, access_key: str, content: bytes, signature: str, host: str):
        """Why a call signed by `access_key` over `content` with `signature` (base64 of
        the HMAC-SHA1) from `host` is refused; None when the account exists and the
        signature is its own. RocketMQ 5's gRPC clients sign their x-mq-date-time
        header this way (MQv2-HMAC-SHA1) with the same accounts' secret keys."""
        if self._global_white and self._white(None, host):
            return None
        account = self.accounts.get(access_key)
        if account is None:
            return f"No acl config for accessKey={access_key}"
        if self._white(account, host) or hmac.compare_digest(account.signer(content), signature):
            return None
        return f"Check signature failed for accessKey={access_key} (wrong secretKey?)"


def _signed(account: Account, request: RemotingCommand) -> bool:
    """Whether the request's Signature is the account's. Java's client signs
    `_UNIQUE_KEY_QUERY` too, but RocketMQ's broker leaves it out (so a query by unique
    key under ACL fails there); either form is accepted here."""
    given = request.ext_fields.get(SIGNATURE)
    if given is None:
        return False
    ext, body = request.ext_fields, request.body
    if hmac.compare_digest(account.signer(content_to_sign(ext, body)), given):
        return True
    return UNIQUE_KEY_QUERY in ext and hmac.compare_digest(
        account.signer(content_to_sign(ext, body, skip=UNIQUE_KEY_QUERY)), given
    )


# ---------------------------------------------------------------------------- changes


def normal_document(doc) -> dict:
    """`doc` (as YAML loaded it; None for an empty file) with JSON's types only, so it
    can travel in a metadata record and compare equal after a round trip."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ValueError(f"expected a mapping at the top, not {type(doc).__name__}")
    return json.loads(json.dumps(doc, default=str))


def version_of(doc: dict) -> dict:
    """The document's dataVersion as {counter, timestamp} (zeros when it has none)."""
    versions = doc.get("dataVersion")
    first = versions[0] if isinstance(versions, list) and versions else {}
    first = first if isinstance(first, dict) else {}
    try:
        counter, timestamp = int(first.get("counter", 0)), int(first.get("timestamp", 0))
    except (TypeError, ValueError):
        return {"counter": 0, "timestamp": 0}
    return {"counter": counter, "timestamp": timestamp}


def _next_version(doc: dict) -> dict:
    """`doc` with its dataVersion moved on (`updateAclConfigFileVersion`)."""
    counter = version_of(doc)["counter"] + 1
    return {**doc, "dataVersion": [{"counter": counter, "timestamp": int(time.time() * 1000)}]}


def with_account(doc: dict, fields: dict) -> dict:
    """`doc` with the account of `fields["accessKey"]` created or updated
    (`createAclAccessConfigMap`): given fields replace the stored ones; an existing
    account keeps its secretKey when none is given. ValueError for bad values."""
    access_key = fields["accessKey"]
    accounts = [dict(a) for a in doc.get("accounts") or [] if isinstance(a, dict)]
    current = next((a for a in accounts if _text(a.get("accessKey")) == access_key), None)
    merged = dict(current or {})
    merged.update({k: v for k, v in fields.items() if v is not None and v != ""})
    check_keys(access_key, _text(merged.get("secretKey")))
    Account.parse(merged)  # every value checked before it can reach the log
    if current is None:
        accounts.append(merged)
    else:
        accounts[accounts.index(current)] = merged
    return _next_version({**doc, "accounts": accounts})


def without_account(doc: dict, access_key: str) -> dict:
    """`doc` without the account; KeyError when there is none."""
    accounts = [a for a in doc.get("accounts") or [] if isinstance(a, dict)]
    kept = [a for a in accounts if _text(a.get("accessKey")) != access_key]
    if len(kept) == len(accounts):
        raise KeyError(access_key)
    return _next_version({**doc, "accounts": kept})


def with_global_white(doc: dict, patterns: list[str]) -> dict:
    """`doc` with globalWhiteRemoteAddresses replaced; ValueError for a bad pattern."""
    for pattern in patterns:
        address_matcher(pattern)
    return _next_version({**doc, "globalWhiteRemoteAddresses": list(patterns)})


def account_configs(doc: dict) -> list[dict]:
    """Every account as GET_BROKER_CLUSTER_ACL_CONFIG's PlainAccessConfig."""
    configs = []
    for entry in doc.get("accounts") or []:
        if isinstance(entry, dict):
            config = {name: entry.get(name) for name in ACCOUNT_FIELDS}
            config["accessKey"] = _text(config["accessKey"])
            config["secretKey"] = _text(config["secretKey"])
            config["admin"] = _text(config["admin"]) == "true"
            configs.append(config)
    return configs
