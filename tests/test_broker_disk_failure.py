"""A broker whose disk fails stops with the disk's exit status, whatever its shutdown
finds: the DLedger server closes its store on the way out, and the message store's
shutdown checkpoint must not trip over the closed store (it used to raise KeyError
from the store's index table and turn exit status 4 into a traceback and 1)."""

from __future__ import annotations

import errno
import os

import trio
from raftmq.broker import cli
from raftmq.broker.store.messagestore import DISPATCH_CHECKPOINT
from raftmq.dledger.server import DLedgerServer

from tests.helpers import one_node_broker_conf


async def run_until_master(conf) -> None:
    config, _warnings = cli.load_broker_config(str(conf), None, {})
    broker = cli.BrokerController(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.serve)
        with trio.fail_after(10):
            while not broker.is_master:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


def test_an_fsync_failure_after_a_restart_exits_with_the_disk_status(tmp_path, monkeypatch, capsys):
    """The run that found it: a node restarted under fsync EIO, its log holding entries
    that no dispatch checkpoint covered. Its first fsync (the vote of its election)
    failed, the DLedger server closed the store, and the message store's shutdown
    checkpoint then asked the closed store where entry 0 is."""
    conf, root = one_node_broker_conf(tmp_path)
    trio.run(run_until_master, conf)
    (root / DISPATCH_CHECKPOINT).unlink()  # killed before its first dispatch checkpoint

    failing = False
    real_fsync, real_fdatasync, real_serve = os.fsync, os.fdatasync, DLedgerServer.serve

    def fsync(fd: int) -> None:
        if failing:
            raise OSError(errno.EIO, "injected EIO")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        if failing:
            raise OSError(errno.EIO, "injected EIO")
        real_fdatasync(fd)

    async def serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal failing
        failing = True  # from here on, as strace's inject=...:when=N+ does
        await real_serve(self, task_status=task_status)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(DLedgerServer, "serve", serve)
    monkeypatch.setattr(cli, "tune_for_serving", lambda: None)  # process-wide GC settings
    assert cli.main(["-c", str(conf)]) == cli.EXIT_DISK
    assert "mqbroker: fsync failed" in capsys.readouterr().err


def test_an_fsync_failure_while_opening_the_store_exits_with_the_disk_status(
    tmp_path, monkeypatch, capsys
):
    """Recovery makes its repairs durable before anything is served; its fsync failing
    is the disk's fault (status 4, "fsync failed"), not a port's (it was "cannot listen",
    status 3)."""
    conf, _root = one_node_broker_conf(tmp_path)

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "injected EIO")

    monkeypatch.setattr(os, "fsync", failing_sync)
    monkeypatch.setattr(os, "fdatasync", failing_sync)
    monkeypatch.setattr(cli, "tune_for_serving", lambda: None)
    assert cli.main(["-c", str(conf)]) == cli.EXIT_DISK
    err = capsys.readouterr().err
    assert err.startswith("mqbroker: fsync failed while opening "), err
    assert "injected EIO" in err and err.count("\n") == 1


def test_a_store_root_that_cannot_be_created_is_named_with_the_disk_status(tmp_path, capsys):
    """It was "cannot listen: ..." with the port's status, naming no key."""
    conf, _root = one_node_broker_conf(tmp_path)
    (tmp_path / "file").write_text("")
    blocked = tmp_path / "file" / "store"  # under a regular file: no one can create it
    assert cli.main(["-c", str(conf), "-D", f"storePathRootDir={blocked}"]) == cli.EXIT_DISK
    err = capsys.readouterr().err
    assert err == f"mqbroker: storePathRootDir={blocked}: Not a directory\n"
