"""`mqnamesrv [-c namesrv.conf]`: run a name server until SIGTERM or SIGINT.

Prints "The Name Server boot success. listenPort=N" once listening (N is the real port
when `listenPort=0`). Exit status: 0 after a clean stop, 2 for a bad config or command
line (the message names the key or file), 3 when a port (listenPort, metricsPort) cannot
be bound.
"""

from __future__ import annotations

import argparse
import logging
import sys

import trio
from raftmq.namesrv.config import NamesrvConfig, load_config
from raftmq.namesrv.server import NamesrvServer

from raftmq.process.errors import first_leaf
from raftmq.process.metrics_endpoint import MetricsPortError
from raftmq.process.signals import cancel_on_stop_signal

EXIT_OK, EXIT_USAGE, EXIT_BIND = 0, 2, 3


async def _run(config: NamesrvConfig) -> None:
    server = NamesrvServer(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
        port = await nursery.start(server.serve)
        print(f"The Name Server boot success. listenPort={port}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqnamesrv", description="RocketMQ name server.")
    parser.add_argument("-c", "--configFile", dest="config", help="namesrv.conf (key=value)")
    parser.add_argument("-p", "--printConfigItem", action="store_true", help="print and exit")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    try:
        config, warnings = load_config(args.config)
    except ValueError as exc:
        print(f"mqnamesrv: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:
        print(f"mqnamesrv: warning: {warning}", file=sys.stderr)
    if args.printConfigItem:
        print(config)
        return EXIT_OK
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    status = EXIT_OK
    try:
        trio.run(_run, config)
    except* MetricsPortError as group:
        print(f"mqnamesrv: cannot listen: {first_leaf(group)}", file=sys.stderr)
        status = EXIT_BIND
    except* OSError as group:
        exc = first_leaf(group)
        print(f"mqnamesrv: cannot listen on port {config.listen_port}: {exc}", file=sys.stderr)
        status = EXIT_BIND
    except* KeyboardInterrupt:
        pass
    return status


if __name__ == "__main__":
    sys.exit(main())
