"""The verb registry and what the verbs share: flags, table rows, timestamps.

A verb is an async function of (Admin, parsed flags) registered with `@verb`, with
RocketMQ's name, description and flags; `COMMANDS` lists them in registration order.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Awaitable, Callable

import attrs

from raftmq.client.admin import Admin

EXIT_OK, EXIT_ANSWERED_ERROR, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it


class UsageError(Exception):
    """Flags that parse but do not make a request (both -b and -c, a bad msgId)."""


Run = Callable[[Admin, argparse.Namespace], Awaitable[int | None]]


@attrs.frozen
class Command:
    name: str
    desc: str
    options: tuple[tuple, ...]  # (flag, long name, help, add_argument kwargs)
    run: Run | None
    needs_namesrv: bool = True  # False: it names its servers itself (the controller's -a)
    reason: str | None = None  # why a RocketMQ verb does not apply to raftmq

    def parser(self) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog=f"mqadmin {self.name}", description=self.desc)
        parser.add_argument(
            "-n", "--namesrvAddr", help="Name server address list, eg: 192.168.0.1:9876;..."
        )
        tls = parser.add_argument_group("TLS (RocketMQ's tls.enable and tls.client.* keys)")
        tls.add_argument("--tls", action="store_true", help="connect over TLS (tls.enable)")
        tls.add_argument("--tlsTrustCertPath", help="PEM CAs the servers' certificates chain to")
        tls.add_argument("--tlsCertPath", help="PEM certificate to present, if servers ask")
        tls.add_argument("--tlsKeyPath", help="its PEM private key")
        tls.add_argument(
            "--tlsTestMode", action="store_true", help="do not verify the servers' certificates"
        )
        names = {name for _flag, name, _help, _kwargs in self.options}
        if not names & {"accessKey", "secretKey"}:  # the ACL verbs' own -a and -s
            acl = parser.add_argument_group(
                "ACL (sign requests as an account of the brokers' plain_acl.yml)"
            )
            acl.add_argument("--accessKey", dest="signAccessKey", help="the account's accessKey")
            acl.add_argument("--secretKey", dest="signSecretKey", help="its secretKey")
        for flag, name, help_text, kwargs in self.options:
            parser.add_argument(flag, f"--{name}", dest=name, help=help_text, **kwargs)
        return parser


COMMANDS: dict[str, Command] = {}
ALIASES: dict[str, str] = {}  # a SubCommand's commandAlias -> its name

# `mqadmin`'s list, in MQAdminStartup.initCommand's order (4.9.8), raftmq's own verbs
# beside their kin; a verb not named here is listed after these, as registered.
LISTING = (
    "updateTopic", "deleteTopic", "updateSubGroup", "deleteSubGroup", "updateBrokerConfig",
    "updateTopicPerm", "topicRoute", "topicStatus", "topicClusterList",
    "brokerStatus", "dledgerStatus", "getDLedgerPeers", "addDLedgerPeer", "removeDLedgerPeer",
    "haStatus", "timerStatus",
    "queryMsgById", "queryMsgByKey", "queryMsgByUniqueKey", "queryMsgByOffset",
    "queryMsgTraceById", "printMsg", "printMsgByQueue", "sendMsgStatus", "brokerConsumeStats",
    "producerConnection", "consumerConnection", "consumerProgress", "popStatus",
    "consumerStatus", "cloneGroupOffset", "producer", "clusterList", "topicList",
    "updateKvConfig", "deleteKvConfig", "wipeWritePerm", "addWritePerm", "resetOffsetByTime",
    "skipAccumulatedMessage", "updateOrderConf", "cleanExpiredCQ", "deleteExpiredCommitLog",
    "cleanUnusedTopic", "startMonitoring", "statsAll", "allocateMQ", "checkMsgSendRT",
    "clusterRT", "getNamesrvConfig", "updateNamesrvConfig", "getBrokerConfig",
    "getConsumerConfig", "getConsumerStatus", "queryCq", "sendMessage", "consumeMessage",
    "updateAclConfig", "deleteAclConfig", "clusterAclConfigVersion",
    "getAccessConfigSubCommand", "updateGlobalWhiteAddr",
    "exportMetadata", "exportConfigs", "exportMetrics",
)  # fmt: skip


def listed() -> list[Command]:
    """The verbs in `LISTING`'s order, the others after them as registered."""
    order = {name: n for n, name in enumerate(LISTING)}
    return sorted(COMMANDS.values(), key=lambda c: order.get(c.name, len(LISTING)))


def verb(
    name: str, desc: str, *options: tuple, alias: str | None = None, needs_namesrv: bool = True
) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        COMMANDS[name] = Command(name, desc, options, run, needs_namesrv)
        if alias is not None:
            ALIASES[alias] = name
        return run

    return register


def not_applicable(name: str, desc: str, reason: str) -> None:
    """A RocketMQ verb raftmq has no use for: listed with RocketMQ's description, and
    run it prints `reason` in one line and exits with the usage status."""
    COMMANDS[name] = Command(name, desc, (), None, reason=reason)


def option(flag: str, name: str, help_text: str, **kwargs) -> tuple:
    return (flag, name, help_text, kwargs)


def broker_or_cluster(broker_help: str, cluster_help: str) -> tuple[tuple, tuple]:
    """-b (a broker address) and -c (a cluster), of which a verb takes exactly one
    (`target_kwargs`)."""
    return option("-b", "brokerAddr", broker_help), option("-c", "clusterName", cluster_help)


def format_row(fmt: str, *values) -> str:
    """One line of a table; the formats are RocketMQ's printf formats, which Python's
    % operator reads the same way."""
    return fmt % values


def print_row(fmt: str, *values) -> None:
    print(format_row(fmt, *values))


def human_ms(ms: int) -> str:
    """`UtilAll.timeMillisToHumanString2`: local time, `yyyy-MM-dd HH:mm:ss,SSS`."""
    moment = datetime.datetime.fromtimestamp(ms / 1000)
    return f"{moment:%Y-%m-%d %H:%M:%S},{ms % 1000:03d}"


def java_bool(text: str) -> bool:
    """Boolean.parseBoolean: "true" in any case is true, anything else false."""
    return text.strip().lower() == "true"


def target_kwargs(args: argparse.Namespace) -> dict:
    """-b or -c, exactly one, as Admin's keyword arguments."""
    if (args.brokerAddr is None) == (args.clusterName is None):
        raise UsageError("give either -b (a broker) or -c (a cluster)")
    if args.brokerAddr is not None:
        return {"broker_addr": args.brokerAddr.strip()}
    return {"cluster": args.clusterName.strip()}


def parse_timestamp_ms(text: str) -> int:
    """`now` (-1: the queue's end), epoch milliseconds, or local time as
    `yyyy-MM-dd#HH:mm:ss:SSS` (UtilAll.YYYY_MM_DD_HH_MM_SS_SSS)."""
    if text == "now":
        return -1
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.datetime.strptime(text, "%Y-%m-%d#%H:%M:%S:%f")
    except ValueError:
        raise UsageError(
            f"-s {text!r}: expected now, epoch milliseconds or yyyy-MM-dd#HH:mm:ss:SSS"
        ) from None
    return int(moment.timestamp() * 1000)


not_applicable(
    "deleteExpiredCommitLog",
    "Delete expired CommitLog files",
    "a raftmq broker deletes expired log files as soon as fileReservedTime allows, at any "
    "hour (it has no deleteWhen window for this to override)",
)
not_applicable(
    "startMonitoring",
    "Start Monitoring",
    "the brokers export consumer lag and rates as Prometheus metrics (metricsPort) instead "
    "of a tool polling them into a log",
)
