"""The broker's access control with `aclEnable=true`: the file kept current, every
request checked, and the ACL requests (50-54) that change it through the log.

`AccessControl.guard(table)` wraps the processor table: each request is checked before
its processor runs, the inline send path included, and a refusal is answered
NO_PERMISSION (16) with the reason as remark, so nothing of a refused send is stored.
With `aclEnable=false` the table is not wrapped and nothing is checked.

The file is polled (mtime, size, inode) every second and reloaded when it changes; a
file that does not parse is logged and the last good one stays in force. Changes made
with `mqadmin updateAclConfig`, `deleteAccessConfig` and `updateGlobalWhiteAddr` go to
the master, which appends the whole resulting document to the replicated metadata log
(broker.store.metadata, op "acl"); every replica enforces it from the request after it
applied it and writes it to its own plain_acl.yml at its next poll, so all files end up
the same and a new master enforces what the old one was told. A replica restarted with
a file whose dataVersion counter is at least the replicated one's keeps its file (a
hand edit survives); otherwise the log wins.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import trio
import yaml
from raftmq.broker.acl.addresses import remote_host
from raftmq.broker.acl.plain import (
    PlainAcl,
    account_configs,
    normal_document,
    version_of,
    with_account,
    with_global_white,
    without_account,
)
from raftmq.broker.headers import boolean, json_body, text

from raftmq.remoting import (
    Connection,
    Dispatcher,
    ProcessorTable,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)

if TYPE_CHECKING:
    from raftmq.broker.config import BrokerConfig
    from raftmq.broker.metawriter import MetaWriter
    from raftmq.broker.role import BrokerRole
    from raftmq.broker.store.metadata import Metadata

log = logging.getLogger(__name__)

POLL_S = 1.0
# RocketMQ 4.9's answers to a failed ACL change (5.x reused the numbers: not in codes.py).
UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
DELETE_ACL_CONFIG_FAILED = 210
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211


class AclFileError(ValueError):
    """plain_acl.yml cannot be read as an ACL document (named, with the reason)."""


def read_document(path: Path) -> dict:
    """The file as a normal document; {} when it is missing or empty. AclFileError naming
    the file when it is not YAML or not an ACL document."""
    try:
        doc = normal_document(yaml.safe_load(path.read_bytes()))
        PlainAcl(doc)
    except (yaml.YAMLError, ValueError) as exc:
        raise AclFileError(f"{path}: {exc}") from None
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise AclFileError(f"{path}: {exc.strerror or exc}") from None
    return doc


def write_document(path: Path, doc: dict) -> None:
    """Replace the file with `doc` (block YAML, as RocketMQ writes it), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w") as out:
        yaml.safe_dump(doc, out, sort_keys=False, default_flow_style=False)
        out.flush()
        os.fsync(out.fileno())
    temporary.replace(path)


def _stamp(path: Path) -> tuple | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return (stat.st_mtime_ns, stat.st_size, stat.st_ino)


def _split(value: str | None) -> list[str] | None:
    """A comma-separated header field (`UtilAll.split`) as a list; None when absent."""
    if value is None:
        return None
    return [item.strip() for item in value.split(",") if item.strip()]


class AccessControl:
    """One broker's ACL: the document in force (`document`, checked as `acl`), kept in
    step with its file and with the replicated log by `run`."""

    def __init__(
        self,
        config: BrokerConfig,
        metadata: Metadata,
        meta: MetaWriter,
        role: BrokerRole,
    ) -> None:
        assert config.acl_file_path is not None, "load_broker_config refuses that"
        self.config = config
        self.path = Path(config.acl_file_path)
        self.metadata = metadata
        self.meta = meta
        self.role = role
        self._changing = trio.Lock()  # one change at a time, each on the latest document
        self._syncing = trio.Lock()  # one writer of the file at a time
        self.document = read_document(self.path)  # a bad file stops the broker here
        replicated = metadata.acl
        if replicated is not None and (
            version_of(self.document)["counter"] < version_of(replicated)["counter"]
        ):
            write_document(self.path, replicated)  # at start, before anything is served
            self.document = replicated
        self._synced_offset = metadata.acl_meta_offset  # the record the file holds
        self._enforced_offset = metadata.acl_meta_offset  # the record the checks hold
        self._stamp = _stamp(self.path)
        self.acl = PlainAcl(self.document)
        if not self.path.exists():
            log.warning("aclEnable=true but %s does not exist: every request is refused "
                        "until it does", self.path)  # fmt: skip

    # ------------------------------------------------------------------ the file
    async def _write(self, doc: dict) -> None:
        await trio.to_thread.run_sync(write_document, self.path, doc)  # it fsyncs
        self.document = doc
        self._stamp = _stamp(self.path)

    async def sync(self) -> None:
        """Bring the file and the checks up to date: the replicated document if a newer
        one was applied, else the file if it changed on disk."""
        async with self._syncing:
            await self._sync()

    async def _sync(self) -> None:
        # both read before the write, during which the next record may be applied
        offset, replicated = self.metadata.acl_meta_offset, self.metadata.acl
        if offset != self._synced_offset and replicated is not None:
            try:
                await self._write(replicated)
            except OSError as exc:  # tried again at the next poll (the checks have it already)
                log.error("%s: cannot write the replicated ACL: %s", self.path, exc)
                return
            self._synced_offset = offset
            if offset >= self._enforced_offset:  # else `refusal` took a newer one meanwhile
                self._enforced_offset = offset
                self.acl = PlainAcl(replicated)
            log.info("%s: replicated ACL written (dataVersion %s)", self.path,
                     version_of(replicated)["counter"])  # fmt: skip
            return
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            doc = read_document(self.path)
        except AclFileError as exc:
            log.error("ACL file not reloaded, the previous one stays in force: %s", exc)
            return
        self.document, self.acl = doc, PlainAcl(doc)
        log.info("%s reloaded: %d accounts", self.path, len(self.acl.accounts))

    async def run(self) -> None:
        while True:
            await trio.sleep(POLL_S)
            await self.sync()

    # ------------------------------------------------------------------ checking
    def refusal(self, request: RemotingCommand, connection: Connection) -> RemotingCommand | None:
        if self.metadata.acl_meta_offset != self._enforced_offset:
            # a replicated change applied since: in force at once, in the file at the poll
            self._enforced_offset = self.metadata.acl_meta_offset
            self.acl = PlainAcl(self.metadata.acl)
        remark = self.acl.refusal(request, remote_host(connection.remote_address))
        if remark is None:
            return None
        return request.make_response(ResponseCode.NO_PERMISSION, remark)

    def guard(self, table: ProcessorTable) -> Dispatcher:
        return _Guarded(self, table)

    # ------------------------------------------------------------------ requests 50-54
    CODES = (
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG,
        RequestCode.DELETE_ACL_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO,
        RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG,
        RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG,
    )

    def processors(self) -> dict:
        return {
            RequestCode.UPDATE_AND_CREATE_ACL_CONFIG: self.update_account,
            RequestCode.DELETE_ACL_CONFIG: self.delete_account,
            RequestCode.GET_BROKER_CLUSTER_ACL_INFO: self.version_info,
            RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG: self.update_global_white,
            RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG: self.all_config,
        }

    async def _change(self, request: RemotingCommand, failed_code: int, change):
        """Apply `change` (document -> document, or an error) on the master, through the
        log, and answer; the master enforces it before it answers."""
        if not self.role.is_master:
            return self.role.not_master(request)
        async with self._changing:
            await self.sync()  # a new master may not have written the last replicated one yet
            try:
                doc = change(self.document)
            except (ValueError, KeyError) as exc:
                return request.make_response(failed_code, str(exc).strip("'\""))
            await self.meta.write("acl", document=doc)
            await self.sync()
        return request.make_response(ResponseCode.SUCCESS)

    async def update_account(self, request: RemotingCommand, connection: Connection):
        ext = request.ext_fields
        fields = {
            "accessKey": text(request, "accessKey"),
            "secretKey": ext.get("secretKey"),
            "whiteRemoteAddress": ext.get("whiteRemoteAddress"),
            "admin": boolean(request, "admin"),
            "defaultTopicPerm": ext.get("defaultTopicPerm"),
            "defaultGroupPerm": ext.get("defaultGroupPerm"),
            "topicPerms": _split(ext.get("topicPerms")),
            "groupPerms": _split(ext.get("groupPerms")),
        }
        return await self._change(
            request, UPDATE_AND_CREATE_ACL_CONFIG_FAILED, lambda doc: with_account(doc, fields)
        )

    async def delete_account(self, request: RemotingCommand, connection: Connection):
        access_key = text(request, "accessKey")

        def change(doc: dict) -> dict:
            try:
                return without_account(doc, access_key)
            except KeyError:
                raise KeyError(f"The accesskey[{access_key}] does not exist") from None

        return await self._change(request, DELETE_ACL_CONFIG_FAILED, change)

    async def update_global_white(self, request: RemotingCommand, connection: Connection):
        patterns = _split(text(request, "globalWhiteAddrs")) or []
        path = request.ext_fields.get("aclFileFullPath")
        if path and Path(path) != self.path:
            return request.make_response(
                UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED,
                f"aclFileFullPath {path}: this broker has one ACL file, {self.path}",
            )
        return await self._change(
            request,
            UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED,
            lambda doc: with_global_white(doc, patterns),
        )

    async def version_info(self, request: RemotingCommand, connection: Connection):
        """GetBrokerAclConfigResponseHeader: the file's dataVersion, by path too."""
        version = {**version_of(self.document), "stateVersion": 0}
        config = self.config
        ext = {
            "version": json.dumps(version, separators=(",", ":")),
            "allAclFileVersion": json.dumps({str(self.path): version}, separators=(",", ":")),
            "brokerName": config.broker_name,
            "brokerAddr": f"{config.broker_ip1}:{config.listen_port}",
            "clusterName": config.broker_cluster_name,
        }
        return request.make_response(ResponseCode.SUCCESS, ext_fields=ext)

    async def all_config(self, request: RemotingCommand, connection: Connection):
        """GetBrokerClusterAclConfigResponseBody (secret keys included: admin only)."""
        doc = self.document
        body = {
            "globalWhiteAddrs": doc.get("globalWhiteRemoteAddresses") or [],
            "plainAccessConfigs": account_configs(doc),
        }
        return request.make_response(ResponseCode.SUCCESS, body=json_body(body))


class _Guarded:
    """A processor table behind the ACL check (a remoting Dispatcher)."""

    raw_fields = None  # the check reads a request's signature fields: no raw requests

    def __init__(self, access: AccessControl, table: ProcessorTable) -> None:
        self.access = access
        self.table = table

    def inline(
        self, requests: list[RemotingCommand], connection: Connection
    ) -> list[RemotingCommand]:
        admitted, inline_codes = [], self.table.inline_codes
        left = []
        refusals = []
        for request in requests:
            if request.code not in inline_codes:
                left.append(request)  # checked by __call__
                continue
            refused = self.access.refusal(request, connection)
            if refused is None:
                admitted.append(request)
            else:
                refusals.append((request, refused))
        # what the table leaves of those goes through __call__, and is checked again
        if admitted:
            left += self.table.inline(admitted, connection)
        # answered only now: should anything above raise, no request has been taken
        for request, refused in refusals:
            connection.respond(request, refused)
        return left

    async def __call__(
        self, request: RemotingCommand, connection: Connection
    ) -> RemotingCommand | None:
        refused = self.access.refusal(request, connection)
        if refused is not None:
            return refused
        return await self.table(request, connection)
