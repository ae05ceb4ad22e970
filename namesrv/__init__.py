"""The name server: broker and topic routes, broker liveness (RocketMQ's `namesrv`)."""

from namesrv.config import NamesrvConfig, load_config
from namesrv.processor import NamesrvProcessor
from namesrv.routes import RouteInfoManager
from namesrv.server import NamesrvServer

__all__ = ["NamesrvConfig", "NamesrvProcessor", "NamesrvServer", "RouteInfoManager", "load_config"]
