"""`mqproxy -pc rmq-proxy.json`: RocketMQ 5's gRPC proxy, in front of the broker groups
a name server knows, until SIGTERM or SIGINT.

Prints "The Proxy boot success. grpcServerPort=N" once serving (N is the real port when
`grpcServerPort` is 0). Exit status: 0 after a clean stop, 2 for a bad config or
command line (the message names the key or file), 3 when a port cannot be bound.
"""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from raftmq.process.errors import first_leaf
from raftmq.process.metrics_endpoint import MetricsPortError
from raftmq.process.signals import cancel_on_stop_signal
from raftmq.proxy.config import ProxyConfig, load_proxy_config
from raftmq.proxy.server import serve_proxy

EXIT_OK, EXIT_USAGE, EXIT_BIND = 0, 2, 3


async def _run(config: ProxyConfig) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(cancel_on_stop_signal, nursery.cancel_scope)
        grpc_port, metrics_port = await nursery.start(serve_proxy, config)
        line = f"The Proxy boot success. grpcServerPort={grpc_port}"
        if metrics_port is not None:
            line += f" metricsPromExporterPort={metrics_port}"
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mqproxy", description="RocketMQ 5 gRPC proxy.")
    parser.add_argument("-pc", "--proxyConfigPath", dest="config", help="rmq-proxy.json")
    parser.add_argument("-n", "--namesrvAddr", dest="namesrv", help="name servers, a;b")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    overrides = {} if args.namesrv is None else {"namesrvAddr": args.namesrv}
    try:
        config, warnings = load_proxy_config(args.config, overrides)
    except ValueError as exc:
        print(f"mqproxy: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in warnings:
        print(f"mqproxy: warning: {warning}", file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    exit_status = EXIT_OK
    try:
        trio.run(_run, config)
    except* ValueError as group:
        print(f"mqproxy: {first_leaf(group)}", file=sys.stderr)
        exit_status = EXIT_USAGE
    except* (MetricsPortError, OSError) as group:
        print(f"mqproxy: cannot listen: {first_leaf(group)}", file=sys.stderr)
        exit_status = EXIT_BIND
    except* KeyboardInterrupt:
        pass
    return exit_status


if __name__ == "__main__":
    sys.exit(main())
