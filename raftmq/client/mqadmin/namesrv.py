"""Name server verbs: updateKvConfig, deleteKvConfig, updateOrderConf, wipeWritePerm,
addWritePerm, getNamesrvConfig, updateNamesrvConfig.

Outputs are RocketMQ's (`namesrv/*Command`, `UpdateOrderConfCommand`). wipeWritePerm
and addWritePerm print a Failed line for a name server that refuses or does not answer
and go on to the next, as RocketMQ's do; the exit status then says so (1).
"""

from __future__ import annotations

import argparse

from raftmq.client.admin import Admin
from raftmq.client.errors import MQClientError
from raftmq.client.mqadmin.commands import EXIT_ANSWERED_ERROR, UsageError, option, print_row, verb
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError

ORDER_TOPIC_CONFIG = "ORDER_TOPIC_CONFIG"  # NamesrvUtil.NAMESPACE_ORDER_TOPIC_CONFIG


@verb(
    "updateKvConfig",
    "Create or update KV config.",
    option("-s", "namespace", "set the namespace", required=True),
    option("-k", "key", "set the key name", required=True),
    option("-v", "value", "set the key value", required=True),
)
async def update_kv_config(admin: Admin, args: argparse.Namespace) -> None:
    await admin.put_kv_config(args.namespace.strip(), args.key.strip(), args.value.strip())
    print("create or update kv config to namespace success.")


@verb(
    "deleteKvConfig",
    "Delete KV config.",
    option("-s", "namespace", "set the namespace", required=True),
    option("-k", "key", "set the key name", required=True),
)
async def delete_kv_config(admin: Admin, args: argparse.Namespace) -> None:
    await admin.delete_kv_config(args.namespace.strip(), args.key.strip())
    print("delete kv config from namespace success.")


@verb(
    "updateOrderConf",
    "Create or update or delete order conf",
    option("-t", "topic", "topic name", required=True),
    option("-v", "orderConf", "set order conf [eg. brokerName1:num;brokerName2:num]"),
    option("-m", "method", "option type [eg. put|get|delete", required=True),
)
async def update_order_conf(admin: Admin, args: argparse.Namespace) -> None:
    """The topic's ORDER_TOPIC_CONFIG entry on the name servers. RocketMQ's prints
    these lines without a line break; ours ends them with one."""
    topic, method = args.topic.strip(), args.method.strip()
    if method == "get":
        conf = await admin.kv_config(ORDER_TOPIC_CONFIG, topic)
        print(f"get orderConf success. topic=[{topic}], orderConf=[{conf}] ")
    elif method == "put":
        conf = (args.orderConf or "").strip()
        if not conf:
            raise UsageError("please set orderConf with option -v.")
        await admin.put_kv_config(ORDER_TOPIC_CONFIG, topic, conf)
        print(f"update orderConf success. topic=[{topic}], orderConf=[{conf}]")
    elif method == "delete":
        await admin.delete_kv_config(ORDER_TOPIC_CONFIG, topic)
        print(f"delete orderConf success. topic=[{topic}]")
    else:
        raise UsageError(f"-m {method!r}: expected put, get or delete")


async def _change_write_perm(admin: Admin, broker_name: str, writable: bool) -> int | None:
    what = "add" if writable else "wipe"
    status = None
    for address in admin.namesrv_addrs:
        try:
            count = await admin.change_write_perm(address, broker_name, writable)
        except (MQClientError, RemotingConnectError, RemotingTimeoutError) as exc:
            print(f"{what} write perm of broker[{broker_name}] in name server[{address}] Failed")
            print(f"  {exc}")
            status = EXIT_ANSWERED_ERROR
            continue
        print(f"{what} write perm of broker[{broker_name}] in name server[{address}] OK, {count}")
    return status


@verb(
    "wipeWritePerm",
    "Wipe write perm of broker in all name server",
    option("-b", "brokerName", "broker name", required=True),
)
async def wipe_write_perm(admin: Admin, args: argparse.Namespace) -> int | None:
    """Every name server's routes show the broker group's queues read-only, so
    producers send elsewhere while consumers drain it (before maintenance)."""
    return await _change_write_perm(admin, args.brokerName.strip(), writable=False)


@verb(
    "addWritePerm",
    "Add write perm of broker in all name server you defined in the -n param",
    option("-b", "brokerName", "broker name", required=True),
)
async def add_write_perm(admin: Admin, args: argparse.Namespace) -> int | None:
    return await _change_write_perm(admin, args.brokerName.strip(), writable=True)


def _namesrv_list(args: argparse.Namespace) -> list[str]:
    """The -n list, as the config verbs address each name server by it."""
    return [a.strip() for a in (args.namesrvAddr or "").split(";") if a.strip()]


@verb("getNamesrvConfig", "Get configs of name server.")
async def get_namesrv_config(admin: Admin, args: argparse.Namespace) -> None:
    for address, config in (await admin.namesrv_configs(_namesrv_list(args))).items():
        print(f"============{address}============")
        for key, value in config.items():
            print_row("%-50s=  %s", key, value)


@verb(
    "updateNamesrvConfig",
    "Update configs of name server.",
    option("-k", "key", "config key", required=True),
    option("-v", "value", "config value", required=True),
)
async def update_namesrv_config(admin: Admin, args: argparse.Namespace) -> None:
    key, value = args.key.strip(), args.value.strip()
    addrs = _namesrv_list(args)
    await admin.update_namesrv_config({key: value}, addrs)
    shown = f"[{', '.join(addrs)}]" if addrs else ""
    print(f"update name server config success!{shown}\n{key} : {value}")
