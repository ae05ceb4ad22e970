"""mqproxy: RocketMQ 5's gRPC proxy (`apache.rocketmq.v2.MessagingService`), so Apache's
5.x clients — the official Python one first — reach raftmq's broker groups unchanged.

- `apis`: the v2 protobuf messages and service, compiled from the pinned .proto files
- `bridge`: grpcio's asyncio thread <-> trio (calls, and server-initiated messages)
- `server`: the gRPC servicer (metadata, auth, metrics) and `serve_proxy`
- `service`: the RPCs, on trio; `brokers`: the broker access they use (remoting)
- `sending`: SendMessage's checks and properties; `outbound`: stored -> v2 Message
- `routes`: QueryRoute / QueryAssignment answers; `settings`: the Telemetry merge
- `auth`: MQv2-HMAC-SHA1 against plain_acl.yml; `metrics`; `config`: rmq-proxy.json
- `cli`: the `mqproxy` command
"""
