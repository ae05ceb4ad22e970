"""`mqcontroller -c controller.conf [-p]`: run one controller until SIGTERM, SIGINT or SIGHUP.

Prints "The Controller Server boot success. listenPort=N" once its DLedger peer port
(where it also answers remoting requests) is listening. `-p` prints the config and
exits. Exit status: 0 after a clean stop, 2 for a bad config or command line (the
message names the key or file), 3 when the port cannot be bound. RocketMQ's sample
files (`distribution/conf/controller/*`, copied in `conf/`) start as they are.
"""

from __future__ import annotations

import argparse
import functools
import sys

from raftmq.controller.config import read_controller_config
from raftmq.controller.server import ControllerServer

from raftmq.config.keys import read_config_file
from raftmq.config.properties import format_properties
from raftmq.process.command import (
    EXIT_OK,
    EXIT_USAGE,
    load_or_none,
    run_server,
    serve_until_stopped,
)


def _ready(_server: ControllerServer, port: int) -> None:
    print(f"The Controller Server boot success. listenPort={port}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqcontroller", description="RocketMQ 5's controller.")
    parser.add_argument("-c", "--configFile", dest="config", required=True, help="key=value file")
    parser.add_argument("-p", "--printConfigItem", action="store_true", help="print and exit")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    config = load_or_none(
        "mqcontroller", lambda: read_controller_config(read_config_file(args.config), args.config)
    )
    if config is None:
        return EXIT_USAGE
    if args.printConfigItem:
        print(format_properties(config.properties()), end="")
        return EXIT_OK
    address = config.peers[config.self_id]
    return run_server(
        "mqcontroller",
        args.log_level,
        functools.partial(serve_until_stopped, functools.partial(ControllerServer, config), _ready),
        lambda exc: f"cannot listen on {address}: {exc}",
    )


if __name__ == "__main__":
    sys.exit(main())
