"""Three controllers in one process, over real TCP: RocketMQ's requests on the DLedger
peer port, answered by the leader once the events are committed and applied on it,
CONTROLLER_NOT_LEADER from the others, the same state on every controller, and the
controller's own election when a master's connection closes."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from raftmq.broker.replicas_manager import lease_margin_s
from raftmq.controller import events
from raftmq.controller.config import ControllerConfig
from raftmq.controller.replicas import ReplicasInfo
from raftmq.controller.server import ControllerServer

from raftmq.remoting.client import RemotingClient
from raftmq.remoting.codes import RequestCode as Q
from raftmq.remoting.codes import ResponseCode as R
from raftmq.remoting.processor import ProcessorTable
from raftmq.remoting.server import RemotingServer
from raftmq.tools.dledger_local import free_ports
from tests.helpers import CLUSTER, GROUP, alter, elect, heartbeat, join, request, wait_for


def controllers(tmp_path, count: int = 3, **config) -> list[ControllerServer]:
    ports = free_ports(count)
    peers = {f"n{i}": f"127.0.0.1:{p}" for i, p in enumerate(ports)}
    return [
        ControllerServer(
            ControllerConfig(
                group="group1",
                peers=peers,
                self_id=f"n{i}",
                store_path=str(tmp_path / f"n{i}"),
                mapped_file_size=1 << 20,
                **config,
            )
        )
        for i in range(count)
    ]


async def leader_of(servers: list[ControllerServer]) -> ControllerServer:
    await wait_for(lambda: any(s.leading() for s in servers), timeout_s=10)
    return next(s for s in servers if s.leading())


@pytest.mark.slow
async def test_three_controllers_serve_rocketmq_requests_on_the_peer_port(tmp_path):
    servers = controllers(tmp_path)
    async with trio.open_nursery() as nursery:
        for s in servers:
            await nursery.start(s.serve)
        leader = await leader_of(servers)
        follower = next(s for s in servers if s is not leader)
        async with (
            RemotingClient(f"127.0.0.1:{leader.port}") as client,
            RemotingClient(f"127.0.0.1:{follower.port}") as other,
        ):
            meta = await other.invoke(request(Q.CONTROLLER_GET_METADATA_INFO))
            assert meta.code == R.SUCCESS and meta.ext_fields["isLeader"] == "false"
            assert meta.ext_fields["controllerLeaderId"] == leader.config.self_id
            assert meta.ext_fields["controllerLeaderAddress"] == f"127.0.0.1:{leader.port}"
            refused = await other.invoke(
                request(Q.CONTROLLER_GET_NEXT_BROKER_ID, clusterName=CLUSTER, brokerName=GROUP)
            )
            assert refused.code == R.CONTROLLER_NOT_LEADER
            assert refused.ext_fields["controllerLeaderAddress"] == f"127.0.0.1:{leader.port}"

            for broker_id in (1, 2):
                address = f"127.0.0.1:{10910 + broker_id}"
                await join(client, broker_id, address)
                heartbeat(client, broker_id, address)
            elected = await elect(client, 1)
            assert elected.code == R.SUCCESS, elected.remark
            assert elected.ext_fields["masterEpoch"] == "1"
            assert json.loads(elected.body)["brokerMemberGroup"]["brokerAddrs"] == {
                "1": "127.0.0.1:10911",
                "2": "127.0.0.1:10912",
            }
            altered = await alter(client, [1, 2], 1)
            assert altered.code == R.SUCCESS, altered.remark
            assert altered.ext_fields["newSyncStateSetEpoch"] == "2"
            fenced = await alter(client, [1], 1)
            assert fenced.code == R.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            data = await client.invoke(
                request(Q.CONTROLLER_GET_SYNC_STATE_DATA, json.dumps([GROUP]).encode())
            )
            table = json.loads(data.body)["replicasInfoTable"][GROUP]
            assert table["masterBrokerId"] == 1 and table["syncStateSetEpoch"] == 2
            assert [r["brokerId"] for r in table["inSyncReplicas"]] == [1, 2]
            assert all(r["alive"] for r in table["inSyncReplicas"])
            for bad in (
                request(Q.CONTROLLER_ELECT_MASTER, clusterName=CLUSTER),
                request(Q.CONTROLLER_ELECT_MASTER, brokerName=GROUP, brokerId="one"),
                request(Q.CONTROLLER_ALTER_SYNC_STATE_SET, b"{", brokerName=GROUP,
                        masterBrokerId=1, masterEpoch=1),
                request(Q.CONTROLLER_GET_SYNC_STATE_DATA, b'{"a":1}'),
                request(Q.BROKER_HEARTBEAT, clusterName=CLUSTER, brokerName=GROUP, brokerAddr="x"),
            ):  # fmt: skip
                answer = await client.invoke(bad)
                assert answer.code == R.CONTROLLER_INVALID_REQUEST and answer.remark
        await wait_for(lambda: all(s.applied_index == leader.applied_index for s in servers))
        assert all(s.state.snapshot() == leader.state.snapshot() for s in servers)
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_masters_closed_connection_elects_the_other_member_and_notifies_it(tmp_path):
    servers = controllers(tmp_path)
    notified = []

    async def on_notify(req, connection):
        notified.append((dict(req.ext_fields), json.loads(req.body)))

    broker = RemotingServer(
        "127.0.0.1", 0, ProcessorTable({Q.NOTIFY_BROKER_ROLE_CHANGED: on_notify})
    )
    async with trio.open_nursery() as nursery:
        broker_port = await nursery.start(broker.serve)
        for s in servers:
            await nursery.start(s.serve)
        leader = await leader_of(servers)
        for s in servers:  # heard long enough: a silent broker may be taken for dead
            s.liveness.started_ms -= 60_000
        slave_addr = f"127.0.0.1:{broker_port}"
        async with RemotingClient(f"127.0.0.1:{leader.port}") as client:
            await join(client, 1, "127.0.0.1:1")
            await join(client, 2, slave_addr)
            heartbeat(client, 2, slave_addr, epoch=1, maxOffset=100)
            async with RemotingClient(f"127.0.0.1:{leader.port}") as master:
                heartbeat(master, 1, "127.0.0.1:1", epoch=1, maxOffset=100)
                await wait_for(lambda: leader.alive(CLUSTER, GROUP, 1))
                elected = await elect(client, 1)
                assert elected.code == R.SUCCESS
                altered = await alter(client, [1, 2], 1)
                assert altered.code == R.SUCCESS
                await wait_for(lambda: notified)  # broker 2 heard of master 1
                assert notified[0][0]["masterBrokerId"] == "1"
            # the master's connection closed: the leader elects broker 2 and tells it
            await wait_for(lambda: leader.state.sync_states[GROUP].master_broker_id == 2)
            await wait_for(lambda: len(notified) == 2, timeout_s=5)
            header, body = notified[1]
            assert header["masterBrokerId"] == "2" and header["masterEpoch"] == "2"
            assert header["masterAddress"] == slave_addr
            assert body == {"syncStateSet": [2], "syncStateSetEpoch": 3}
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_hostile_bytes_on_the_shared_port_end_their_connection_only(tmp_path):
    servers = controllers(tmp_path, count=1)
    [server] = servers
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        await leader_of(servers)
        for junk in (
            b"\x00\x00",  # less than a header, then closed
            b"\x00\x00\x00\x08\x00\x00\x00\x04{{{{",  # a remoting frame, its header no JSON
            b"\x00\x00\x00\x05\x01\x00\x00\x00\x01\xff",  # a binary header, cut short
            b"\x00\x00\x00\x02\x00\x91\x00",  # a peer frame of junk
            b"\xff" * 64,
        ):
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            await stream.send_all(junk)
            await stream.aclose()
        async with RemotingClient(f"127.0.0.1:{server.port}") as client:
            answer = await client.invoke(request(Q.CONTROLLER_GET_METADATA_INFO))
            assert answer.code == R.SUCCESS and answer.ext_fields["isLeader"] == "true"
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_restarted_controller_takes_no_unheard_master_for_dead(tmp_path):
    """RocketMQ #5712: a controller leading right after its start has heard only some
    brokers; here it elects no replacement for a master it has not heard until it has
    listened for a heartbeat timeout. Then a master whose heartbeats stop (timeout
    300 ms) is replaced by the scan."""
    [first] = controllers(tmp_path, count=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(first.serve)
        await leader_of([first])
        async with RemotingClient(f"127.0.0.1:{first.port}") as client:
            for broker_id in (1, 2):
                await join(client, broker_id, f"127.0.0.1:{10910 + broker_id}")
                heartbeat(client, broker_id, f"127.0.0.1:{10910 + broker_id}")
            assert (await elect(client, 1)).code == R.SUCCESS
            assert (await alter(client, [1, 2], 1)).code == R.SUCCESS
            nursery.cancel_scope.cancel()
    restarted = ControllerServer(
        attrs.evolve(first.config, scan_inactive_master_interval_ms=50,
                     scan_not_active_broker_interval_ms=50)
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.serve)
        await leader_of([restarted])
        assert restarted.state.sync_states[GROUP].master_broker_id == 1  # replayed
        async with RemotingClient(f"127.0.0.1:{restarted.port}") as client:
            heartbeat(client, 2, "127.0.0.1:10912")  # broker 1's heartbeat is yet to come
            await wait_for(lambda: restarted.alive(CLUSTER, GROUP, 2))
            await trio.sleep(0.3)  # six scans
            assert restarted.state.sync_states[GROUP].master_broker_id == 1
            heartbeat(client, 1, "127.0.0.1:10911", heartbeatTimeoutMills=300)
            await wait_for(lambda: restarted.alive(CLUSTER, GROUP, 1))
            heartbeat(client, 2, "127.0.0.1:10912", heartbeatTimeoutMills=60_000)
            # every member heard: broker 1's heartbeats stop, its timeout passes
            await wait_for(lambda: restarted.state.sync_states[GROUP].master_broker_id == 2)
            assert restarted.state.sync_states[GROUP].master_epoch == 2
        nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_silent_master_is_taken_for_dead_when_its_timeout_passes_not_at_the_next_scan(
    tmp_path,
):
    """RocketMQ looks for lapsed heartbeats every scanNotActiveBrokerInterval (5 s), so
    a silent master is replaced up to 5 s after its timeout; here the scan wakes when
    the first timeout is due, even one that a new broker's first heartbeat brings
    before the wake already planned."""
    [server] = controllers(tmp_path, count=1)
    assert server.config.scan_not_active_broker_interval_ms == 5000
    timeout_ms = 400
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        await leader_of([server])
        async with RemotingClient(f"127.0.0.1:{server.port}") as client:
            heartbeat(client, 2, "127.0.0.1:10912", heartbeatTimeoutMills=60_000)
            await wait_for(lambda: server.alive(CLUSTER, GROUP, 2))
            await trio.sleep(0.1)  # the scan now sleeps its whole interval
            for broker_id in (1, 2):
                await join(client, broker_id, f"127.0.0.1:{10910 + broker_id}")
            heartbeat(client, 1, "127.0.0.1:10911", heartbeatTimeoutMills=timeout_ms)
            assert (await elect(client, 1)).code == R.SUCCESS
            assert (await alter(client, [1, 2], 1)).code == R.SUCCESS
            heartbeat(client, 1, "127.0.0.1:10911", heartbeatTimeoutMills=timeout_ms)
            silent_since = trio.current_time()  # broker 1's last heartbeat
            with trio.fail_after(4):  # before RocketMQ's scan would have looked
                await wait_for(lambda: server.state.sync_states[GROUP].master_broker_id == 2)
            taken_s = trio.current_time() - silent_since
            print(f"master replaced {taken_s * 1000:.0f} ms after its last heartbeat")
            assert taken_s >= timeout_ms / 1000
        nursery.cancel_scope.cancel()


async def serve_until_stopped(server: ControllerServer, scopes: dict, task_status) -> None:
    """`server.serve` under a scope of its own in `scopes`: one controller stopped alone."""
    with trio.CancelScope() as scopes[server]:
        await server.serve(task_status=task_status)


@pytest.mark.slow
async def test_a_new_leader_elects_no_master_before_the_lease_its_predecessor_gave_ends(
    tmp_path,
):
    """The master reaches the controller leader only (cut off from the two others),
    whose answers keep its lease; then that leader stops. The new leader never heard
    the master for a heartbeat timeout, yet the master may hold a lease from the last
    answer of the old leader: it elects the slave only once that lease is over
    (`broker.replicas_manager`'s rule), not at once (two masters acknowledging)."""
    timeout_ms, interval_s = 2000, 0.2
    servers = controllers(
        tmp_path, scan_inactive_master_interval_ms=50, scan_not_active_broker_interval_ms=50
    )
    scopes: dict = {}
    async with trio.open_nursery() as nursery:
        for s in servers:
            await nursery.start(serve_until_stopped, s, scopes)
        leader = await leader_of(servers)
        others = [s for s in servers if s is not leader]
        async with (
            RemotingClient(f"127.0.0.1:{leader.port}") as to_leader,
            RemotingClient(f"127.0.0.1:{others[0].port}") as to_first,
            RemotingClient(f"127.0.0.1:{others[1].port}") as to_second,
        ):

            def beat(client: RemotingClient, broker_id: int) -> None:
                address = f"127.0.0.1:{10910 + broker_id}"
                heartbeat(client, broker_id, address, heartbeatTimeoutMills=timeout_ms)

            for broker_id in (1, 2):
                await join(to_leader, broker_id, f"127.0.0.1:{10910 + broker_id}")
                for client in (to_leader, to_first, to_second):
                    beat(client, broker_id)  # every controller has heard every member
            assert (await elect(to_leader, 1)).code == R.SUCCESS
            assert (await alter(to_leader, [1, 2], 1)).code == R.SUCCESS
            # a heartbeat timeout and more: broker 1 heartbeats and polls the leader only
            # (as ReplicasManager does, the poll right behind a heartbeat), broker 2 all
            cut_off_until = trio.current_time() + timeout_ms / 1000 + 0.5
            while trio.current_time() < cut_off_until:
                for client in (to_leader, to_first, to_second):
                    beat(client, 2)
                polled_at = trio.current_time()
                beat(to_leader, 1)
                info = await to_leader.invoke(
                    request(Q.CONTROLLER_GET_REPLICA_INFO, brokerName=GROUP)
                )
                assert info.code == R.SUCCESS and info.ext_fields["masterBrokerId"] == "1"
                await trio.sleep(interval_s)
            timeout_s = timeout_ms / 1000
            lease_end = polled_at + timeout_s - lease_margin_s(timeout_s, interval_s)
            scopes[leader].cancel()

            def elected() -> bool:
                return any(s.state.sync_states[GROUP].master_broker_id == 2 for s in others)

            with trio.fail_after(3 * timeout_s + 5):
                while not elected():
                    beat(to_first, 2)
                    beat(to_second, 2)
                    await trio.sleep(0.02)
            elected_at = trio.current_time()
            assert elected_at >= lease_end, (
                f"broker 2 elected {lease_end - elected_at:.2f} s before broker 1's lease ended"
            )
        nursery.cancel_scope.cancel()


FIELD_NAMES = [
    "clusterName", "brokerName", "brokerId", "brokerAddr", "brokerAddress", "masterBrokerId",
    "masterEpoch", "appliedBrokerId", "registerCheckCode", "designateElect", "epoch",
    "maxOffset", "heartbeatTimeoutMills", "brokerControllerIdsToClean", "isCleanLivingBroker",
]  # fmt: skip
CONTROLLER_CODES = [
    Q.BROKER_HEARTBEAT, Q.CONTROLLER_ALTER_SYNC_STATE_SET, Q.CONTROLLER_ELECT_MASTER,
    Q.CONTROLLER_REGISTER_BROKER, Q.CONTROLLER_GET_REPLICA_INFO, Q.CONTROLLER_GET_METADATA_INFO,
    Q.CONTROLLER_GET_SYNC_STATE_DATA, Q.UPDATE_CONTROLLER_CONFIG, Q.GET_CONTROLLER_CONFIG,
    Q.CLEAN_BROKER_DATA, Q.CONTROLLER_GET_NEXT_BROKER_ID, Q.CONTROLLER_APPLY_BROKER_ID,
]  # fmt: skip
field_values = st.one_of(
    st.sampled_from(["", "-1", "0", "1", "2", "true", "x", GROUP, CLUSTER, "1;2", "9" * 30]),
    st.text(max_size=8),
)
bodies = st.one_of(
    st.just(b""),
    st.binary(max_size=16),
    st.sampled_from([b"[]", b'["broker-a"]', b"{}", b'{"syncStateSet":[1],"syncStateSetEpoch":0}',
                     b'{"syncStateSet":"x"}', b"null", b"a=b\nenableElectUncleanMaster=x"]),
)  # fmt: skip
requests = st.builds(
    request,
    st.sampled_from(CONTROLLER_CODES),
    bodies,
    **{name: st.one_of(st.none(), field_values) for name in FIELD_NAMES},
)


@pytest.mark.slow
@settings(max_examples=10)
@given(st.lists(requests, min_size=1, max_size=30))
def test_any_request_gets_an_answer_and_the_controller_keeps_serving(tmp_path_factory, batch):
    """RocketMQ codes and remarks for whatever the fields and bodies hold; the state
    stays consistent (replayed from the log, it is the same)."""

    async def run() -> None:
        [server] = controllers(tmp_path_factory.mktemp("fuzz"), count=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve)
            await leader_of([server])
            async with RemotingClient(f"127.0.0.1:{server.port}") as client:
                await join(client, 1, "127.0.0.1:10911")
                for command in batch:
                    command.ext_fields = {
                        k: v for k, v in command.ext_fields.items() if v != "None"
                    }
                    if command.code == Q.BROKER_HEARTBEAT:
                        client.invoke_oneway(command)
                        continue
                    answer = await client.invoke(command)
                    assert answer.code in set(R), answer
                    assert answer.code == R.SUCCESS or answer.remark, answer
                meta = await client.invoke(request(Q.CONTROLLER_GET_METADATA_INFO))
                assert meta.ext_fields["isLeader"] == "true"
            replayed = ReplicasInfo(server.config.enable_elect_unclean_master)
            for index in range(server.dledger.store.begin_index, server.applied_index + 1):
                entry = server.dledger.store.get(index)
                if entry.body:
                    replayed.apply(events.decode(entry.body))
            assert replayed.snapshot() == server.state.snapshot()
            nursery.cancel_scope.cancel()

    trio.run(run)
