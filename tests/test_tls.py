"""TLS on the remoting port: each `tls.server.mode` against clients with and without TLS,
client authentication, and the keys that configure it (certificates from `trustme`)."""

from __future__ import annotations

import logging

import pytest
import trio
import trustme

from raftmq.remoting import (
    ProcessorTable,
    RemotingClient,
    RemotingCommand,
    RemotingConnectError,
    RemotingServer,
    RequestCode,
    ResponseCode,
)
from raftmq.streams.tls import ClientTls, ServerTls

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


async def test_enforcing_serves_tls_and_refuses_plain(pki, caplog):
    async with trio.open_nursery() as nursery:
        port = await _serving(nursery, _server_tls(pki, "enforcing"))
        response = await _call(port, _client_tls(pki))
        assert (response.code, response.body) == (ResponseCode.SUCCESS, b"hello")
        with caplog.at_level(logging.WARNING), pytest.raises(RemotingConnectError):
            await _call(port, None)
        assert "TLS is enforced" in caplog.text
        nursery.cancel_scope.cancel()


async def test_permissive_serves_both_on_one_port(pki):
    async with trio.open_nursery() as nursery:
        port = await _serving(nursery, _server_tls(pki, "permissive"))
        assert (await _call(port, _client_tls(pki))).body == b"hello"
        assert (await _call(port, None)).body == b"hello"
        nursery.cancel_scope.cancel()


async def test_disabled_server_refuses_a_tls_client(pki):
    async with trio.open_nursery() as nursery:
        port = await _serving(nursery, _server_tls(pki, "disabled"))
        assert (await _call(port, None)).body == b"hello"
        with pytest.raises(RemotingConnectError):
            await _call(port, _client_tls(pki))
        nursery.cancel_scope.cancel()


async def test_required_client_auth_refuses_a_client_without_a_trusted_cert(pki, caplog):
    async with trio.open_nursery() as nursery:
        port = await _serving(nursery, _server_tls(pki, "enforcing", "require"))
        assert (await _call(port, _client_tls(pki, cert="client"))).body == b"hello"
        with caplog.at_level(logging.WARNING):
            for refused in (_client_tls(pki), _client_tls(pki, cert="stranger")):
                # TLS 1.3 lets the client finish its handshake before the server
                # checks the certificate: the refusal shows on the first call.
                with pytest.raises(RemotingConnectError):
                    await _call(port, refused)
        assert "TLS handshake with" in caplog.text
        nursery.cancel_scope.cancel()


async def test_client_refuses_a_server_its_trust_file_does_not_vouch_for(pki):
    async with trio.open_nursery() as nursery:
        port = await _serving(nursery, _server_tls(pki, "enforcing"))
        untrusting = ClientTls(enable=True, trust_cert_path=pki["stranger_cert"])
        with pytest.raises(RemotingConnectError):
            await _call(port, untrusting)
        test_mode = ClientTls(enable=True, test_mode=True)  # tls.test.mode.enable
        assert (await _call(port, test_mode)).body == b"hello"
        nursery.cancel_scope.cancel()


def test_server_settings_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match=r"needs tls\.server\.certPath"):
        ServerTls(mode="enforcing")
    with pytest.raises(ValueError, match=r"needs tls\.server\.trustCertPath"):
        ServerTls(mode="enforcing", cert_path="c", key_path="k", need_client_auth="require")
