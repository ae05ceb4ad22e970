"""The `apache.rocketmq.v2` protobuf messages and gRPC service, compiled at import.

The .proto files under `protos/` are apache/rocketmq-apis at commit
3e60073c6dab3430feaec443824802e23ecda681 (Apache License 2.0, headers kept), unchanged.
`grpc.protos_and_services` (grpcio-tools) compiles them when this module is first
imported (about 0.1 s), so there is no generated code in the repository and no build
step. The official Python client's distribution carries generated modules too, but it
installs a top-level `rocketmq` package, the same name as RocketMQ's C++ client that
the tests use, so it cannot be a dependency here.

    definition  messages and enums of definition.proto (Code, Message, Settings, ...)
    service     the request and response messages of service.proto
    service_grpc  MessagingServiceServicer and add_MessagingServiceServicer_to_server
"""

from __future__ import annotations

import sys
from pathlib import Path

import grpc

__all__ = ["PROTO_COMMIT", "definition", "service", "service_grpc"]

PROTO_COMMIT = "3e60073c6dab3430feaec443824802e23ecda681"  # apache/rocketmq-apis
_PROTO_ROOT = str(Path(__file__).parent / "protos")

# grpcio-tools resolves the files and their imports through sys.path.
sys.path.insert(0, _PROTO_ROOT)
try:
    definition = grpc.protos("apache/rocketmq/v2/definition.proto")
    service, service_grpc = grpc.protos_and_services("apache/rocketmq/v2/service.proto")
finally:
    sys.path.remove(_PROTO_ROOT)
