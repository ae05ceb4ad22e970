"""`mqconsole -n namesrv:port [--listen host:port] [--prometheus URL]`: serve the console
until SIGTERM or SIGINT.

The charts sample the cluster every `--sample-interval-ms` into memory, or, with
`--prometheus URL`, are read from that Prometheus server instead (nothing is sampled).

Prints "mqconsole: http://HOST:PORT/ ..." once listening (the real port when the
given one is 0). Exit status: 0 after a clean stop, 2 for a bad command line (the
message names the flag), 3 when the address cannot be listened on. A cluster that
cannot be reached is not a reason to exit: the page says so until it comes back.
"""

from __future__ import annotations

import argparse
import sys

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from raftmq.client.admin import Admin
from raftmq.client.instance import namesrv_from_flag
from raftmq.config.address import parse_address
from raftmq.console.app import create_app
from raftmq.console.sampler import DEFAULT_INTERVAL_S, PrometheusSeries, Sampler
from raftmq.process.errors import first_leaf
from raftmq.process.signals import cancel_on_stop_signal

EXIT_OK, EXIT_USAGE, EXIT_BIND = 0, 2, 3
DEFAULT_LISTEN = "127.0.0.1:8080"  # RocketMQ Dashboard's port
GRACEFUL_STOP_S = 1.0  # open page polls are cut after this on a stop


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqconsole", description="Web console for raftmq.")
    parser.add_argument(
        "-n",
        "--namesrvAddr",
        help="name server address list, eg: 127.0.0.1:9876;... (default: NAMESRV_ADDR)",
    )
    parser.add_argument("--listen", default=DEFAULT_LISTEN, help="host:port to serve on")
    parser.add_argument(
        "--timeout-ms", type=int, default=2000, help="how long to wait for a server's answer"
    )
    parser.add_argument(
        "--sample-interval-ms",
        type=int,
        default=int(DEFAULT_INTERVAL_S * 1000),
        help="how often the charts sample the cluster",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="draw the charts from this Prometheus server (eg: http://127.0.0.1:9090)",
    )
    return parser


async def _serve(namesrv: list[str], host: str, port: int, args: argparse.Namespace) -> None:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    config.graceful_timeout = GRACEFUL_STOP_S
    async with (
        Admin(namesrv, timeout_s=args.timeout_ms / 1000) as admin,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
        if args.prometheus:
            charts = PrometheusSeries(args.prometheus, args.timeout_ms / 1000)
        else:
            charts = Sampler(admin, args.sample_interval_ms / 1000)
            await nursery.start(charts.run)
        binds = await nursery.start(serve, create_app(admin, charts), config)
        print(f"mqconsole: {binds[0]}/ (name servers {';'.join(namesrv)})", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        namesrv = namesrv_from_flag(args.namesrvAddr)
        host, port = parse_address(args.listen)
        if args.timeout_ms <= 0:
            raise ValueError("--timeout-ms must be positive")
        if args.sample_interval_ms <= 0:
            raise ValueError("--sample-interval-ms must be positive")
        if args.prometheus and not args.prometheus.startswith(("http://", "https://")):
            raise ValueError(f"--prometheus must be an http(s) URL, not {args.prometheus!r}")
    except ValueError as exc:
        print(f"mqconsole: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        trio.run(_serve, namesrv, host, port, args)
    except (OSError, KeyboardInterrupt, BaseExceptionGroup) as exc:
        cause = first_leaf(exc)
        if isinstance(cause, KeyboardInterrupt):  # before the stop signals were taken over
            return EXIT_OK
        if not isinstance(cause, OSError):
            raise
        print(f"mqconsole: cannot listen on {args.listen}: {cause}", file=sys.stderr)
        return EXIT_BIND
    return EXIT_OK
