"""RocketMQ's plain ACL, piece by piece: the request signature, the white-list address
patterns, the permission each request code needs, the check of one request against
`plain_acl.yml`, and the document changes mqadmin asks for."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from raftmq.broker.acl.addresses import address_matcher, remote_host
from raftmq.broker.acl.permissions import (
    ANY,
    DENY,
    POP_CODES,
    PUB,
    SUB,
    check_permission,
    needed_resources,
    parse_resource_perms,
)
from raftmq.broker.acl.plain import (
    PlainAcl,
    version_of,
    with_account,
    with_global_white,
    without_account,
)
from raftmq.broker.cli import main as broker_main

from raftmq.client.mqadmin.commands import EXIT_USAGE
from raftmq.client.mqadmin.main import _credentials, _find, _leading_signing, main
from raftmq.protocol.headers import send_header_v2
from raftmq.remoting import RemotingCommand, RequestCode
from raftmq.remoting.signing import SessionCredentials, content_to_sign, sign, signature

# AclClientRPCHookTest's pull header, signed by account RocketMQ / 12345678 (the sample
# plain_acl.yml's). The expected values were computed with `openssl dgst -sha1 -hmac
# 12345678 -binary | base64` over "RocketMQ0group32120150000topic" (the values sorted by
# field name), then over that and the body "hello".
PULL_EXT = {
    "consumerGroup": "group", "topic": "topic", "queueId": 1, "queueOffset": 2,
    "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 15000,
    "subVersion": 0,
}  # fmt: skip
PULL_SIGNATURE = "LRXWMEK9Lcy+QAlAwS8qMOkpqyc="
PULL_WITH_BODY_SIGNATURE = "MV4sZ0L8ocDj1nizNImnvLzlmMk="
ROCKETMQ = SessionCredentials("RocketMQ", "12345678")


def test_signature_matches_a_vector_computed_with_openssl():
    request = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=dict(PULL_EXT))
    sign(request, ROCKETMQ)
    assert request.ext_fields["AccessKey"] == "RocketMQ"
    assert request.ext_fields["Signature"] == PULL_SIGNATURE
    with_body = RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=dict(PULL_EXT), body=b"hello")
    sign(with_body, ROCKETMQ)
    assert with_body.ext_fields["Signature"] == PULL_WITH_BODY_SIGNATURE


def test_signed_content_is_sorted_values_without_the_signature_then_the_body():
    ext = {"b": "2", "a": "1", "Signature": "old", "AccessKey": "ak", "c": True}
    assert content_to_sign(ext, b"BODY") == b"ak12trueBODY"
    assert content_to_sign(ext, b"", skip="c") == b"ak12"
    # signing again replaces the signature without covering the old one
    request = RemotingCommand(11, ext_fields=dict(PULL_EXT))
    sign(request, ROCKETMQ)
    sign(request, ROCKETMQ)
    assert request.ext_fields["Signature"] == PULL_SIGNATURE
    token = RemotingCommand(11, ext_fields={"topic": "t"})
    sign(token, SessionCredentials("RocketMQ", "12345678", "tok"))
    assert token.ext_fields["SecurityToken"] == "tok"
    assert token.ext_fields["Signature"] == signature(b"RocketMQtokt", "12345678")
    assert "12345678" not in repr(ROCKETMQ)


@pytest.mark.parametrize(
    "pattern, admitted, refused",
    [
        ("*", ["1.2.3.4", "::1"], []),
        ("*.*.*.*", ["10.0.0.1"], []),
        ("", [], ["127.0.0.1"]),
        (None, [], ["127.0.0.1"]),
        ("192.168.1.*", ["192.168.1.0", "192.168.1.255"], ["192.168.2.1", "10.0.0.1"]),
        ("192.168.*.*", ["192.168.7.9"], ["192.169.0.1"]),
        ("192.168.1-3.*", ["192.168.1.5", "192.168.3.200"], ["192.168.4.1", "192.168.0.1"]),
        ("192.168.1.10-20", ["192.168.1.10", "192.168.1.20"], ["192.168.1.9", "192.168.1.21"]),
        # RocketMQ ignores the parts after the first range; every part counts here
        ("192.168.1-3.5", ["192.168.2.5"], ["192.168.2.99"]),
        ("192.168.1.{1,2,3}", ["192.168.1.1", "192.168.1.3"], ["192.168.1.4"]),
        ("10.0.0.1,10.0.0.2", ["10.0.0.2"], ["10.0.0.3"]),
        ("127.0.0.1", ["127.0.0.1"], ["127.0.0.2", "::1"]),
        ("1050::5:600:300c:326b", ["1050:0:0:0:5:600:300c:326b"], ["1050::5:600:300c:326c"]),
        ("1050::5:600:300c:{1,2}", ["1050::5:600:300c:2"], ["1050::5:600:300c:3"]),
    ],
)
def test_address_patterns(pattern, admitted, refused):
    match = address_matcher(pattern)
    assert all(match(host) for host in admitted)
    assert not any(match(host) for host in refused)


@pytest.mark.parametrize(
    "pattern", ["192.168.1", "192.168.1.256", "192.168.5-1.*", "a.b.c.d", "1050::*", "10.0.0.x"]
)
def test_bad_address_patterns_are_errors_naming_them(pattern):
    with pytest.raises(ValueError, match="address pattern"):
        address_matcher(pattern)


def test_remote_host_strips_the_port():
    assert remote_host("10.1.2.3:5555") == "10.1.2.3"
    assert remote_host("[::1]:5555") == "::1"


def test_permission_rules():
    assert check_permission(PUB, PUB | SUB) and check_permission(SUB, SUB)
    assert not check_permission(PUB, SUB)
    assert not check_permission(SUB, DENY) and not check_permission(ANY, DENY | PUB)
    assert check_permission(ANY, SUB) and not check_permission(ANY, 0)
    perms = parse_resource_perms(["topicA=DENY", " topicB = PUB|SUB "], is_topic=True)
    assert perms == {"topicA": DENY, "topicB": PUB | SUB}
    assert parse_resource_perms(["g=SUB"], is_topic=False) == {"%RETRY%g": SUB}
    for bad in (["topicA"], ["topicA=PUBLISH"], ["=SUB"]):
        with pytest.raises(ValueError, match="topicPerms"):
            parse_resource_perms(bad, is_topic=True)


def _send(group: str, topic: str) -> dict:
    return send_header_v2(group, topic, 0, born_timestamp_ms=1)


def _request(code, ext=None, body=b""):
    return RemotingCommand(code, ext_fields=dict(ext or {}), body=body)


HEARTBEAT = json.dumps(
    {
        "clientID": "c",
        "consumerDataSet": [
            {"groupName": "cg", "subscriptionDataSet": [{"topic": "t1"}, {"topic": "%RETRY%cg"}]}
        ],
        "producerDataSet": [{"groupName": "pg"}],
    }
).encode()


@pytest.mark.parametrize(
    "request_, needed",
    [
        (_request(RequestCode.SEND_MESSAGE_V2, _send("pg", "t1")), {"t1": PUB}),
        (_request(RequestCode.SEND_BATCH_MESSAGE, _send("pg", "t1")), {"t1": PUB}),
        (_request(RequestCode.SEND_MESSAGE, {"topic": "t1"}), {"t1": PUB}),
        (_request(RequestCode.SEND_MESSAGE, {"topic": "%RETRY%cg"}), {"%RETRY%cg": SUB}),
        (
            _request(RequestCode.SEND_MESSAGE_V2, _send("pg", "%RETRY%cg")),
            {"%RETRY%cg": SUB},
        ),
        (_request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "cg"}), {"%RETRY%cg": SUB}),
        (
            _request(RequestCode.PULL_MESSAGE, {"topic": "t1", "consumerGroup": "cg"}),
            {"t1": SUB, "%RETRY%cg": SUB},
        ),
        (
            _request(RequestCode.UPDATE_CONSUMER_OFFSET, {"topic": "t1", "consumerGroup": "cg"}),
            {"t1": SUB, "%RETRY%cg": SUB},
        ),
        (_request(RequestCode.QUERY_MESSAGE, {"topic": "t1"}), {"t1": SUB}),
        (
            _request(RequestCode.HEART_BEAT, body=HEARTBEAT),
            {"%RETRY%cg": SUB, "t1": SUB},
        ),
        (_request(RequestCode.UNREGISTER_CLIENT, {"consumerGroup": "cg"}), {"%RETRY%cg": SUB}),
        (_request(RequestCode.UNREGISTER_CLIENT, {"producerGroup": "pg"}), {}),
        (
            _request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}),
            {"%RETRY%cg": SUB},
        ),
        (_request(RequestCode.GET_MAX_OFFSET, {"topic": "t1"}), {}),
        *[
            (_request(code, {"topic": "t1", "consumerGroup": "cg"}), {"t1": SUB, "%RETRY%cg": SUB})
            for code in sorted(POP_CODES)
        ],
        (
            _request(
                RequestCode.BATCH_ACK_MESSAGE,
                body=b'{"acks": [{"c": "cg", "t": "t1"}, {"c": "cg2", "t": "t2"}]}',
            ),
            {"t1": SUB, "%RETRY%cg": SUB, "t2": SUB, "%RETRY%cg2": SUB},
        ),
    ],
)
def test_what_each_request_code_needs(request_, needed):
    assert needed_resources(request_) == needed


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1]",
        b'{"consumerDataSet": [1]}',
        b'{"consumerDataSet": [{"groupName": 5}]}',
        b'{"consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{"topic": 7}]}]}',
    ],
)
def test_an_unreadable_heartbeat_is_an_error(body):
    with pytest.raises(ValueError, match="cannot read the heartbeat body"):
        needed_resources(_request(RequestCode.HEART_BEAT, body=body))


@pytest.mark.parametrize("body", [b"{not json", b"[1]", b'{"acks": [1]}', b'{"acks": [{"t": 7}]}'])
def test_an_unreadable_batch_ack_is_an_error(body):
    with pytest.raises(ValueError, match="cannot read the batch ack body"):
        needed_resources(_request(RequestCode.BATCH_ACK_MESSAGE, body=body))


SAMPLE = {
    "globalWhiteRemoteAddresses": ["10.10.103.*"],
    "accounts": [
        {
            "accessKey": "RocketMQ",
            "secretKey": 12345678,  # a YAML int, as in RocketMQ's sample file
            "whiteRemoteAddress": None,
            "admin": False,
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "SUB",
            "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
            "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"],
        },
        {"accessKey": "rocketmq2", "secretKey": "12345678", "admin": True},
        {"accessKey": "trusted1", "secretKey": "12345678", "whiteRemoteAddress": "192.168.1.*"},
    ],
}


def _signed(code, ext, credentials=ROCKETMQ, body=b""):
    request = _request(code, ext, body)
    sign(request, credentials)
    return request


def test_plain_acl_checks_in_rocketmq_order():
    acl = PlainAcl(SAMPLE)
    send_b = _send("pg", "topicB")
    host = "127.0.0.1"
    assert acl.refusal(_signed(RequestCode.SEND_MESSAGE_V2, send_b), host) is None
    # a globally white address needs no signature at all
    assert acl.refusal(_request(RequestCode.SEND_MESSAGE_V2, send_b), "10.10.103.7") is None
    unsigned = acl.refusal(_request(RequestCode.SEND_MESSAGE_V2, send_b), host)
    assert unsigned.startswith("No accessKey is configured")
    stranger = SessionCredentials("nobody00", "12345678")
    remark = acl.refusal(_signed(310, send_b, stranger), host)
    assert remark == "No acl config for accessKey=nobody00"
    wrong = SessionCredentials("RocketMQ", "87654321")
    assert "Check signature failed for accessKey=RocketMQ" in acl.refusal(
        _signed(310, send_b, wrong), host
    )
    tampered = _signed(RequestCode.SEND_MESSAGE_V2, send_b, body=b"x")
    tampered.body = b"y"
    assert "Check signature failed" in acl.refusal(tampered, host)
    # topicA=DENY, topicC=SUB only, defaultTopicPerm DENY
    for topic, perm in (("topicA", "PUB"), ("topicC", "PUB"), ("other", "PUB")):
        remark = acl.refusal(_signed(310, _send("pg", topic)), host)
        assert remark.startswith(f"accessKey=RocketMQ has no {perm} permission on topic:{topic}")
    pull = {"topic": "topicC", "consumerGroup": "groupC"}
    assert acl.refusal(_signed(RequestCode.PULL_MESSAGE, pull), host) is None
    pull_a = {"topic": "topicC", "consumerGroup": "groupA"}
    remark = acl.refusal(_signed(RequestCode.PULL_MESSAGE, pull_a), host)
    assert "no SUB permission on group:groupA" in remark
    # defaultGroupPerm SUB covers a group not listed
    pull_x = {"topic": "topicB", "consumerGroup": "groupX"}
    assert acl.refusal(_signed(RequestCode.PULL_MESSAGE, pull_x), host) is None
    admin_only = _signed(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "t"})
    assert "Need admin permission for request code=17" in acl.refusal(admin_only, host)
    admin = SessionCredentials("rocketmq2", "12345678")
    assert acl.refusal(_signed(17, {"topic": "t"}, admin), host) is None
    assert acl.refusal(_signed(310, _send("pg", "anything"), admin), host) is None
    # the trace topic is open to PUB, as in RocketMQ
    trace = _send("pg", "RMQ_SYS_TRACE_TOPIC")
    assert acl.refusal(_signed(RequestCode.SEND_MESSAGE_V2, trace), host) is None


def test_an_accounts_white_address_spares_the_signature_but_not_the_permissions():
    acl = PlainAcl(SAMPLE)
    unsigned = _request(RequestCode.SEND_MESSAGE_V2, {**_send("pg", "t")})
    unsigned.ext_fields["AccessKey"] = "trusted1"
    assert acl.refusal(unsigned, "192.168.1.9") == (
        "accessKey=trusted1 has no PUB permission on topic:t (has DENY; request code 310)"
    )
    assert "Check signature failed" in acl.refusal(unsigned, "192.168.2.9")


def test_a_query_by_unique_key_is_accepted_signed_either_way():
    acl = PlainAcl(SAMPLE)
    ext = {"topic": "topicC", "key": "k", "maxNum": 32, "beginTimestamp": 0, "endTimestamp": 1}
    java = _signed(RequestCode.QUERY_MESSAGE, {**ext, "_UNIQUE_KEY_QUERY": "true"})
    assert acl.refusal(java, "127.0.0.1") is None
    broker_form = _signed(RequestCode.QUERY_MESSAGE, ext)
    broker_form.ext_fields["_UNIQUE_KEY_QUERY"] = "true"  # added after signing
    assert acl.refusal(broker_form, "127.0.0.1") is None


@pytest.mark.parametrize(
    "doc, error",
    [
        ({"accounts": [{"accessKey": "short", "secretKey": "12345678"}]}, "longer than 6"),
        ({"accounts": [{"accessKey": "RocketMQ"}]}, "must be given"),
        (
            {"accounts": [{"accessKey": "RocketMQ", "secretKey": "12345678", "admin": 1}] * 2},
            "defined twice",
        ),
        (
            {"accounts": [{"accessKey": "RocketMQ", "secretKey": "12345678", "topicPerms": "x"}]},
            "topicPerms",
        ),
        (
            {
                "accounts": [{"accessKey": "RocketMQ", "secretKey": "1234567", "x": 1}],
                "globalWhiteRemoteAddresses": ["300.1.1.1"],
            },
            "address pattern",
        ),
    ],
)
def test_bad_documents_are_refused(doc, error):
    with pytest.raises(ValueError, match=error):
        PlainAcl(doc)


def test_document_changes_move_the_data_version_on():
    doc = with_account({}, {"accessKey": "newUser1", "secretKey": "secret12", "admin": False})
    assert version_of(doc)["counter"] == 1
    doc = with_account(doc, {"accessKey": "newUser1", "topicPerms": ["t1=PUB"], "admin": False})
    [account] = doc["accounts"]
    assert account["secretKey"] == "secret12" and account["topicPerms"] == ["t1=PUB"]
    assert version_of(doc)["counter"] == 2
    with pytest.raises(ValueError, match="must be given"):
        with_account(doc, {"accessKey": "newUser2", "admin": False})
    with pytest.raises(ValueError, match="topicPerms"):
        with_account(doc, {"accessKey": "newUser1", "topicPerms": ["t1=WRITE"], "admin": False})
    doc = with_global_white(doc, ["10.0.0.*"])
    assert doc["globalWhiteRemoteAddresses"] == ["10.0.0.*"] and version_of(doc)["counter"] == 3
    with pytest.raises(ValueError, match="address pattern"):
        with_global_white(doc, ["10.0.0"])
    doc = without_account(doc, "newUser1")
    assert doc["accounts"] == [] and version_of(doc)["counter"] == 4
    with pytest.raises(KeyError):
        without_account(doc, "newUser1")


def test_mqadmin_signing_flags(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("ROCKETMQ_HOME", raising=False)
    args = SimpleNamespace(signAccessKey=None, signSecretKey=None)
    assert _credentials({}, args) is None
    given = _credentials({}, SimpleNamespace(signAccessKey="ak12345", signSecretKey="sk12345"))
    assert given == SessionCredentials("ak12345", "sk12345")
    leading, rest = _leading_signing(["--accessKey", "adm1234", "--secretKey=s3cret!", "x", "-a"])
    assert (leading, rest) == ({"accessKey": "adm1234", "secretKey": "s3cret!"}, ["x", "-a"])
    # RocketMQ's place for them: $ROCKETMQ_HOME/conf/tools.yml
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tools.yml").write_text("accessKey: rocketmq2\nsecretKey: 12345678\n")
    monkeypatch.setenv("ROCKETMQ_HOME", str(tmp_path))
    assert _credentials({}, args) == SessionCredentials("rocketmq2", "12345678")
    assert main(["--accessKey", "only1234", "topicList", "-n", "127.0.0.1:1"]) == EXIT_USAGE
    assert "give both --accessKey and --secretKey" in capsys.readouterr().err
    assert main(["--secretKey"]) == EXIT_USAGE
    # the ACL verbs keep RocketMQ's -a/--accessKey for the account they write
    update = _find("updateAclConfig").parser().parse_args(["-c", "C", "--accessKey", "newUser1"])
    assert update.accessKey == "newUser1" and not hasattr(update, "signAccessKey")
    assert _find("deleteAccessConfig").name == "deleteAclConfig"


def test_a_broker_with_a_bad_acl_file_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "conf").mkdir()
    acl = tmp_path / "conf" / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: RocketMQ\n    secretKey: 12345678\n    admin: [\n")
    conf = [
        "enableDLegerCommitLog=true", "dLegerPeers=n0-127.0.0.1:1", "dLegerSelfId=n0",
        f"storePathRootDir={tmp_path / 'store'}", "aclEnable=true", f"rocketmqHome={tmp_path}",
        "mappedFileSizeCommitLog=1048576",
    ]  # fmt: skip
    (tmp_path / "broker.conf").write_text("\n".join(conf))
    assert broker_main(["-c", str(tmp_path / "broker.conf")]) == 2
    assert capsys.readouterr().err.startswith(f"mqbroker: {acl}: ")


CODES = [10, 11, 12, 15, 17, 34, 35, 36, 38, 50, 310, 320, 33]
FIELDS = ["AccessKey", "Signature", "topic", "b", "a", "group", "consumerGroup", "x"]


@given(
    code=st.sampled_from(CODES),
    ext=st.dictionaries(st.sampled_from(FIELDS), st.text(max_size=12), max_size=6),
    body=st.one_of(st.binary(max_size=40), st.just(HEARTBEAT), st.just(b'{"consumerDataSet":0}')),
    host=st.sampled_from(["127.0.0.1", "10.10.103.9", "?", "::1", "192.168.1.4"]),
)
def test_any_request_gets_an_answer_never_an_exception(code, ext, body, host):
    acl = PlainAcl(SAMPLE)
    answer = acl.refusal(RemotingCommand(code, ext_fields=ext, body=body), host)
    assert answer is None or isinstance(answer, str)
    if ext.get("AccessKey") not in (None, "trusted1") and host != "10.10.103.9":
        assert answer is not None  # nobody can sign for these accounts without the secret
