"""`broker.conf` in RocketMQ's keys: RocketMQ's sample DLedger configs load unchanged,
mistakes are refused with the file, key and value named, and keys RocketMQ knows but
raftmq does not use are accepted with a warning."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
from raftmq.broker.cli import EXIT_MODES_CONFLICT
from raftmq.broker.cli import main as cli_main
from raftmq.broker.config import BrokerConfig, ModesConflict, load_broker_config
from raftmq.dledger.config import FSYNC, PAGE_CACHE
from raftmq.namesrv.config import NamesrvConfig, load_config

from raftmq.config.address import parse_address, parse_peers
from raftmq.remoting import listen_host
from tests.helpers import DOC_PAGES, REPO

SAMPLES = REPO / "broker" / "conf" / "dledger"
PEERS = "n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913"


def load_text(tmp_path: Path, text: str, **kwargs) -> tuple[BrokerConfig, list[str]]:
    path = tmp_path / "broker.conf"
    path.write_text(text)
    return load_broker_config(str(path), **kwargs)


def dledger_conf(*extra: str, self_id: str = "n0") -> str:
    return "\n".join(
        ["enableDLegerCommitLog=true", f"dLegerPeers={PEERS}", f"dLegerSelfId={self_id}", *extra]
    )


@pytest.mark.parametrize("n", [0, 1, 2])
def test_rocketmq_sample_dledger_confs_load(n: int) -> None:
    path = SAMPLES / f"broker-n{n}.conf"
    config, warnings = load_broker_config(str(path))
    assert config.broker_cluster_name == "RaftCluster"
    assert config.broker_name == "RaftNode00"
    assert config.listen_port == 30911 + 10 * n
    assert config.namesrv_addr == ("127.0.0.1:9876",)
    assert config.slave_broker_id == n + 1
    assert warnings == [
        f"{path}: sendMessageThreadPoolNums: accepted, not used by raftmq",
        # the CommitLog is the DLedger log under storePathRootDir
        f"{path}: storePathCommitLog: in DLedger mode the CommitLog is the DLedger log under "
        "storePathRootDir (or storePathDLedgerCommitLog); only classic files from before an "
        "upgrade are read here",
    ]
    assert config.store_path_commit_log == f"/tmp/rmqstore/node0{n}/commitlog"

    dledger = config.dledger_config()
    assert dledger.group == "RaftNode00"
    assert dledger.self_id == f"n{n}"
    assert dledger.peers == {
        "n0": "127.0.0.1:40911",
        "n1": "127.0.0.1:40912",
        "n2": "127.0.0.1:40913",
    }
    assert dledger.store_base_dir == f"/tmp/rmqstore/node0{n}"
    assert dledger.store_type == "FILE"
    assert dledger.flush_disk_type == FSYNC
    assert dledger.mapped_file_size_for_entry_data == 1 << 30
    assert dledger.file_reserved_hours == 73


def test_defaults_without_a_file() -> None:
    config, warnings = load_broker_config(None)
    assert warnings == []
    assert config.listen_port == 10911
    assert config.flush_disk_type == FSYNC
    assert config.broker_role == "ASYNC_MASTER"
    assert not config.enable_dleger_commit_log
    assert config.store_path_root_dir == str(Path("~/store").expanduser())
    with pytest.raises(ValueError, match="enableDLegerCommitLog is false"):
        config.dledger_config()
    with pytest.raises(ValueError, match="enableDLegerCommitLog is false"):
        _ = config.slave_broker_id


def test_dledger_config_mapping(tmp_path: Path) -> None:
    config, warnings = load_text(
        tmp_path,
        dledger_conf(
            "brokerName=broker-b",
            "storePathRootDir=/data/root",
            "storePathDLedgerCommitLog=/data/dledger",
            "mappedFileSizeCommitLog=65536",
            "fileReservedTime=48",
            "flushDiskType=ASYNC_FLUSH",
            "preferredLeaderId=n2",
            "heartBeatTimeIntervalMs=50",
            "maxHeartBeatLeak=4",
            "minVoteIntervalMs=20",
            "maxVoteIntervalMs=80",
            "maxPendingRequestsNum=500",
            "maxWaitAckTimeMs=900",
            "maxPushTimeOutMs=300",
            self_id="n1",
        ),
    )
    assert warnings == []
    dledger = config.dledger_config()
    assert dledger.group == "broker-b"  # dLegerGroup defaults to brokerName
    assert dledger.self_id == "n1"
    assert dledger.store_base_dir == "/data/dledger"
    assert dledger.mapped_file_size_for_entry_data == 65536
    assert dledger.file_reserved_hours == 49
    assert dledger.flush_disk_type == PAGE_CACHE
    assert dledger.preferred_leader_ids == ("n2",)
    assert (dledger.heartbeat_interval_ms, dledger.max_heartbeat_leak) == (50, 4)
    assert (dledger.min_vote_interval_ms, dledger.max_vote_interval_ms) == (20, 80)
    assert dledger.max_pending_requests == 500
    assert dledger.max_wait_ack_time_ms == 900
    assert dledger.max_push_timeout_ms == 300


def test_file_reserved_hours_overrides_file_reserved_time_in_fractions(tmp_path: Path) -> None:
    config, _ = load_text(
        tmp_path, dledger_conf("fileReservedTime=48", "fileReservedHours=0.05", self_id="n1")
    )
    assert config.dledger_config().file_reserved_hours == 0.05  # three minutes
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match="fileReservedHours"):
            load_text(tmp_path, dledger_conf(f"fileReservedHours={bad}", self_id="n1"))


def test_clean_resource_interval_paces_retention_in_both_modes(tmp_path: Path) -> None:
    """RocketMQ's key, accepted and ignored before: now how often either store looks."""
    default, warnings = load_text(tmp_path, dledger_conf(self_id="n1"))
    assert default.dledger_config().clean_resource_interval_ms == 10_000
    config, warnings = load_text(tmp_path, dledger_conf("cleanResourceInterval=2500", self_id="n1"))
    assert warnings == [] and config.clean_resource_interval == 2500
    assert config.dledger_config().clean_resource_interval_ms == 2500
    with pytest.raises(ValueError, match="cleanResourceInterval"):
        load_text(tmp_path, dledger_conf("cleanResourceInterval=0", self_id="n1"))


def test_unknown_key_is_an_error_with_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    with pytest.raises(ValueError) as info:
        load_text(tmp_path, dledger_conf("enableDLedgerCommitLog=true"))
    message = str(info.value)
    assert str(path) in message
    assert "enableDLedgerCommitLog='true'" in message
    assert "did you mean enableDLegerCommitLog?" in message


def test_unknown_key_far_from_any_gets_no_hint(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown key$"):
        load_text(tmp_path, "zzzqqq=1")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("listenPort=ten", "listenPort='ten': not an integer"),
        ("listenPort=70000", "listenPort='70000': out of range 0..65535"),
        ("defaultTopicQueueNums=0", "defaultTopicQueueNums='0': must be at least 1"),
        ("autoCreateTopicEnable=yes", "autoCreateTopicEnable='yes': expected true or false"),
        ("brokerRole=MASTER", "brokerRole='MASTER': expected one of ASYNC_MASTER"),
        ("flushDiskType=FSYNC", "flushDiskType='FSYNC': expected one of SYNC_FLUSH"),
        ("namesrvAddr=localhost", "namesrvAddr='localhost': bad address"),
        ("messageDelayLevel=1s 5x", "messageDelayLevel='1s 5x': expected levels"),
        ("brokerName=", "brokerName='': must not be empty"),
        ("bindAddress=localhost", "bindAddress='localhost': expected an IP address"),
        ("bindAddress=127.0.0.2:10911", "bindAddress='127.0.0.2:10911': expected an IP address"),
        ("bindAddress=127.0.0.300", "bindAddress='127.0.0.300': expected an IP address"),
        ("brokerIP1=broker-a.local", "brokerIP1='broker-a.local': expected an IP address"),
        ("groupAddress=127.0.0.2", "groupAddress='127.0.0.2': bad address"),
        ("groupAddress=vip.local:10911", "groupAddress='vip.local:10911': expected an IP"),
        ("groupAddress=127.0.0.2:0", "groupAddress='127.0.0.2:0': expected a fixed port"),
    ],
)
def test_bad_values_name_file_key_and_value(tmp_path: Path, line: str, problem: str) -> None:
    with pytest.raises(ValueError) as info:
        load_text(tmp_path, line)
    assert str(info.value).startswith(f"{tmp_path / 'broker.conf'}: ")
    assert problem in str(info.value)


def test_self_id_must_be_a_letter_and_digits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dLegerSelfId='node0': expected one letter and digits"):
        load_text(tmp_path, dledger_conf(self_id="node0"))


def test_self_id_must_be_a_peer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dLegerSelfId='n3': not among dLegerPeers \(n0;n1;n2\)"):
        load_text(tmp_path, dledger_conf(self_id="n3"))


def test_preferred_leader_must_be_a_peer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="preferredLeaderId='n7': not among dLegerPeers"):
        load_text(tmp_path, dledger_conf("preferredLeaderId=n7"))


def test_dledger_mode_needs_peers_and_self_id(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="enableDLegerCommitLog=true needs dLegerPeers"):
        load_text(tmp_path, "enableDLegerCommitLog=true\ndLegerSelfId=n0")
    with pytest.raises(ValueError, match="enableDLegerCommitLog=true needs dLegerSelfId"):
        load_text(tmp_path, f"enableDLegerCommitLog=true\ndLegerPeers={PEERS}")


def test_bad_peers_string(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dLegerPeers='n0:127\.0\.0\.1:1': bad peer"):
        load_text(tmp_path, "dLegerPeers=n0:127.0.0.1:1")


def test_dledger_keys_out_of_line_with_each_other(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="minVoteIntervalMs <= maxVoteIntervalMs"):
        load_text(tmp_path, dledger_conf("minVoteIntervalMs=500", "maxVoteIntervalMs=100"))


def test_rocketmq_keys_raftmq_does_not_use_are_warnings(tmp_path: Path) -> None:
    keys = ["deleteWhen=04", "cleanFileForciblyEnable=true", "transientStorePoolEnable=false"]
    keys += ["offsetCheckInSlave=false", "traceOn=false", "messageIndexSafe=true"]
    config, warnings = load_text(tmp_path, "\n".join(keys))
    path = tmp_path / "broker.conf"
    assert warnings == [f"{path}: {k.split('=')[0]}: accepted, not used by raftmq" for k in keys]
    assert config == BrokerConfig(store_path_root_dir=config.store_path_root_dir)


def test_dledger_keys_in_classic_mode_are_warnings(tmp_path: Path) -> None:
    text = f"dLegerPeers={PEERS}\nheartBeatTimeIntervalMs=50\ngroupAddress=127.0.0.2:10911"
    _, warnings = load_text(tmp_path, text)
    path = tmp_path / "broker.conf"
    assert warnings == [
        f"{path}: dLegerPeers: ignored, enableDLegerCommitLog is false",
        f"{path}: groupAddress: ignored, enableDLegerCommitLog is false",
        f"{path}: heartBeatTimeIntervalMs: ignored, enableDLegerCommitLog is false",
    ]


def test_auto_leader_balance_with_a_preferred_leader_is_a_warning(tmp_path: Path) -> None:
    """Balancing would move the leader away and the preferred leader check back."""
    conf = dledger_conf("preferredLeaderId=n1", "enableAutoLeaderBalance=true")
    _, warnings = load_text(tmp_path, conf)
    assert warnings == [
        f"{tmp_path / 'broker.conf'}: enableAutoLeaderBalance: ignored in a group with"
        " preferredLeaderId, which pins its leader"
    ]
    _, warnings = load_text(tmp_path, "enableAutoLeaderBalance=true")
    assert warnings == [
        f"{tmp_path / 'broker.conf'}: enableAutoLeaderBalance: ignored,"
        " enableDLegerCommitLog is false"
    ]


def test_classic_keys_in_dledger_mode_are_warnings(tmp_path: Path) -> None:
    _, warnings = load_text(tmp_path, dledger_conf("haListenPort=10912", "slaveTimeout=100"))
    path = tmp_path / "broker.conf"
    assert warnings == [
        f"{path}: haListenPort: ignored in DLedger mode",
        f"{path}: slaveTimeout: ignored in DLedger mode",
    ]


def test_classic_ha_keys(tmp_path: Path) -> None:
    config, _ = load_text(tmp_path, "listenPort=20911\nbrokerIP2=10.0.0.2")
    assert (config.ha_port, config.broker_ip2) == (20912, "10.0.0.2")  # listenPort + 1
    config, _ = load_text(tmp_path, "haListenPort=30000\nhaMasterAddress=10.0.0.1:10912")
    assert (config.ha_port, config.ha_master_address) == (30000, "10.0.0.1:10912")
    with pytest.raises(ValueError, match="haMasterAddress"):
        load_text(tmp_path, "haMasterAddress=nowhere")


def test_classic_broker_ids(tmp_path: Path) -> None:
    config, warnings = load_text(tmp_path, "brokerRole=SLAVE\nbrokerId=2")
    assert (config.broker_role, config.broker_id, warnings) == ("SLAVE", 2, [])
    with pytest.raises(ValueError, match="brokerId=0: a SLAVE needs brokerId > 0"):
        load_text(tmp_path, "brokerRole=SLAVE")
    config, warnings = load_text(tmp_path, "brokerRole=SYNC_MASTER\nbrokerId=1")
    assert config.broker_id == 0
    assert warnings == [f"{tmp_path / 'broker.conf'}: brokerId=1: a master is brokerId 0"]


def test_bind_address_is_where_the_remoting_server_listens(tmp_path: Path) -> None:
    """RocketMQ 5's bindAddress: every interface by default; an address of its own lets
    the broker advertise another one (brokerIP1) that a proxy or NAT forwards."""
    assert load_broker_config(None)[0].bind_address == "0.0.0.0"
    assert listen_host("0.0.0.0") is None  # trio's "every interface", IPv6 included
    config, warnings = load_text(tmp_path, "bindAddress=127.0.0.2\nbrokerIP1=127.0.1.2")
    assert (config.bind_address, config.broker_ip1, warnings) == ("127.0.0.2", "127.0.1.2", [])
    assert listen_host(config.bind_address) == "127.0.0.2"
    assert load_text(tmp_path, "bindAddress=::1")[0].bind_address == "::1"


def test_old_maped_spelling_is_an_alias(tmp_path: Path) -> None:
    config, _ = load_text(tmp_path, "mapedFileSizeCommitLog=4096")
    assert config.mapped_file_size_commit_log == 4096


def test_store_paths_expand_home(tmp_path: Path) -> None:
    config, _ = load_text(tmp_path, "storePathRootDir=~/rmq")
    assert config.store_path_root_dir == str(Path("~/rmq").expanduser())
    assert config.store_path_commit_log == str(Path("~/rmq/commitlog").expanduser())  # RocketMQ's
    config, warnings = load_text(tmp_path, "storePathCommitLog=~/disk2/commitlog")
    assert config.store_path_commit_log == str(Path("~/disk2/commitlog").expanduser())
    assert warnings == []  # a classic broker's CommitLog goes there


def test_command_line_overrides_the_file(tmp_path: Path) -> None:
    text = dledger_conf("namesrvAddr=10.0.0.1:9876", "listenPort=30911")
    config, _ = load_text(
        tmp_path,
        text,
        namesrv_override="127.0.0.1:9876;127.0.0.1:9877",
        overrides={"listenPort": "0", "dLegerSelfId": "n2"},
    )
    assert config.namesrv_addr == ("127.0.0.1:9876", "127.0.0.1:9877")
    assert config.listen_port == 0
    assert config.slave_broker_id == 3


def test_command_line_overrides_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^-D: listenPort='x': not an integer$"):
        load_broker_config(None, overrides={"listenPort": "x"})
    with pytest.raises(ValueError, match=r"^-n: namesrvAddr='nowhere': bad address"):
        load_broker_config(None, namesrv_override="nowhere")
    with pytest.raises(ValueError, match=r"^-D: dLegerSelfId='n9': not among"):
        load_text(tmp_path, dledger_conf(), overrides={"dLegerSelfId": "n9"})


def test_unreadable_file() -> None:
    with pytest.raises(ValueError, match=r"cannot read config /nonexistent/broker\.conf"):
        load_broker_config("/nonexistent/broker.conf")


def test_the_docs_commands_run_as_written_beside_the_sample_confs() -> None:
    """The docs' `mqnamesrv -c` names a file that ships, their `mqbroker -c` of a sample
    conf names one that loads, and their dledger example binds no port a sample broker
    conf uses (it reused 40911-40913 and `dledger server` died)."""
    text = "\n".join(page.read_text() for page in DOC_PAGES)
    namesrv_confs = set(re.findall(r"mqnamesrv -c (\S+)", text))
    assert namesrv_confs
    for conf in namesrv_confs:  # a controller's keys beside them, if any (controller.md)
        config, warnings = load_config(str(REPO / conf))
        assert warnings == [] and attrs.evolve(config, controller=None) == NamesrvConfig()
    broker_confs = set(re.findall(r"mqbroker -c (broker/conf/\S+)", text))
    assert {f"broker/conf/dledger/broker-n{n}.conf" for n in range(3)} <= broker_confs
    for conf in broker_confs:
        load_broker_config(str(REPO / conf))
    used = set()
    for n in range(3):
        config, _ = load_broker_config(str(SAMPLES / f"broker-n{n}.conf"))
        used |= {
            config.listen_port,
            *(parse_address(a)[1] for a in config.dledger_config().peers.values()),
        }
    example_peers = re.findall(r'^P="([^"]+)"', text, re.MULTILINE)
    assert example_peers
    for peers in example_peers:
        assert not used & {parse_address(a)[1] for a in parse_peers(peers).values()}


def test_the_readme_describes_the_sample_confs_as_they_are() -> None:
    """The first paragraph of the README's group by hand tells a user which names, ports
    and store directories the sample confs use: each must be what the conf loads to."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## A 3-node group by hand", 1)[1].strip().split("\n\n", 1)[0]
    for n in range(3):
        config, _ = load_broker_config(str(SAMPLES / f"broker-n{n}.conf"))
        named = {
            f"`{config.broker_name}`",
            f"`{config.broker_cluster_name}`",
            str(config.listen_port),
            *(str(parse_address(a)[1]) for a in config.dledger_config().peers.values()),
            f"`{Path(config.store_path_root_dir).parent}/`",
        }
        assert {word for word in named if word not in section} == set()


def test_disk_ratios_are_percent_keys_that_become_dledgers_ratios(tmp_path: Path) -> None:
    defaults = load_text(tmp_path, dledger_conf())[0].dledger_config()
    assert (defaults.disk_space_ratio_to_check_expired, defaults.disk_full_ratio) == (0.75, 0.90)
    text = dledger_conf("diskMaxUsedSpaceRatio=60", "diskSpaceWarningLevelRatio=95")
    dledger = load_text(tmp_path, text)[0].dledger_config()
    assert (dledger.disk_space_ratio_to_check_expired, dledger.disk_full_ratio) == (0.60, 0.95)
    with pytest.raises(ValueError, match=r"diskSpaceWarningLevelRatio.*out of range 1\.\.100"):
        load_text(tmp_path, dledger_conf("diskSpaceWarningLevelRatio=120"))


@pytest.mark.parametrize(
    ("lines", "refused"),
    [
        (("listenPort=10911", "groupAddress=10.0.0.9:10911"), True),  # the wildcard covers it
        (("listenPort=10911", "bindAddress=10.0.0.9", "groupAddress=10.0.0.9:10911"), True),
        (("listenPort=10911", "bindAddress=10.0.0.8", "groupAddress=10.0.0.9:10911"), False),
        (("listenPort=10911", "groupAddress=10.0.0.9:10921"), False),
    ],
)
def test_a_group_address_the_broker_port_already_covers_is_refused(
    tmp_path: Path, lines: tuple[str, ...], refused: bool
) -> None:
    """A VIP on listenPort's port while the broker listens on every interface could
    never be bound by the master: refused at start, naming the key, not retried forever."""
    if refused:
        with pytest.raises(ValueError, match=r"groupAddress=10\.0\.0\.9:10911: its port is"):
            load_text(tmp_path, dledger_conf(*lines))
    else:
        config, _ = load_text(tmp_path, dledger_conf(*lines))
        assert config.group_address.startswith("10.0.0.9:")


@pytest.mark.parametrize("n", [0, 1])
def test_rocketmq_quick_start_controller_confs_load(n: int) -> None:
    """RocketMQ 5's distribution/conf/controller/quick-start/broker-n*.conf, unchanged:
    brokerId=-1 and brokerRole=SLAVE leave the id and the role to the controller."""
    path = REPO / "broker" / "conf" / "controller" / f"broker-n{n}.conf"
    config, warnings = load_broker_config(str(path))
    assert config.enable_controller_mode and config.all_ack_in_sync_state_set
    assert config.controller_addr == ("127.0.0.1:9878",)
    assert (config.broker_id, config.listen_port, config.is_slave) == (-1, 30911 + 10 * n, False)
    assert warnings == [
        f"{path}: deleteWhen: accepted, not used by raftmq",
        f"{path}: brokerId: ignored in controller mode (the controller decides)",
        f"{path}: brokerRole: ignored in controller mode (the controller decides)",
    ]


def test_controller_mode_with_dledger_exits_252_as_rocketmq_exits_minus_4(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(dledger_conf("enableControllerMode=true", "controllerAddr=127.0.0.1:9878"))
    with pytest.raises(ModesConflict, match="enableControllerMode=true with enableDLegerCommit"):
        load_broker_config(str(path))
    assert cli_main(["-c", str(path)]) == EXIT_MODES_CONFLICT == 256 - 4
    with pytest.raises(ValueError, match="enableControllerMode=true needs controllerAddr"):
        load_text(tmp_path, "enableControllerMode=true")
    with pytest.raises(ValueError, match="brokerId=-1: only controller mode"):
        load_text(tmp_path, "brokerId=-1\nbrokerRole=SLAVE")
