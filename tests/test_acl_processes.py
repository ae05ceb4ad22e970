"""ACL on real processes: a three-broker DLedger group with `aclEnable=true`, changed
with the `mqadmin` command line, then the master killed: the new master enforces the
accounts the old one was told about, the living members' plain_acl.yml files converge, and
a change made after the kill reaches them too."""

from __future__ import annotations

import pytest
import trio
import yaml

from raftmq.client import Producer, SendError, SessionCredentials
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import mqadmin

pytestmark = [pytest.mark.processes, pytest.mark.untimed]

CLUSTER = "RaftCluster"
ADMIN = SessionCredentials("adminUser", "adminSecret1")
NEW_USER = SessionCredentials("newUser1", "newSecret1")
OLD_USER = SessionCredentials("oldUser1", "oldSecret1")
ACL = {
    "accounts": [
        {"accessKey": "adminUser", "secretKey": "adminSecret1", "admin": True},
        {"accessKey": "oldUser1", "secretKey": "oldSecret1", "defaultTopicPerm": "PUB"},
    ]
}


async def send(cluster: LocalCluster, credentials, topic: str, body: bytes, timeout_s=5.0):
    async with Producer(
        cluster.namesrv_addr, "PG", credentials=credentials, send_timeout_s=timeout_s
    ) as producer:
        return await producer.send(topic, body)


async def test_mqadmin_changes_reach_the_next_master(tmp_path):
    cluster = LocalCluster(
        tmp_path, nodes=3, cluster_name=CLUSTER, extra_conf={"aclEnable": "true"}, credentials=ADMIN
    )
    for node in cluster.ids:
        path = cluster.store_dir(node) / "conf" / "plain_acl.yml"
        path.parent.mkdir(parents=True)
        path.write_text(yaml.safe_dump(ACL))
    async with cluster:
        await cluster.create_topic("Orders", queues=2)
        await cluster.create_topic("Other", queues=1)
        await send(cluster, OLD_USER, "Orders", b"before")
        namesrv = ("-n", cluster.namesrv_addr, "-c", CLUSTER)

        unsigned = await mqadmin("updateAclConfig", *namesrv, "-a", "newUser1", "-s", "x1234567")
        assert unsigned.returncode == 1
        assert b"NO_PERMISSION" in unsigned.stderr and b"No accessKey" in unsigned.stderr
        signing = ("--accessKey", ADMIN.access_key, "--secretKey", ADMIN.secret_key)
        update = await mqadmin(
            *signing, "updateAclConfig", *namesrv, "-a", "newUser1", "-s", "newSecret1",
            "-i", "DENY", "-t", "Orders=PUB",
        )  # fmt: skip
        assert update.returncode == 0, update.stderr.decode()
        assert b"create or update plain access config to" in update.stdout
        delete = await mqadmin(*signing, "deleteAccessConfig", *namesrv, "-a", "oldUser1")
        assert delete.returncode == 0, delete.stderr.decode()
        versions = await mqadmin(*signing, "clusterAclConfigVersion", *namesrv)
        assert versions.returncode == 0, versions.stderr.decode()
        [row] = [line.split() for line in versions.stdout.decode().splitlines()[1:-1]]
        assert row[0] == CLUSTER and row[4] == "2"  # two changes so far

        result = await send(cluster, NEW_USER, "Orders", b"new user")
        assert result.queue_offset >= 0
        old_master = await cluster.wait_master()
        cluster.kill(old_master)
        new_master = await cluster.wait_master(timeout_s=30, not_node=old_master)
        assert new_master != old_master
        await send(cluster, NEW_USER, "Orders", b"after failover")
        with pytest.raises(SendError, match="No acl config for accessKey=oldUser1"):
            await send(cluster, OLD_USER, "Orders", b"deleted account", timeout_s=1)
        with pytest.raises(SendError, match="no PUB permission on topic:Other"):
            await send(cluster, NEW_USER, "Other", b"not allowed", timeout_s=1)
        white = await mqadmin(*signing, "updateGlobalWhiteAddr", *namesrv, "-g", "10.10.103.*")
        assert white.returncode == 0, white.stderr.decode()
        listed = await mqadmin(*signing, "getAccessConfigSubCommand", *namesrv)
        assert listed.returncode == 0, listed.stderr.decode()
        lines = [line.split() for line in listed.stdout.decode().splitlines()]
        assert ["globalWhiteRemoteAddresses:", "[10.10.103.*]"] in lines
        assert ["accessKey", ":", "newUser1"] in lines
        assert ["topicPerms", ":", "[Orders=PUB]"] in lines

        # the living members' files converge (each polls the log's document every second)
        living = [n for n in cluster.ids if n != old_master]

        def files(nodes):
            return [(cluster.store_dir(n) / "conf" / "plain_acl.yml").read_text() for n in nodes]

        with trio.fail_after(5):
            while len(set(files(living))) != 1 or "10.10.103" not in files(living)[0]:
                await trio.sleep(0.1)
    doc = yaml.safe_load(files(living)[0])
    assert [a["accessKey"] for a in doc["accounts"]] == ["adminUser", "newUser1"]
    assert doc["dataVersion"][0]["counter"] == 3
    # the killed master had written the two changes made before it died
    dead = yaml.safe_load(files([old_master])[0])
    assert dead["dataVersion"][0]["counter"] == 2 and dead["accounts"] == doc["accounts"]
