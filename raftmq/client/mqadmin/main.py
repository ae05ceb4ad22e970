"""The entry point: find the verb, parse its flags, run it, turn failures into one
line and an exit status.

Requests are signed (RocketMQ's ACL) with the account given by `--accessKey` and
`--secretKey`, before the verb (`mqadmin --accessKey A --secretKey S updateAclConfig
...`, the only place for them with the ACL verbs, whose own -a and -s name the account
being written) or after it; else with `$ROCKETMQ_HOME/conf/tools.yml`'s accessKey and
secretKey, where RocketMQ's mqadmin reads them; else requests go unsigned."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio
import yaml

from raftmq.client.admin import Admin, UnreachableError
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.instance import namesrv_from_flag
from raftmq.client.mqadmin import (  # noqa: F401  (they register)
    acl,
    brokers,
    clients,
    controller,
    export,
    groups,
    leaders,
    messages,
    namesrv,
    queries,
    topics,
)
from raftmq.client.mqadmin.commands import (
    ALIASES,
    COMMANDS,
    EXIT_ANSWERED_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Command,
    UsageError,
    listed,
    print_row,
)
from raftmq.process.errors import first_leaf
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import ResponseCode
from raftmq.remoting.signing import SessionCredentials
from raftmq.transport.tls import ClientTls

__all__ = ["failure_reason", "main"]


def _print_commands() -> None:
    print("The most commonly used mqadmin commands are:")
    for command in listed():
        print_row("   %-20s %s", command.name, command.desc)
    print("\nSee 'mqadmin help <command>' for more information on a specific command.")


def _find(name: str) -> Command | None:
    """Command names and aliases match regardless of case, as MQAdminStartup's do."""
    name = next((n for a, n in ALIASES.items() if a.lower() == name.lower()), name)
    return next((c for n, c in COMMANDS.items() if n.lower() == name.lower()), None)


def failure_reason(exc: Exception) -> tuple[str, int]:
    """Why a call to the cluster failed, in one line, and the exit status for it: an
    answered error names the server, the code (by name when known) and the remark."""
    if isinstance(exc, MQBrokerError):
        try:
            name = f" ({ResponseCode(exc.code).name})"
        except ValueError:
            name = ""
        return f"{exc.broker} answered code {exc.code}{name}: {exc.remark}", EXIT_ANSWERED_ERROR
    if isinstance(exc, UnreachableError | RemotingConnectError | RemotingTimeoutError):
        return str(exc), EXIT_UNREACHABLE
    return str(exc), EXIT_ANSWERED_ERROR


def _failure(command: Command, exc: Exception) -> int:
    """Print why `command` failed; the exit status for it."""
    reason, status = failure_reason(exc)
    print(f"mqadmin {command.name} failed: {reason}", file=sys.stderr)
    return status


_HELP = ("help", "-h", "--help")


def _client_tls(args) -> ClientTls | None:
    if not args.tls:
        return None
    return ClientTls(
        enable=True,
        cert_path=args.tlsCertPath,
        key_path=args.tlsKeyPath,
        trust_cert_path=args.tlsTrustCertPath,
        test_mode=args.tlsTestMode,
    )


_SIGNING = ("--accessKey", "--secretKey")


def _leading_signing(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """The --accessKey/--secretKey given before the verb, and the rest of argv."""
    given = {}
    while argv and argv[0].split("=", 1)[0] in _SIGNING:
        name, sep, value = argv[0].partition("=")
        if not sep:
            if len(argv) < 2:
                raise UsageError(f"{name} needs a value")
            value, argv = argv[1], argv[1:]
        given[name[2:]] = value
        argv = argv[1:]
    return given, argv


def _credentials(leading: dict[str, str], args) -> SessionCredentials | None:
    access_key = leading.get("accessKey") or getattr(args, "signAccessKey", None)
    secret_key = leading.get("secretKey") or getattr(args, "signSecretKey", None)
    if access_key is None and secret_key is None:
        home = os.environ.get("ROCKETMQ_HOME")
        tools = Path(home, "conf", "tools.yml") if home else None
        if tools is None or not tools.exists():
            return None
        try:
            doc = yaml.safe_load(tools.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"{tools}: {exc}") from None
        access_key, secret_key = doc.get("accessKey"), doc.get("secretKey")
        if access_key is None and secret_key is None:
            return None
    if not access_key or not secret_key:
        raise UsageError("give both --accessKey and --secretKey to sign requests")
    return SessionCredentials(str(access_key), str(secret_key))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        leading, argv = _leading_signing(argv)
    except UsageError as exc:
        print(f"mqadmin: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not argv or (argv[0] in _HELP and len(argv) == 1):
        _print_commands()
        return EXIT_OK
    if argv[0] in _HELP and len(argv) == 2:
        command = _find(argv[1])
        if command is None:
            print(f"The sub command {argv[1]} not exist.", file=sys.stderr)
            return EXIT_USAGE
        command.parser().print_help()
        if command.reason is not None:
            print(f"\nNot applicable to raftmq: {command.reason}")
        return EXIT_OK
    command = _find(argv[0])
    if command is None:
        print(f"The sub command {argv[0]} not exist.", file=sys.stderr)
        return EXIT_USAGE
    if command.reason is not None:
        print(
            f"mqadmin {command.name}: not applicable to raftmq: {command.reason}", file=sys.stderr
        )
        return EXIT_USAGE
    parser = command.parser()
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as exc:  # argparse: 2 for bad flags, 0 for -h
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        if command.needs_namesrv or args.namesrvAddr or os.environ.get("NAMESRV_ADDR"):
            namesrv = namesrv_from_flag(args.namesrvAddr)
        else:
            namesrv = []
    except ValueError as exc:
        print(f"mqadmin: {exc}", file=sys.stderr)
        return EXIT_USAGE

    try:
        credentials = _credentials(leading, args)
    except UsageError as exc:
        print(f"mqadmin {command.name}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    async def run() -> int:
        async with Admin(namesrv, tls=_client_tls(args), credentials=credentials) as admin:
            assert command.run is not None, command.name  # inapplicable verbs return earlier
            return await command.run(admin, args) or EXIT_OK

    try:
        try:
            return trio.run(run)
        except BaseExceptionGroup as group:  # from a client's nursery: say what went wrong
            raise first_leaf(group) from None
    except (UsageError, ValueError) as exc:  # ValueError: a bad -b address, msgId, ...
        print(f"mqadmin {command.name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (MQClientError, RemotingConnectError, RemotingTimeoutError) as exc:
        return _failure(command, exc)
    except KeyboardInterrupt:  # clusterRT runs until interrupted, as RocketMQ's does
        print(f"mqadmin {command.name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
