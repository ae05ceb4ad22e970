"""`dledger`: DLedger's command line — server, append, get, leadershipTransfer, status,
and (not DLedger's) addPeer, removePeer and peers, which change and show the group's
members while it runs (docs/membership.md).

Verbs and flags follow DLedger's own (`--group`, `--id`, `--peers`,
`--store-base-dir`, `--data`, `--count`, `--index`, `--leader`, `--transferee`);
`server --metrics-port` (or `-D metricsPort=`) also serves Prometheus metrics.
Exit status for scripts (every verb): 0 success, 1 the group answered with an error code
(UNKNOWN_GROUP for a wrong `--group`), 2 bad usage, 3 no member (or no leader)
reachable, or `server` cannot listen on its port (peer or metrics), 4 the server
refused to start (its store directory unusable, damaged data: the message names the
file and offset) or stopped because its disk failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import trio
from prometheus_client import CollectorRegistry
from raftmq.dledger.client import ClientError, DLedgerClient, body_for_json
from raftmq.dledger.codes import Code
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.metrics import DLedgerCollector
from raftmq.dledger.server import DLedgerServer
from raftmq.dledger.store.file import StoreCorruption, SyncFailed
from raftmq.dledger.tuning import tune_for_serving

from raftmq.config.address import parse_address, parse_peers
from raftmq.disk.durable import DiskFailure
from raftmq.process.errors import first_leaf
from raftmq.process.metrics_endpoint import METRICS_PATH, MetricsPortError, serve_metrics
from raftmq.process.signals import cancel_on_stop_signal
from raftmq.transport.tls import PeerTls

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_STORAGE = 0, 1, 2, 3, 4


class CannotListen(Exception):
    """The server's own peer address could not be bound (in use, not local)."""


class StoreUnusable(Exception):
    """The store directory cannot be created, written or read."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dledger", description="A DLedger (Raft) log on trio.")
    verbs = parser.add_subparsers(dest="verb", required=True)

    def common(p, with_id=False):
        p.add_argument("--group", "-g", default="default")
        p.add_argument("--peers", "-p", required=True, help="n0-host:port;n1-host:port;...")
        if with_id:
            p.add_argument("--id", "-i", required=True)
        tls = p.add_argument_group("mutual TLS on the peer port (all three, or none)")
        tls.add_argument("--tls-cert", help="PEM certificate this end presents")
        tls.add_argument("--tls-key", help="its PEM private key")
        tls.add_argument("--tls-ca", help="PEM CAs the other end's certificate must chain to")
        return p

    server = common(verbs.add_parser("server", help="run one replica"), with_id=True)
    server.add_argument("--store-base-dir", "-s", required=True)
    server.add_argument("--store-type", default="FILE", choices=["FILE", "MEMORY"])
    server.add_argument("--preferred-leader-id", default="")
    server.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics at http://<peer host>:PORT/metrics (0: none)",
    )
    server.add_argument(
        "--flush-disk-type",
        default="SYNC_FLUSH",
        choices=["SYNC_FLUSH", "ASYNC_FLUSH"],
        help="SYNC_FLUSH (default): acknowledge after fsync; ASYNC_FLUSH: after the page cache",
    )
    server.add_argument(
        "--config",
        "-D",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any DLedger key, e.g. -D heartBeatTimeIntervalMs=100",
    )
    server.add_argument("--log-level", default="WARNING")

    append = common(verbs.add_parser("append", help="append entries and wait for commit"))
    append.add_argument("--data", "-d", default="Hello")
    append.add_argument("--count", "-c", type=int, default=1)
    append.add_argument("--json", action="store_true")

    get = common(verbs.add_parser("get", help="read a committed entry"))
    get.add_argument("--index", "-i", type=int, required=True)
    get.add_argument("--json", action="store_true")

    transfer = common(
        verbs.add_parser("leadershipTransfer", help="hand leadership to another member")
    )
    transfer.add_argument("--leader", "-l", required=True)
    transfer.add_argument("--transferee", "-t", required=True)

    status = common(verbs.add_parser("status", help="each member's role, term, ledger end, commit"))
    status.add_argument("--json", action="store_true")

    add = common(
        verbs.add_parser(
            "addPeer", help="add a member started with joinAsLearner: learner, then voter"
        )
    )
    add.add_argument("--member", "-m", required=True, help="id-host:port of the new member")
    add.add_argument(
        "--timeout-s", type=float, default=60.0, help="for it to catch up and be promoted"
    )
    remove = common(verbs.add_parser("removePeer", help="remove a member (the leader too)"))
    remove.add_argument("--member", "-m", required=True, help="id of the member")
    remove.add_argument("--timeout-s", type=float, default=10.0)
    for verb in (add, remove):
        verb.add_argument("--json", action="store_true")
    peers = common(verbs.add_parser("peers", help="the leader's voters and learners"))
    peers.add_argument("--json", action="store_true")
    return parser


def _server_config(args) -> DLedgerConfig:
    values: dict[str, str] = {
        "group": args.group,
        "selfId": args.id,
        "peers": args.peers,
        "storeBaseDir": args.store_base_dir,
        "storeType": args.store_type,
        "flushDiskType": args.flush_disk_type,
    }
    if args.preferred_leader_id:
        values["preferredLeaderIds"] = args.preferred_leader_id
    if args.metrics_port:
        values["metricsPort"] = str(args.metrics_port)
    for key, given in (
        ("tlsCertPath", args.tls_cert),
        ("tlsKeyPath", args.tls_key),
        ("tlsTrustCertPath", args.tls_ca),
    ):
        if given:
            values[key] = given
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--config {item!r}: expected KEY=VALUE")
        values[key] = value
    return DLedgerConfig.from_keys(values, "command line")


def _client_tls(args) -> PeerTls | None:
    paths = (args.tls_cert, args.tls_key, args.tls_ca)
    if not any(paths):
        return None
    if not all(paths):
        raise ValueError("--tls-cert, --tls-key and --tls-ca go together")
    return PeerTls(*paths)


async def _run_server(config: DLedgerConfig) -> None:
    try:
        server = DLedgerServer(config)  # opens the store: files only, no sockets
    except OSError as exc:
        raise StoreUnusable(f"--store-base-dir {config.store_base_dir}: {exc}") from exc
    address = config.peers[config.self_id]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
            await nursery.start(server.serve)
            print(f"dledger server {config.group}/{config.self_id} on {address}", flush=True)
            if config.metrics_port:
                registry = CollectorRegistry(auto_describe=False)
                registry.register(DLedgerCollector(server))
                host = parse_address(address)[0]
                port = await nursery.start(serve_metrics, registry, host, config.metrics_port)
                print(f"metrics at http://{host}:{port}{METRICS_PATH}", flush=True)
    except* DiskFailure as failures:
        raise failures.exceptions[0] from None
    except* MetricsPortError as failures:
        reason = failures.exceptions[0].strerror  # "metricsPort=N: <why>"
        raise CannotListen(f"{config.self_id} cannot serve metrics: {reason}") from None
    except* OSError as failures:
        reason = first_leaf(failures)
        raise CannotListen(f"{config.self_id} cannot listen on {address}: {reason}") from None


async def _append(client: DLedgerClient, args) -> int:
    body = args.data.encode()
    positions: list[tuple[int, int]] = []
    remaining = args.count
    while remaining > 0:
        batch = min(remaining, 1000)
        positions += await client.append([body] * batch)
        remaining -= batch
    if args.json:
        print(json.dumps([{"index": i, "pos": p} for i, p in positions]))
    else:
        for i, p in positions:
            print(f"appended index={i} pos={p}")
    return EXIT_OK


async def _get(client: DLedgerClient, args) -> int:
    e = await client.get(args.index)
    record = {"index": e["index"], "term": e["term"], "pos": e["pos"], **body_for_json(e["body"])}
    if args.json:
        print(json.dumps(record))
    else:
        print(" ".join(f"{k}={v}" for k, v in record.items()))
    return EXIT_OK


async def _status(client: DLedgerClient, args) -> int:
    rows = []
    for m in await client.status():
        rows.append(
            {
                "id": m.get("selfId"),
                "role": m.get("role"),
                "term": m.get("term"),
                "leaderId": m.get("leaderId"),
                "ledgerEndIndex": m.get("ledgerEndIndex"),
                "committedIndex": m.get("committedIndex"),
            }
        )
    if args.json:
        print(json.dumps(rows))
    else:
        header = ("id", "role", "term", "leaderId", "ledgerEndIndex", "committedIndex")
        print("".join(f"{h:<16}" for h in header))
        for row in rows:
            print("".join(f"{'-' if row[h] is None else row[h]!s:<16}" for h in header))
    reachable = [r for r in rows if r["role"] != "UNREACHABLE"]
    return EXIT_OK if reachable else EXIT_UNAVAILABLE


async def _members(client: DLedgerClient, args) -> int:
    """addPeer, removePeer and peers; each ends by printing the configuration."""
    if args.verb == "addPeer":
        given = parse_peers(args.member)
        if len(given) != 1:
            raise ValueError(f"--member {args.member!r}: expected one id-host:port")
        ((member, address),) = given.items()
        await client.add_peer(member, address)
    elif args.verb == "removePeer":
        await client.remove_peer(args.member)
    members = await client.members()
    if args.json:
        print(json.dumps(members))
    else:
        for role in ("voters", "learners"):
            for member in members[role]:
                print(f"{member:<16}{role[:-1]:<10}{members['peers'][member]}")
    return EXIT_OK


async def _client_verb(args) -> int:
    tls = _client_tls(args)
    timeout_s = getattr(args, "timeout_s", 5.0)
    peers = parse_peers(args.peers)
    async with DLedgerClient(args.group, peers, timeout_s, tls=tls) as client:
        if args.verb in ("addPeer", "removePeer", "peers"):
            return await _members(client, args)
        if args.verb == "append":
            return await _append(client, args)
        if args.verb == "get":
            return await _get(client, args)
        if args.verb == "status":
            return await _status(client, args)
        await client.leadership_transfer(args.leader, args.transferee)
        print(f"leadership transferred from {args.leader} to {args.transferee}")
        return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.verb == "server":
            logging.basicConfig(
                level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s"
            )
            config = _server_config(args)
            tune_for_serving()
            trio.run(_run_server, config)
            return EXIT_OK
        return trio.run(_client_verb, args)
    except (StoreCorruption, DiskFailure, SyncFailed, StoreUnusable) as exc:
        print(f"dledger: refusing to run: {exc}", file=sys.stderr)
        return EXIT_STORAGE
    except CannotListen as exc:
        print(f"dledger: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:
        print(f"dledger: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        print(f"dledger: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE if exc.code in (Code.NOT_LEADER, Code.NETWORK_ERROR) else EXIT_ERROR
    except ConnectionError as exc:
        print(f"dledger: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE


if __name__ == "__main__":
    sys.exit(main())
