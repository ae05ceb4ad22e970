"""`mqbroker -c broker.conf [-n host:port;host:port] [-D key=value ...]`: run one broker.

Prints "The broker[<name>, <address>] boot success. serializeType=JSON and name
server is <addresses>" once serving (as RocketMQ's BrokerStartup does; with
`listenPort=0` the address shows the real port). Exit status: 0 after a clean stop
(SIGTERM, SIGINT), 2 for a bad config or command line (the message names the key;
RocketMQ's start-up refusals, such as a SLAVE with brokerId 0, are among them) or a
plain_acl.yml that does not parse (with aclEnable=true; the message names the file),
3 when a port (the remoting port, or a classic broker's haListenPort) cannot be
bound or another process holds the store's lock, 4 when the store cannot be used:
`storePathRootDir` not writable, damaged data (naming the file and offset), or a
failed fsync or disk write, at start or later, 5 when this node's store was upgraded
in place from a classic one but its old commitlog files differ from the DLedger
leader's (the message says how; copy the leader's store and start again), 6 when an
invariant is broken (an AssertionError: a bug; its traceback goes to stderr before the
line) rather than run on with state it cannot trust.

`--enable-proxy [-pc rmq-proxy.json]` (Apache's local mode) also serves RocketMQ 5's
gRPC proxy in this process (raftmq.proxy: the same proxy as `mqproxy`, reaching this
broker and its group over loopback remoting through the broker's name servers) and
prints "The Proxy boot success. grpcServerPort=N" once it serves.

`--convertForJava` rewrites this stopped member's DLedger-mode store for Apache
RocketMQ's Java broker (`store.java_dledger`, docs/replica.md), prints a line per
message whose msgId changed and a summary, and exits: 0 when done, 2 when the config
is not DLedger mode, `--convertAnchorIndex N` is missing (the line names where this
member's log begins), not a log index, or comes without `--convertForJava`, 3 when a
broker holds the store's lock, 4 when the store cannot be read, written or converted
(the line says why: a damaged entry, an anchor below this log's beginning or past
what it holds committed, a message whose properties cannot take the padding), with
nothing written in those cases but the first. Every member needs the same anchor:
the largest index at which a member's log begins (0 when retention has deleted
nothing), which a first run without it prints for each member.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import trio
from raftmq.broker.access_control import AclFileError
from raftmq.broker.config import BrokerConfig, ModesConflict, load_broker_config
from raftmq.broker.controller import BrokerController
from raftmq.broker.store import java_dledger
from raftmq.broker.store.messagestore import DISPATCH_CHECKPOINT
from raftmq.dledger.server import store_dir
from raftmq.dledger.store.file import ForeignLog, StoreCorruption, SyncFailed
from raftmq.dledger.tuning import tune_for_serving

from raftmq.disk.durable import DiskFailure
from raftmq.process.errors import first_leaf
from raftmq.process.signals import cancel_on_stop_signal

if TYPE_CHECKING:
    from raftmq.proxy.config import ProxyConfig

EXIT_OK, EXIT_USAGE, EXIT_BIND, EXIT_DISK, EXIT_FOREIGN_LOG, EXIT_INVARIANT = 0, 2, 3, 4, 5, 6
EXIT_MODES_CONFLICT = 252  # RocketMQ's System.exit(-4): enableControllerMode with DLedger


class StoreInUse(OSError):
    """Another process has this store open."""


class StoreUnusable(Exception):
    """The store's directory cannot be created, written or read (named by its key):
    a disk or permissions problem, not a port."""


def _lock_store(config: BrokerConfig) -> int:
    """Hold `<storePathRootDir>/lock` for the life of the process (RocketMQ's store
    lock): two brokers on one store would truncate and rewrite each other's files."""
    root = Path(config.store_path_root_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StoreUnusable(f"storePathRootDir={root}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"store {root} is in use by another process (lock held)") from None
    return fd


async def _run(config: BrokerConfig, proxy: ProxyConfig | None = None) -> None:
    _lock_store(config)  # released when the process exits
    try:
        broker = BrokerController(config)  # opens the store: file I/O only, no sockets
    except OSError as exc:
        where = f"storePathRootDir={config.store_path_root_dir}"
        raise StoreUnusable(f"{where}: cannot open the store: {exc}") from exc
    async with trio.open_nursery() as nursery:
        await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
        await nursery.start(broker.serve)
        print(
            f"The broker[{config.broker_name}, {broker.address}] boot success. "
            f"serializeType=JSON and name server is {';'.join(config.namesrv_addr)}",
            flush=True,
        )
        if proxy is not None:
            from raftmq.proxy.server import serve_proxy  # grpcio only when asked for

            grpc_port, _metrics_port = await nursery.start(serve_proxy, proxy)
            print(f"The Proxy boot success. grpcServerPort={grpc_port}", flush=True)


def _failed(group: BaseExceptionGroup, status: int, what: str = "") -> int:
    """One line on stderr for what stopped the broker; the exit status it gets."""
    print(f"mqbroker: {what}{first_leaf(group)}", file=sys.stderr)
    return status


def _convert_for_java(config: BrokerConfig, anchor_index: int | None) -> int:
    """`--convertForJava`: the store handed to RocketMQ's DLedger 0.3.1.2 (see
    `store.java_dledger`); a line per message whose msgId changed, then a summary."""
    if not config.enable_dleger_commit_log:
        print("mqbroker: --convertForJava: enableDLegerCommitLog is not true", file=sys.stderr)
        return EXIT_USAGE
    dledger_dir = store_dir(config.dledger_config())
    if anchor_index is None:  # nothing is written: this member's beginning, for the anchor
        try:
            begin = java_dledger.begin_index(dledger_dir)
        except (java_dledger.ConvertError, OSError) as exc:
            print(f"mqbroker: --convertForJava: {exc}", file=sys.stderr)
            return EXIT_DISK
        print(
            "mqbroker: --convertForJava needs --convertAnchorIndex N, the same on every"
            " member: the largest index at which a member's log begins (this member's"
            f" begins at {begin})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        fd = _lock_store(config)
        try:
            report = java_dledger.convert(dledger_dir, anchor_index)
            root = Path(config.store_path_root_dir)
            for derived in ("consumequeue", "index"):  # both brokers rebuild them
                shutil.rmtree(root / derived, ignore_errors=True)
            (root / DISPATCH_CHECKPOINT).unlink(missing_ok=True)
        finally:
            os.close(fd)
    except (StoreUnusable, java_dledger.ConvertError, OSError) as exc:  # StoreInUse too
        print(f"mqbroker: --convertForJava: {exc}", file=sys.stderr)
        return EXIT_BIND if isinstance(exc, StoreInUse) else EXIT_DISK
    for moved in report.moved:
        topic, queue_id = moved.queue
        print(
            f"moved: {topic} queue {queue_id} offset {moved.queue_offset}:"
            f" msgId {moved.old_msg_id} is now {moved.new_msg_id}"
        )
    print(
        f"converted: {report.messages} messages from index {report.first_index},"
        f" {report.absorbed} entries that were not"
        f" messages absorbed, {len(report.moved)} msgIds changed,"
        f" committed index {report.committed_index}; consumequeue and index removed"
    )
    return EXIT_OK


def _index(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a log index: {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mqbroker", description="RocketMQ broker on DLedger, or classic master/slave."
    )
    parser.add_argument("-c", "--configFile", dest="config", help="broker.conf (key=value)")
    parser.add_argument("-n", "--namesrvAddr", dest="namesrv", help="host:port;host:port")
    parser.add_argument("-D", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("-p", "--printConfigItem", action="store_true", help="print and exit")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument(
        "--enable-proxy", action="store_true", help="also serve the gRPC proxy (local mode)"
    )
    parser.add_argument("-pc", "--proxyConfigPath", dest="proxy_config", help="rmq-proxy.json")
    parser.add_argument(
        "--convertForJava",
        action="store_true",
        help="rewrite this stopped member's DLedger store for Apache RocketMQ's Java broker"
        " (docs/replica.md), print what moved, and exit",
    )
    parser.add_argument(
        "--convertAnchorIndex",
        type=_index,
        metavar="N",
        help="with --convertForJava: the same on every member, the largest index at which a"
        " member's log begins (a run without it prints this member's)",
    )
    args = parser.parse_args(argv)
    if args.convertAnchorIndex is not None and not args.convertForJava:
        print("mqbroker: --convertAnchorIndex goes with --convertForJava", file=sys.stderr)
        return EXIT_USAGE
    overrides = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"mqbroker: -D {item!r}: expected key=value", file=sys.stderr)
            return EXIT_USAGE
        overrides[key.strip()] = value.strip()
    try:
        config, warnings = load_broker_config(
            args.config, args.namesrv or os.environ.get("NAMESRV_ADDR"), overrides
        )
    except ModesConflict as exc:
        print(f"mqbroker: {exc}", file=sys.stderr)
        return EXIT_MODES_CONFLICT
    except ValueError as exc:
        print(f"mqbroker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:
        print(f"mqbroker: warning: {warning}", file=sys.stderr)
    proxy = None
    if args.enable_proxy:
        from raftmq.proxy.config import load_proxy_config

        try:  # the broker's own name servers
            namesrv = {"namesrvAddr": ";".join(config.namesrv_addr)}
            proxy, proxy_warnings = load_proxy_config(args.proxy_config, namesrv)
        except ValueError as exc:
            print(f"mqbroker: --enable-proxy: {exc}", file=sys.stderr)
            return EXIT_USAGE
        for warning in proxy_warnings:
            print(f"mqbroker: warning: {warning}", file=sys.stderr)
    if args.printConfigItem:
        print(config)
        return EXIT_OK
    if args.convertForJava:
        return _convert_for_java(config, args.convertAnchorIndex)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    status = EXIT_OK
    tune_for_serving()
    try:
        trio.run(_run, config, proxy)
    except* (StoreCorruption, DiskFailure, SyncFailed, StoreUnusable) as group:
        status = _failed(group, EXIT_DISK)
    except* ForeignLog as group:
        status = _failed(group, EXIT_FOREIGN_LOG)
    except* AclFileError as group:
        status = _failed(group, EXIT_USAGE)
    except* StoreInUse as group:
        status = _failed(group, EXIT_BIND)
    except* OSError as group:
        if first_leaf(group).errno == errno.EIO:  # an fsync or write the disk refused
            status = _failed(group, EXIT_DISK, "disk failure: ")
        else:
            status = _failed(group, EXIT_BIND, "cannot listen: ")
    except* AssertionError as group:
        traceback.print_exception(first_leaf(group), file=sys.stderr)
        status = _failed(group, EXIT_INVARIANT, "broken invariant: ")
    except* KeyboardInterrupt:
        pass
    return status


if __name__ == "__main__":
    sys.exit(main())
