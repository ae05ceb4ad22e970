"""The name server: broker and topic routes, broker liveness (RocketMQ's `namesrv`)."""

from raftmq.namesrv.config import NamesrvConfig, load_config
from raftmq.namesrv.processor import NamesrvProcessor
from raftmq.namesrv.routes import RouteInfoManager
from raftmq.namesrv.server import NamesrvServer

__all__ = ["NamesrvConfig", "NamesrvProcessor", "NamesrvServer", "RouteInfoManager", "load_config"]
