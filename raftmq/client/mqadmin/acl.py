"""ACL verbs: updateAclConfig, deleteAclConfig (alias deleteAccessConfig),
updateGlobalWhiteAddr, clusterAclConfigVersion and 4.6's getAccessConfigSubCommand.

Changes go to the master of each broker group (or the broker given with -b), which puts
them through the replicated log, so every member's plain_acl.yml gets them. The brokers
answer these requests only for an admin account: sign with one (`mqadmin --accessKey A
--secretKey S updateAclConfig ...`, or $ROCKETMQ_HOME/conf/tools.yml).
"""

from __future__ import annotations

import argparse
import datetime
import json

from raftmq.client.admin import Admin
from raftmq.client.mqadmin.commands import (
    broker_or_cluster,
    option,
    print_row,
    target_kwargs,
    verb,
)
from raftmq.remoting.codes import RequestCode

# The account's fields (CreateAccessConfigRequestHeader), by UpdateAccessConfigSubCommand's
# flags; `admin` goes as given, the broker reads it as Boolean.parseBoolean does.
ACCOUNT_OPTIONS = (
    option("-a", "accessKey", "set accessKey in acl config file", required=True),
    option("-s", "secretKey", "set secretKey in acl config file"),
    option("-w", "whiteRemoteAddress", "set white ip Address for account in acl config file"),
    option("-i", "defaultTopicPerm", "set default topicPerm in acl config file"),
    option("-u", "defaultGroupPerm", "set default GroupPerm in acl config file"),
    option("-t", "topicPerms", "set topicPerms list,eg: topicA=DENY,topicD=SUB"),
    option("-g", "groupPerms", "set groupPerms list,eg: groupD=DENY,groupD=SUB"),
    option("-m", "admin", "set admin flag in acl config file", default="false"),
)


@verb(
    "updateAclConfig",
    "Update acl config yaml file in broker",
    *broker_or_cluster(
        "update acl config file to which broker", "update acl config file to which cluster"
    ),
    *ACCOUNT_OPTIONS,
)
async def update_acl_config(admin: Admin, args: argparse.Namespace) -> None:
    names = [name for _flag, name, _help, _kwargs in ACCOUNT_OPTIONS]
    given = {name: getattr(args, name) for name in names}
    ext = {name: value.strip() for name, value in given.items() if value is not None}
    targets = await admin.acl_change(
        RequestCode.UPDATE_AND_CREATE_ACL_CONFIG, ext, **target_kwargs(args)
    )
    for address in targets:
        print(f"create or update plain access config to {address} success.")
    shown = {k: v for k, v in ext.items() if k != "secretKey"}  # no secret on a terminal
    print(f"PlainAccessConfig{shown}")


@verb(
    "deleteAclConfig",
    "Delete Acl Config Account in broker",
    *broker_or_cluster(
        "delete acl config account from which broker",
        "delete acl config account from which cluster",
    ),
    option(
        "-a",
        "accessKey",
        "set accessKey in acl config file for deleting which account",
        required=True,
    ),
    alias="deleteAccessConfig",
)
async def delete_acl_config(admin: Admin, args: argparse.Namespace) -> None:
    access_key = args.accessKey.strip()
    targets = await admin.acl_change(
        RequestCode.DELETE_ACL_CONFIG, {"accessKey": access_key}, **target_kwargs(args)
    )
    for address in targets:
        print(f"delete plain access config account from {address} success.")
    print(f"account's accesskey is:{access_key}")


@verb(
    "updateGlobalWhiteAddr",
    "Update global white address for acl Config File in broker",
    *broker_or_cluster(
        "update global white address to which broker",
        "update global white address to which cluster",
    ),
    option(
        "-g",
        "globalWhiteRemoteAddresses",
        "set globalWhiteRemoteAddress list,eg: 10.10.103.*,192.168.0.*",
        required=True,
    ),
    option(
        "-p",
        "aclFileFullPath",
        "update global white address of specified acl file,eg: /xxx/plain_test.yml",
    ),
)
async def update_global_white_addr(admin: Admin, args: argparse.Namespace) -> None:
    ext = {"globalWhiteAddrs": args.globalWhiteRemoteAddresses.strip()}
    if args.aclFileFullPath:
        ext["aclFileFullPath"] = args.aclFileFullPath.strip()
    code = RequestCode.UPDATE_GLOBAL_WHITE_ADDRS_CONFIG
    for address in await admin.acl_change(code, ext, **target_kwargs(args)):
        print(f"update global white remote addresses to {address} success.")


@verb(
    "clusterAclConfigVersion",
    "List all of acl config version information in cluster",
    *broker_or_cluster(
        "query acl config version for which broker",
        "query acl config version for specified cluster",
    ),
)
async def cluster_acl_config_version(admin: Admin, args: argparse.Namespace) -> None:
    answers = await admin.acl_answers(
        RequestCode.GET_BROKER_CLUSTER_ACL_INFO, **target_kwargs(args)
    )
    fmt = "%-16s  %-22s  %-22s  %-20s  %-22s  %-22s"
    print_row(fmt, "#Cluster Name", "#Broker Name", "#Broker Addr", "#AclFilePath",
              "#AclConfigVersionNum", "#AclLastUpdateTime")  # fmt: skip
    for answer in answers:
        ext = answer.ext_fields
        for path, version in json.loads(ext.get("allAclFileVersion") or "{}").items():
            moment = datetime.datetime.fromtimestamp(int(version["timestamp"]) / 1000)
            print_row(fmt, ext.get("clusterName"), ext.get("brokerName"), ext.get("brokerAddr"),
                      path, version["counter"], f"{moment:%Y-%m-%d %H:%M:%S}")  # fmt: skip
    print("get cluster's plain access config version success.")


@verb(
    "getAccessConfigSubCommand",
    "List all of acl config information in cluster",
    *broker_or_cluster(
        "query acl config version for which broker",
        "query acl config version for specified cluster",
    ),
)
async def get_access_config(admin: Admin, args: argparse.Namespace) -> None:
    code = RequestCode.GET_BROKER_CLUSTER_ACL_CONFIG
    for answer in await admin.acl_answers(code, **target_kwargs(args)):
        body = json.loads(answer.body)
        print()
        white = _java_text(body.get("globalWhiteAddrs") or [])
        print_row("%-20s: %s", "globalWhiteRemoteAddresses", white)
        print()
        print("accounts:")
        for config in body.get("plainAccessConfigs") or []:
            for name, value in config.items():
                print_row("%-1s %-18s: %s", "", name, _java_text(value))
            print()


def _java_text(value) -> str:
    """A field as the Java tool prints it (`String.valueOf`, List.toString)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_java_text(v) for v in value) + "]"
    return str(value)
