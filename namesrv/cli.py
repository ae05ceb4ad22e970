"""`mqnamesrv [-c namesrv.conf]`: run a name server until SIGTERM or SIGINT.

Prints "The Name Server boot success. listenPort=N" once listening (N is the real port
when `listenPort=0`), and with `enableControllerInNamesrv=true` "The Controller Server
boot success. listenPort=N" for the controller inside (N its DLedger peer port). Exit
status: 0 after a clean stop, 2 for a bad config or command line (the message names
the key or file), 3 when a port (listenPort, metricsPort, the controller's) cannot be
bound.
"""

from __future__ import annotations

import argparse
import functools
import sys

from raftmq.namesrv.config import load_config
from raftmq.namesrv.kv_config import KVConfigManager
from raftmq.namesrv.server import NamesrvServer

from raftmq.process.command import (
    EXIT_OK,
    EXIT_USAGE,
    load_or_none,
    run_server,
    serve_until_stopped,
)
from raftmq.process.metrics_endpoint import MetricsPortError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqnamesrv", description="RocketMQ name server.")
    parser.add_argument("-c", "--configFile", dest="config", help="namesrv.conf (key=value)")
    parser.add_argument("-p", "--printConfigItem", action="store_true", help="print and exit")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    config = load_or_none("mqnamesrv", lambda: load_config(args.config))
    if config is None:
        return EXIT_USAGE
    if args.printConfigItem:
        print(config)
        return EXIT_OK
    try:  # a kvConfigPath that is not a kvConfig.json stops the start, naming it
        kv = KVConfigManager(config.kv_config_path or None)
    except ValueError as exc:
        print(f"mqnamesrv: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def ready(server: NamesrvServer, port: int) -> None:
        print(f"The Name Server boot success. listenPort={port}", flush=True)
        if server.controller is not None:
            print(
                f"The Controller Server boot success. listenPort={server.controller.port}",
                flush=True,
            )

    def where(exc: BaseException) -> str:
        if isinstance(exc, MetricsPortError):
            return f"cannot listen: {exc}"
        return f"cannot listen on port {config.listen_port}: {exc}"

    return run_server(
        "mqnamesrv",
        args.log_level,
        functools.partial(serve_until_stopped, functools.partial(NamesrvServer, config, kv), ready),
        where,
    )


if __name__ == "__main__":
    sys.exit(main())
