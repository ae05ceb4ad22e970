"""SQL92 subscriptions on the broker: pulls that carry their expression and pulls that
rely on the group's heartbeats, CHECK_CLIENT_CONFIG, the refusals (RocketMQ's codes,
remarks naming the problem), `enablePropertyFilter=false`, and our pull and push
consumers with `MessageSelector.by_sql`. In-process brokers over real TCP; the
failover test runs real processes."""

from __future__ import annotations

import json
import signal

import pytest
import trio
from raftmq.broker.store import commitlog

from raftmq import hotpath
from raftmq.client import MessageSelector, MQBrokerError, Producer, PullConsumer, PushConsumer
from raftmq.client.push import ConsumeFromWhere
from raftmq.protocol import message as codec
from raftmq.protocol.message import properties_to_string
from raftmq.remoting import RemotingClient, RemotingCommand, RequestCode, ResponseCode
from raftmq.tools.broker_local import LocalCluster
from tests.helpers import NO_ANSWER, create_topic, group, status, wait_for

pytestmark = pytest.mark.untimed

try:
    from raftmq.hotpath import _compiled
except ImportError:  # not built: the twin is what pulls run
    _compiled = None

SQL92_ON = {"enablePropertyFilter": "true"}
FLAG_SUBSCRIPTION = 4


def props(i: int) -> str:
    return properties_to_string({"a": str(i), "TAGS": f"t{i % 2}"})


async def filled(nursery, tmp_path, count: int = 10, **conf):
    """A one-member group with topic T (one queue) holding m0..m{count-1}, where message
    i has property a=i and tag t{i % 2}."""
    g = await group(nursery, tmp_path, nodes=1, **conf)
    await create_topic(g, "T", 1)
    for i in range(count):
        sent = await g.send(g.master(), "T", b"m%d" % i, props=props(i))
        assert sent.code == ResponseCode.SUCCESS
    await wait_for(lambda: g.master().store.max_offset("T", 0) == count)
    return g


async def sql_pull(g, expression: str, offset: int = 0, **extra):
    """A PULL_MESSAGE of T's queue 0 that carries its SQL92 expression."""
    ext = {"sysFlag": FLAG_SUBSCRIPTION, "expressionType": "SQL92", "subscription": expression}
    return await g.pull(g.master(), "T", 0, offset, **(ext | extra))


def bodies(response) -> list[bytes]:
    return [m.body for m in codec.decode_all(response.body)]


def heartbeat(client_id: str, subscriptions: list[dict], group_name: str = "CG") -> bytes:
    data = {
        "clientID": client_id,
        "consumerDataSet": [{"groupName": group_name, "subscriptionDataSet": subscriptions}],
        "producerDataSet": [],
    }
    return json.dumps(data).encode()


def sql_subscription(expression: str, version: int = 1000, topic: str = "T") -> dict:
    return {
        "topic": topic, "subString": expression, "expressionType": "SQL92",
        "subVersion": version, "tagsSet": [], "codeSet": [], "classFilterMode": False,
    }  # fmt: skip


async def test_a_pull_returns_the_matching_messages_and_moves_past_the_others(nursery, tmp_path):
    g = await filled(nursery, tmp_path, **SQL92_ON)
    found = await sql_pull(g, "a >= 3 AND a < 8 AND TAGS = 't1'")
    assert status(found) == (ResponseCode.SUCCESS, "10")
    assert bodies(found) == [b"m3", b"m5", b"m7"]
    one = await sql_pull(g, "a >= 3", maxMsgNums=1)
    assert (status(one), bodies(one)) == ((ResponseCode.SUCCESS, "4"), [b"m3"])
    none = await sql_pull(g, "a > 100")
    assert status(none) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "10")
    assert none.body in (b"", None)
    # RocketMQ's rules: no property is NULL, a value that does not convert is no match
    assert bodies(await sql_pull(g, "b IS NULL AND a IN ('0', '9')")) == [b"m0", b"m9"]
    assert status(await sql_pull(g, "TAGS > 1")) == (ResponseCode.PULL_RETRY_IMMEDIATELY, "10")
    # a TAG pull of the same queue still filters by tag hash only
    tagged = await g.pull(g.master(), "T", 0, 0, subscription="t0")
    assert bodies(tagged) == [b"m%d" % i for i in range(0, 10, 2)]


async def test_sql92_pulls_through_a_queue_take_the_matching_messages_in_order(
    nursery, tmp_path, monkeypatch
):
    """Pulls through 160 messages (4 KiB, from the 80th on 12 KiB, the 100th 300 KiB)
    take exactly the matching ones, in order, each starting where the last stopped:
    32 at most (reached among the small ones), 256 KiB at most (reached among the
    larger ones), the 300 KiB one alone. With the extension built, every pull is the
    compiled call's, never its twin's."""
    fallbacks = []
    if hotpath.COMPILED:
        twin = _compiled.TWINS["pull_body"]
        monkeypatch.setitem(
            _compiled.TWINS, "pull_body", lambda *a: fallbacks.append(a) or twin(*a)
        )
        assert commitlog.PULL_BODY is _compiled.pull_body
    g = await group(nursery, tmp_path, nodes=1, **SQL92_ON)
    await create_topic(g, "T", 1)
    count, large = 160, 100
    b_values = ["x", "y", "z", None]
    for i in range(count):
        properties = {"a": str(i), "TAGS": f"t{i % 3}", "b": b_values[i % 4]}
        props_text = properties_to_string({k: v for k, v in properties.items() if v})
        size_kib = 300 if i == large else 4 if i < 80 else 12
        sent = await g.send(
            g.master(), "T", b"m%d-" % i + b"." * (size_kib << 10), props=props_text
        )
        assert sent.code == ResponseCode.SUCCESS
    await wait_for(lambda: g.master().store.max_offset("T", 0) == count)
    expression = "(a > 40 AND a <= 130 AND TAGS <> 't0') OR b = 'z'"
    wanted = [i for i in range(count) if (40 < i <= 130 and i % 3 != 0) or i % 4 == 2]
    taken, offset, pulls = [], 0, []
    while offset < count:
        pulled = await sql_pull(g, expression, offset)
        assert pulled.code in (ResponseCode.SUCCESS, ResponseCode.PULL_RETRY_IMMEDIATELY)
        names = [int(body.split(b"-")[0][1:]) for body in bodies(pulled)]
        pulls.append((names, len(pulled.body or b"")))
        taken += names
        next_offset = int(pulled.ext_fields["nextBeginOffset"])
        assert next_offset > offset
        offset = next_offset
    assert taken == wanted
    assert max(len(names) for names, _size in pulls) == 32
    assert all(len(names) == 1 or size <= 256 << 10 for names, size in pulls)
    assert [large] in [names for names, _size in pulls]  # alone
    # the byte limit cut pulls of 12 KiB messages short of 32
    assert any(10 < len(names) < 32 and size > (256 - 13) << 10 for names, size in pulls)
    assert not fallbacks


async def test_a_held_pull_wakes_for_a_matching_message(nursery, tmp_path):
    g = await filled(nursery, tmp_path, count=2, **SQL92_ON)
    result = {}

    async def held():
        result["r"] = await sql_pull(g, "a = 7", 2, sysFlag=FLAG_SUBSCRIPTION | 2)

    async with trio.open_nursery() as inner:
        inner.start_soon(held)
        await trio.sleep(0.2)
        await g.send(g.master(), "T", b"m7", props=props(7))
    assert (status(result["r"]), bodies(result["r"])) == ((ResponseCode.SUCCESS, "3"), [b"m7"])


async def test_bad_expressions_are_refused_with_their_position(nursery, tmp_path):
    g = await filled(nursery, tmp_path, count=1, **SQL92_ON)
    refused = await sql_pull(g, "a > 'x'")
    assert refused.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert refused.remark == (
        "invalid SQL92 expression \"a > 'x'\": column 5: 'x' cannot be compared with >: "
        "only numbers can"
    )
    other = await g.pull(
        g.master(), "T", 0, 0, sysFlag=FLAG_SUBSCRIPTION, expressionType="CLASS", subscription="x"
    )
    assert other.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "'CLASS' is not supported" in other.remark
    # a heartbeat with a bad expression is refused whole: the member does not join
    b = g.master()
    body = heartbeat("c1", [sql_subscription("a >")])
    answer = await g.call(b, RequestCode.HEART_BEAT, body=body)
    assert answer.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert answer.remark.startswith("group CG, topic T: invalid SQL92 expression 'a >': column 4")
    assert b.clients.members("CG") == []
    for body, problem in (
        (b"[1]", "heartbeat body is not a JSON object"),
        (json.dumps({"consumerDataSet": ["CG"]}).encode(), "consumerDataSet entry is not"),
        (heartbeat("c1", ["a > 1"]), "subscriptionDataSet entry is not a JSON object"),
    ):
        answer = await g.call(b, RequestCode.HEART_BEAT, body=body)
        assert (answer.code, problem in answer.remark) == (ResponseCode.MESSAGE_ILLEGAL, True)


async def test_pulls_without_their_expression_use_the_heartbeats(nursery, tmp_path):
    g = await filled(nursery, tmp_path, **SQL92_ON)
    b = g.master()
    # the members' connections stay open: a member leaves its group when its closes
    async with RemotingClient(b.address) as one, RemotingClient(b.address) as two:

        async def call(client, code, ext=None, body=b""):
            request = RemotingCommand(code=code, ext_fields=dict(ext or {}), body=body)
            return await client.invoke(request, 10.0)

        async def pull(**extra):
            ext = {"consumerGroup": "CG", "topic": "T", "queueId": 0, "queueOffset": 0,
                   "maxMsgNums": 32, "sysFlag": 0, "expressionType": "SQL92", **extra}  # fmt: skip
            return await call(one, RequestCode.PULL_MESSAGE, ext)

        missing = await pull()
        assert missing.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
        assert "group: CG, topic: T" in missing.remark
        body = heartbeat("c1", [sql_subscription("a BETWEEN 2 AND 4", version=1000)])
        assert (await call(one, RequestCode.HEART_BEAT, body=body)).code == ResponseCode.SUCCESS
        assert bodies(await pull(subVersion=1000)) == [b"m2", b"m3", b"m4"]
        assert (await pull(subVersion=2000)).code == ResponseCode.SUBSCRIPTION_NOT_LATEST
        # a newer subscription from another member wins
        body = heartbeat("c2", [sql_subscription("a = 9", version=2000)])
        assert (await call(two, RequestCode.HEART_BEAT, body=body)).code == ResponseCode.SUCCESS
        assert bodies(await pull(subVersion=2000)) == [b"m9"]
        # the group now subscribes by tag: there is no SQL92 filter to apply
        tag = {"topic": "T", "subString": "*", "subVersion": 3000}
        assert (await call(two, RequestCode.HEART_BEAT, body=heartbeat("c2", [tag]))).code == 0
        assert (await pull(subVersion=3000)).code == ResponseCode.FILTER_DATA_NOT_EXIST


async def test_check_client_config_answers_as_a_subscription_would_be(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, **SQL92_ON)
    b = g.master()

    async def check(subscription) -> tuple[int, str | None]:
        body = json.dumps({"clientId": "c", "group": "CG", "subscriptionData": subscription})
        answer = await g.call(b, RequestCode.CHECK_CLIENT_CONFIG, body=body.encode())
        return answer.code, answer.remark

    assert (await check({"topic": "T", "subString": "*"}))[0] == ResponseCode.SUCCESS
    assert (await check(sql_subscription("a > 5 OR b IS NULL")))[0] == ResponseCode.SUCCESS
    code, remark = await check(sql_subscription("a >> 5"))
    assert code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "column 4: unexpected '>'" in remark
    assert (await check(None))[0] == ResponseCode.SUCCESS
    junk = await g.call(b, RequestCode.CHECK_CLIENT_CONFIG, body=b"{not json")
    assert junk.code == ResponseCode.MESSAGE_ILLEGAL
    assert junk.remark.startswith("CHECK_CLIENT_CONFIG body is not JSON")


async def test_sql92_is_refused_while_property_filters_are_disabled(nursery, tmp_path):
    g = await filled(nursery, tmp_path, count=1)  # enablePropertyFilter defaults to false
    b = g.master()
    remark = "The broker does not support consumer to filter message by SQL92"
    pulled = await sql_pull(g, "a > 5")
    assert (pulled.code, pulled.remark.split(" (")[0]) == (ResponseCode.SYSTEM_ERROR, remark)
    assert "enablePropertyFilter=false" in pulled.remark
    answer = await g.call(b, RequestCode.HEART_BEAT, body=heartbeat("c", [sql_subscription("a")]))
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert remark in answer.remark
    body = json.dumps({"subscriptionData": sql_subscription("a > 5")}).encode()
    checked = await g.call(b, RequestCode.CHECK_CLIENT_CONFIG, body=body)
    assert checked.code == ResponseCode.SYSTEM_ERROR
    tag = {"topic": "T", "subString": "*", "subVersion": 1}
    assert (await g.call(b, RequestCode.HEART_BEAT, body=heartbeat("c", [tag]))).code == 0


async def test_our_pull_and_push_consumers_select_by_sql(nursery, tmp_path):
    g = await group(nursery, tmp_path, nodes=1, **SQL92_ON)
    await create_topic(g, "S", 2)
    async with Producer(g.namesrv_addr, "PG") as producer:
        for i in range(20):
            await producer.send("S", b"m%d" % i, tags=f"t{i % 2}", properties={"a": str(i)})
    selector = MessageSelector.by_sql("a >= 10 AND TAGS = 't0'")
    expected = {b"m%d" % i for i in range(10, 20, 2)}
    async with PullConsumer(g.namesrv_addr, "PULLER") as puller:
        got, tags = set(), set()
        for mq in await puller.fetch_queues("S"):
            result = await puller.pull(mq, 0, subscription=selector)
            got |= {m.body for m in result.messages}
            assert result.next_begin_offset == 10  # past the messages it did not match
            by_tag = await puller.pull(mq, 0, subscription=MessageSelector.by_tag("t1"))
            tags |= {m.tags for m in by_tag.messages}
        assert got == expected
        assert tags == {"t1"}

    seen: list[bytes] = []

    async def handle(msgs) -> bool:
        seen.extend(m.body for m in msgs)
        return True

    async with PushConsumer(
        g.namesrv_addr, "PUSHER", "S", handle, selector,
        ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, long_poll_s=1.0,
    ):  # fmt: skip
        _version, registered = g.master().clients.subscription("PUSHER", "S")
        assert registered.expression == selector.expression  # from the heartbeat
        await wait_for(lambda: set(seen) == expected, 10)
        await trio.sleep(0.3)
    assert sorted(seen) == sorted(expected)  # each once, nothing else

    bad = PushConsumer(g.namesrv_addr, "BAD", "S", handle, MessageSelector.by_sql("a = = 1"))
    with pytest.raises(MQBrokerError) as refused:
        async with bad:
            pass
    assert refused.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED
    assert "column 5: unexpected '='" in refused.value.remark


def selected(kind: str, n: int) -> bool:
    """What FAILOVER_SELECTOR selects, in Python."""
    return kind == "red" or (kind == "blue" and n % 10 < 5 and n > 20)


FAILOVER_SELECTOR = "kind = 'red' OR kind = 'blue' AND digit < 5 AND n > 20"


@pytest.mark.processes
async def test_sql92_subscription_across_a_master_kill(tmp_path):
    """A producer sends while the master of a three-broker group is killed; a push
    consumer subscribed by SQL92 gets every acknowledged message that matches and not
    one that does not (whether its send was acknowledged or not)."""
    kinds = ("red", "blue", "green")
    sent: dict[bytes, tuple[str, int]] = {}  # every body a send was tried for
    acked: set[bytes] = set()
    seen: list[tuple[bytes, str, str]] = []

    async def handle(msgs) -> bool:
        seen.extend((m.body, m.properties.get("kind"), m.properties.get("n")) for m in msgs)
        return True

    async with LocalCluster(tmp_path, extra_conf=SQL92_ON) as cluster:
        await cluster.create_topic("F", 4)
        async with (
            Producer(cluster.namesrv_addr, "FPG", send_timeout_s=3.0) as producer,
            PushConsumer(
                cluster.namesrv_addr, "FCG", "F", handle, MessageSelector.by_sql(FAILOVER_SELECTOR),
                ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, long_poll_s=2.0,
            ),
        ):  # fmt: skip

            async def send(n: int) -> None:
                body, kind = b"f%d" % n, kinds[n % 3]
                sent[body] = (kind, n)
                properties = {"kind": kind, "n": str(n), "digit": str(n % 10)}
                try:
                    await producer.send("F", body, properties=properties)
                except NO_ANSWER:  # not acknowledged: may or may not be stored
                    return
                acked.add(body)

            n = 0
            while len(acked) < 150:
                await send(n)
                n += 1
            old = await cluster.wait_master()
            cluster.kill(old, signal.SIGKILL)
            killed_at_n, delivered_before_kill = n, len(seen)
            await cluster.wait_master(timeout_s=30.0, not_node=old)
            target = len(acked) + 150
            while len(acked) < target:
                await send(n)
                n += 1
            wanted = {b for b in acked if selected(*sent[b])}
            with trio.fail_after(60):
                while not wanted <= {body for body, _, _ in seen}:
                    await trio.sleep(0.1)
            await trio.sleep(1.0)  # room for a wrong delivery to show up

    delivered = {body for body, _, _ in seen}
    assert wanted <= delivered
    wrong = [body for body in delivered if not selected(*sent[body])]
    assert wrong == []
    for body, kind, number in seen:  # the delivered message is the one sent
        assert (kind, int(number)) == sent[body]
    assert delivered_before_kill > 0
    assert any(sent[body][1] >= killed_at_n for body in delivered)  # and after the kill
    print(
        f"\nSQL92 across a master kill: {len(sent)} sent, {len(acked)} acked, "
        f"{delivered_before_kill} delivered before the kill, "
        f"{len(wanted)} acked and matching all delivered, {len(delivered - wanted)} "
        f"matching but unacknowledged delivered, 0 not matching, "
        f"{len(seen) - len(delivered)} duplicates"
    )
