"""TLS on the remoting port: each `tls.server.mode` against clients with and without TLS,
client authentication, and the keys that configure it; mutual TLS on DLedger peer links,
which a stranger cannot pass. Certificates come from `trustme`."""

from __future__ import annotations

import logging
import ssl

import pytest
import trio
import trustme
from raftmq.broker.config import config_properties, load_broker_config
from raftmq.dledger import cli as dledger_cli
from raftmq.dledger.client import DLedgerClient
from raftmq.dledger.config import DLedgerConfig
from raftmq.dledger.core.messages import VoteRequest
from raftmq.dledger.net.codec import encode_message
from raftmq.dledger.net.frames import PEER, pack_frame
from raftmq.dledger.net.tcp import PeerTransport
from raftmq.dledger.server import DLedgerServer
from raftmq.namesrv.config import NamesrvConfig
from raftmq.namesrv.config import load_config as load_namesrv_config
from raftmq.namesrv.server import NamesrvServer

from raftmq.client.mqadmin import main as mqadmin_main
from raftmq.config.address import parse_peers
from raftmq.remoting import (
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingServer,
    RequestCode,
    ResponseCode,
)
from raftmq.tools.dledger_local import free_ports
from raftmq.transport.tls import ClientTls, PeerTls, ServerTls
from tests.helpers import GROUP

ECHO = RequestCode.HEART_BEAT


async def _echo(request: RemotingCommand, _connection) -> RemotingCommand:
    return RemotingCommand(code=ResponseCode.SUCCESS, body=request.body)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files,
    and a stranger's CA with a client certificate of its own."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    stranger_ca = trustme.CA()
    files = {"ca": root / "ca.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    for name, issuer, identity in (
        ("server", ca, "127.0.0.1"),
        ("client", ca, "client.test"),
        ("stranger", stranger_ca, "client.test"),
    ):
        cert = issuer.issue_cert(identity)
        files[f"{name}_cert"] = root / f"{name}.pem"
        files[f"{name}_key"] = root / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(files[f"{name}_cert"]))
        cert.private_key_pem.write_to_path(str(files[f"{name}_key"]))
    return {name: str(path) for name, path in files.items()}


def _server_tls(pki, mode: str, need_client_auth: str = "none") -> ServerTls:
    return ServerTls(
        mode=mode,
        cert_path=pki["server_cert"],
        key_path=pki["server_key"],
        need_client_auth=need_client_auth,
        trust_cert_path=pki["ca"] if need_client_auth != "none" else None,
    )


def _client_tls(pki, cert: str | None = None) -> ClientTls:
    return ClientTls(
        enable=True,
        trust_cert_path=pki["ca"],
        cert_path=pki[f"{cert}_cert"] if cert else None,
        key_path=pki[f"{cert}_key"] if cert else None,
    )


async def _call(port: int, tls: ClientTls | None) -> RemotingCommand:
    with trio.fail_after(5):
        async with RemotingClient(f"127.0.0.1:{port}", tls=tls) as client:
            return await client.invoke(RemotingCommand(code=ECHO, body=b"hello"), timeout_s=3)


async def _serving(nursery, server_tls: ServerTls | None) -> int:
    server = RemotingServer("127.0.0.1", 0, ProcessorTable({ECHO: _echo}), tls=server_tls)
    return await nursery.start(server.serve)


async def test_enforcing_serves_tls_and_refuses_plain(pki, caplog, nursery):
    port = await _serving(nursery, _server_tls(pki, "enforcing"))
    response = await _call(port, _client_tls(pki))
    assert (response.code, response.body) == (ResponseCode.SUCCESS, b"hello")
    with caplog.at_level(logging.WARNING), pytest.raises(RemotingConnectError):
        await _call(port, None)
    assert "TLS is enforced" in caplog.text


async def test_permissive_serves_both_on_one_port(pki, nursery):
    port = await _serving(nursery, _server_tls(pki, "permissive"))
    assert (await _call(port, _client_tls(pki))).body == b"hello"
    assert (await _call(port, None)).body == b"hello"


async def test_disabled_server_refuses_a_tls_client(pki, nursery):
    port = await _serving(nursery, _server_tls(pki, "disabled"))
    assert (await _call(port, None)).body == b"hello"
    with pytest.raises(RemotingConnectError):
        await _call(port, _client_tls(pki))


async def test_required_client_auth_refuses_a_client_without_a_trusted_cert(pki, caplog, nursery):
    port = await _serving(nursery, _server_tls(pki, "enforcing", "require"))
    assert (await _call(port, _client_tls(pki, cert="client"))).body == b"hello"
    with caplog.at_level(logging.WARNING):
        for refused in (_client_tls(pki), _client_tls(pki, cert="stranger")):
            # TLS 1.3 lets the client finish its handshake before the server
            # checks the certificate: the refusal shows on the first call.
            with pytest.raises(RemotingConnectError):
                await _call(port, refused)
    assert "TLS handshake with" in caplog.text


async def test_client_refuses_a_server_its_trust_file_does_not_vouch_for(pki, nursery):
    port = await _serving(nursery, _server_tls(pki, "enforcing"))
    untrusting = ClientTls(enable=True, trust_cert_path=pki["stranger_cert"])
    with pytest.raises(RemotingConnectError):
        await _call(port, untrusting)
    test_mode = ClientTls(enable=True, test_mode=True)  # tls.test.mode.enable
    assert (await _call(port, test_mode)).body == b"hello"


def test_server_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match=r"needs tls\.server\.certPath"):
        ServerTls(mode="enforcing")
    with pytest.raises(ValueError, match=r"needs tls\.server\.trustCertPath"):
        ServerTls(mode="enforcing", cert_path="c", key_path="k", need_client_auth="require")


# ---------------------------------------------------------------- DLedger peer links


def _peer_tls(pki, name: str = "server", check_host: bool = False) -> PeerTls:
    return PeerTls(pki[f"{name}_cert"], pki[f"{name}_key"], pki["ca"], check_host=check_host)


class _Member:
    """A PeerTransport that records what it delivers."""

    def __init__(self, self_id: str, peers: dict[str, str], tls: PeerTls) -> None:
        self.received: list = []
        self.received_event = trio.Event()
        self.transport = PeerTransport(self_id, peers, self._deliver, lambda _msg: None, tls=tls)

    def _deliver(self, msg) -> None:
        self.received.append(msg)
        self.received_event.set()


def _vote(sender: str, to: str, term: int = 50) -> VoteRequest:
    return VoteRequest(GROUP, sender, to, sender, term, 99, 9)


async def test_members_with_certificates_of_the_group_ca_exchange_messages(pki, nursery):
    a_port, b_port = free_ports(2)
    peers = {"a": f"127.0.0.1:{a_port}", "b": f"127.0.0.1:{b_port}"}
    a = _Member("a", peers, _peer_tls(pki, check_host=True))
    b = _Member("b", peers, _peer_tls(pki, check_host=True))
    await nursery.start(a.transport.serve)
    await nursery.start(b.transport.serve)
    a.transport.send(_vote("a", "b"))
    with trio.fail_after(5):
        await b.received_event.wait()
    assert b.received == [_vote("a", "b")]


async def _connect_and_vote(port: int, context: ssl.SSLContext | None) -> bool:
    """Connect (with TLS if `context`), send a vote from member `b`; True if the port
    closed the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if context is not None:
        stream = trio.SSLStream(stream, context, server_hostname="127.0.0.1")
    async with stream:
        with trio.move_on_after(2):
            try:
                await stream.send_all(pack_frame(PEER, encode_message(_vote("b", "a", term=1000))))
                return await stream.receive_some(1) == b""
            except (trio.BrokenResourceError, ssl.SSLError):
                return True
    return False


async def test_a_stranger_on_the_peer_port_is_dropped_logged_and_cannot_vote(pki, nursery, caplog):
    a_port, b_port = free_ports(2)
    peers = {"a": f"127.0.0.1:{a_port}", "b": f"127.0.0.1:{b_port}"}
    a = _Member("a", peers, _peer_tls(pki))
    await nursery.start(a.transport.serve)
    stranger = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=pki["ca"])
    stranger.check_hostname = False
    stranger.load_cert_chain(pki["stranger_cert"], pki["stranger_key"])  # self-issued CA
    no_cert = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=pki["ca"])
    no_cert.check_hostname = False
    with caplog.at_level(logging.WARNING):
        assert await _connect_and_vote(a_port, stranger)
        assert await _connect_and_vote(a_port, no_cert)
        assert await _connect_and_vote(a_port, None)  # plain TCP
    assert caplog.text.count("failed TLS authentication") == 3
    assert a.received == []


def test_peer_tls_comes_from_dledger_keys_and_needs_all_three(pki):
    values = {"group": "g", "selfId": "n0", "peers": "n0-127.0.0.1:1"}
    config = DLedgerConfig.from_keys(
        {
            **values,
            "tlsCertPath": pki["server_cert"],
            "tlsKeyPath": pki["server_key"],
            "tlsTrustCertPath": pki["ca"],
        }
    )
    assert config.peer_tls == _peer_tls(pki)
    assert DLedgerConfig.from_keys(values).peer_tls is None
    with pytest.raises(ValueError, match="needs a certificate, its key and a trust file"):
        DLedgerConfig.from_keys({**values, "tlsCertPath": pki["server_cert"]})


def test_broker_and_name_server_read_rocketmqs_tls_keys(pki, tmp_path):
    conf = tmp_path / "broker.conf"
    conf.write_text(
        "enableDLegerCommitLog=true\ndLegerPeers=n0-127.0.0.1:40911\ndLegerSelfId=n0\n"
        f"tls.server.mode=enforcing\ntls.server.certPath={pki['server_cert']}\n"
        f"tls.server.keyPath={pki['server_key']}\ntls.server.keyPassword=secret\n"
        f"tls.server.need.client.auth=require\ntls.server.trustCertPath={pki['ca']}\n"
        f"tls.enable=true\ntls.client.trustCertPath={pki['ca']}\n"
        f"dLegerTlsCertPath={pki['server_cert']}\ndLegerTlsKeyPath={pki['server_key']}\n"
        f"dLegerTlsTrustCertPath={pki['ca']}\ntls.server.authClient=true\n"
    )
    config, warnings = load_broker_config(str(conf))
    assert config.tls_server == ServerTls(
        "enforcing", pki["server_cert"], pki["server_key"], "secret", "require", pki["ca"]
    )
    assert config.tls_client == ClientTls(enable=True, trust_cert_path=pki["ca"])
    assert config.dledger_config().peer_tls == _peer_tls(pki)
    assert warnings == [f"{conf}: tls.server.authClient: accepted, not used by raftmq"]
    assert "tls.server.keyPassword" not in config_properties(config)
    namesrv_conf = tmp_path / "namesrv.conf"
    namesrv_conf.write_text("tls.server.mode=permissive\n")
    with pytest.raises(ValueError, match=r"namesrv\.conf: .*needs tls\.server\.certPath"):
        load_namesrv_config(str(namesrv_conf))
    namesrv_conf.write_text(
        f"tls.server.mode=permissive\ntls.server.certPath={pki['server_cert']}\n"
        f"tls.server.keyPath={pki['server_key']}\n"
    )
    namesrv, _ = load_namesrv_config(str(namesrv_conf))
    assert namesrv.tls_server.mode == "permissive"


async def test_mqadmin_reaches_a_name_server_that_enforces_tls_only_with_tls(pki, nursery):
    conf = NamesrvConfig(
        listen_port=0, bind_address="127.0.0.1", tls_server=_server_tls(pki, "enforcing")
    )
    namesrv = NamesrvServer(conf)
    await nursery.start(namesrv.remoting.serve)
    address = f"127.0.0.1:{namesrv.port}"
    tls_flags = ["--tls", "--tlsTrustCertPath", pki["ca"]]
    assert (
        await trio.to_thread.run_sync(mqadmin_main, ["clusterList", "-n", address, *tls_flags]) == 0
    )
    assert await trio.to_thread.run_sync(mqadmin_main, ["clusterList", "-n", address]) != 0


async def test_a_group_on_mutual_tls_elects_and_commits_and_a_client_needs_a_cert(pki, nursery):
    ports = free_ports(3)
    peers = ";".join(f"n{i}-127.0.0.1:{port}" for i, port in enumerate(ports))
    flags = ["--tls-cert", pki["server_cert"], "--tls-key", pki["server_key"]]
    flags += ["--tls-ca", pki["ca"]]
    for i in range(3):
        args = ["server", "-p", peers, "-i", f"n{i}", "-s", "-", "--store-type", "MEMORY"]
        config = dledger_cli._server_config(dledger_cli._parser().parse_args([*args, *flags]))
        assert config.peer_tls == _peer_tls(pki)
        await nursery.start(DLedgerServer(config).serve)
    members = parse_peers(peers)
    async with DLedgerClient("default", members, tls=_peer_tls(pki, "client")) as client:
        with trio.fail_after(10):
            [(index, _)] = await client.append([b"over TLS"])
        assert index >= 0
    async with DLedgerClient("default", members) as plain:  # no certificate
        assert {member["role"] for member in await plain.status()} == {"UNREACHABLE"}
    half = ["status", "-p", peers, "--tls-cert", pki["client_cert"]]  # no key, no CA
    assert await trio.to_thread.run_sync(dledger_cli.main, half) == 2
