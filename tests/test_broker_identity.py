"""The brokerIdentity files of a controller-mode broker (broker.identity)."""

from __future__ import annotations

import pytest
from raftmq.broker.identity import Identity, IdentityFiles, IdentityMismatch


def test_an_id_is_applied_for_then_granted_and_kept(tmp_path):
    files = IdentityFiles(tmp_path / "brokerIdentity", "DefaultCluster", "broker-a")
    assert files.granted() is None and files.applying() is None
    files.apply(2, "127.0.0.1:30911;1700000000000")
    # a start cut short here applies again with the same check code (the same broker)
    assert files.applying() == Identity(
        "DefaultCluster", "broker-a", 2, "127.0.0.1:30911;1700000000000"
    )
    assert files.granted() is None
    files.grant(2)
    assert (tmp_path / "brokerIdentity").read_text() == "DefaultCluster#broker-a#2"
    assert files.applying() is None and files.granted() == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["brokerIdentity"]  # no temp left


def test_a_refused_id_leaves_nothing_and_another_group_s_file_is_refused(tmp_path):
    files = IdentityFiles(tmp_path / "brokerIdentity", "DefaultCluster", "broker-a")
    files.apply(1, "a;1")
    files.refused()
    assert files.applying() is None and not list(tmp_path.iterdir())
    (tmp_path / "brokerIdentity").write_text("DefaultCluster#broker-b#1")
    with pytest.raises(IdentityMismatch, match="broker-b's, and this broker is"):
        files.granted()
    (tmp_path / "brokerIdentity").write_text("DefaultCluster#broker-a")
    with pytest.raises(ValueError, match="not cluster#brokerName#brokerId"):
        files.granted()
