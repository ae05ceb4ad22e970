"""The console's ASGI application: the page, its static files and a JSON API.

    GET    /api/cluster                     groups, members, masters (views.cluster_view)
    GET    /api/topics[?system=true]         topics, queues, put rates
    POST   /api/topics                      updateTopic: {topic, cluster, readQueueNums, ...}
    DELETE /api/topics/{topic}?cluster=C    deleteTopic
    GET    /api/groups                      subscription groups, lag per queue
    POST   /api/groups                      updateSubGroup: {groupName, cluster, ...}
    DELETE /api/groups/{group}?cluster=C    deleteSubGroup (its retry and DLQ topics too)
    GET    /api/messages?by=key&topic=T&key=K
           /api/messages?by=uniqKey&topic=T&uniqKey=U
           /api/messages?by=msgId&msgId=I[&topic=T]
           /api/messages?by=offset&topic=T&brokerName=B&queueId=Q&offset=O
    GET    /api/traces?msgId=U[&traceTopic=T]  a message's trace (queryMsgTraceById)
    GET    /api/series[?window=S]           the charts' last S seconds (sampler.py)

Starlette runs on anyio, so under hypercorn's trio worker the handlers are trio tasks
sharing the caller's `Admin` (one connection per server, as `mqadmin` uses). A failure
is never a traceback page: every API answer is JSON, and an error is
`{"error": "<one line>"}` with 400 for bad input, 502 when a server of the cluster
answered with an error, 503 when none could be reached (the name servers down); a
Prometheus server that fails a chart query is a 502 too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from raftmq.client.admin import Admin
from raftmq.client.errors import MQBrokerError, MQClientError
from raftmq.client.message_query import (
    MAX_KEY_HITS,
    message_at,
    query_all_by_unique_key,
    query_by_key,
    query_traces,
    view_by_either_id,
)
from raftmq.client.mqadmin.commands import EXIT_UNREACHABLE
from raftmq.client.mqadmin.groups import SUB_GROUP_DEFAULTS, remove_sub_group, write_sub_group
from raftmq.client.mqadmin.main import failure_reason
from raftmq.client.route import MessageQueue
from raftmq.client.trace import TRACE_TOPIC
from raftmq.console import views
from raftmq.console.history import LONGEST_S
from raftmq.console.sampler import PrometheusError, PrometheusSeries, Sampler
from raftmq.process.errors import first_leaf
from raftmq.remoting import RemotingConnectError, RemotingTimeoutError
from raftmq.remoting.codes import ResponseCode

STATIC_DIR = Path(__file__).with_name("static")  # shipped as package data
HTTP_BAD_REQUEST, HTTP_BAD_GATEWAY, HTTP_UNAVAILABLE = 400, 502, 503
DEFAULT_WINDOW_S, SHORTEST_WINDOW_S = 900, 60
TOPIC_FIELDS = {"readQueueNums": 8, "writeQueueNums": 8, "perm": 6}  # updateTopic's defaults


class BadInput(ValueError):
    """A request the console cannot turn into a call: a missing or malformed field."""


Handler = Callable[[Request, Admin], Awaitable[dict]]


def _api(handler: Handler) -> Callable[[Request], Awaitable[JSONResponse]]:
    """`handler`'s document as JSON, or its failure as `{"error": ...}` (module doc)."""

    async def endpoint(request: Request) -> JSONResponse:
        admin: Admin = request.app.state.admin
        try:
            try:
                return JSONResponse(await handler(request, admin))
            except BaseExceptionGroup as group:  # from a client's nursery: one cause
                raise first_leaf(group) from None
        except ValueError as exc:  # BadInput, or a msgId / address that does not parse
            return _error(str(exc), HTTP_BAD_REQUEST)
        except (MQClientError, RemotingConnectError, RemotingTimeoutError) as exc:
            reason, status = failure_reason(exc)
            http = HTTP_UNAVAILABLE if status == EXIT_UNREACHABLE else HTTP_BAD_GATEWAY
            return _error(reason, http)
        except PrometheusError as exc:
            return _error(str(exc), HTTP_BAD_GATEWAY)

    endpoint.__name__ = handler.__name__
    return endpoint


def _error(reason: str, status: int) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status)


def _text(source, name: str) -> str:
    value = str(source.get(name) or "").strip()
    if not value:
        raise BadInput(f"{name} is required")
    return value


def _integer(source, name: str, default: int | None = None) -> int:
    value = source.get(name)
    if value in (None, "") and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BadInput(f"{name} must be a whole number, not {value!r}") from None


def _boolean(source, name: str, default: bool) -> bool:
    value = source.get(name, default)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise BadInput(f"{name} must be true or false, not {value!r}")


async def _json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise BadInput("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise BadInput("the request body is not a JSON object")
    return body


# ---------------------------------------------------------------------- reads


async def cluster(request: Request, admin: Admin) -> dict:
    return await views.cluster_view(admin)


async def topics(request: Request, admin: Admin) -> dict:
    include_system = _boolean(request.query_params, "system", False)
    return await views.topics_view(admin, include_system)


async def groups(request: Request, admin: Admin) -> dict:
    return await views.groups_view(admin)


async def messages(request: Request, admin: Admin) -> dict:
    """A lookup by one of the four ways `mqadmin` offers; `messages` is empty when the
    id or offset names nothing (a lookup by key that finds nothing is an error: the
    brokers answer NO_MESSAGE)."""
    query = request.query_params
    by = query.get("by", "")
    broker_name = None
    if by == "key":
        found = await query_by_key(admin, _text(query, "topic"), _text(query, "key"), MAX_KEY_HITS)
    elif by == "uniqKey":
        found = await query_all_by_unique_key(admin, _text(query, "topic"), _text(query, "uniqKey"))
    elif by == "msgId":
        found = [await view_by_either_id(admin, _text(query, "msgId"), query.get("topic") or None)]
    elif by == "offset":
        broker_name = _text(query, "brokerName")
        mq = MessageQueue(_text(query, "topic"), broker_name, _integer(query, "queueId"))
        msg = await message_at(admin, mq, _integer(query, "offset"))
        found = [] if msg is None else [msg]
    else:
        raise BadInput(f"by must be key, uniqKey, msgId or offset, not {by!r}")
    return {"messages": [views.message_json(msg, broker_name) for msg in found]}


async def traces(request: Request, admin: Admin) -> dict:
    """The trace records of the message whose msgId (UNIQ_KEY) is given, as
    `mqadmin queryMsgTraceById` finds them; none when no trace message names it."""
    query = request.query_params
    trace_topic = query.get("traceTopic") or TRACE_TOPIC
    try:
        records = await query_traces(admin, _text(query, "msgId"), trace_topic)
    except MQBrokerError as exc:
        if exc.code != ResponseCode.NO_MESSAGE:
            raise
        records = []
    return {"traceTopic": trace_topic, "traces": [views.trace_json(r) for r in records]}


async def series(request: Request, admin: Admin) -> dict:
    """The charts' series over the last `window` seconds (900 by default, from 60 to
    the history's length) and the elections in it."""
    window_s = _integer(request.query_params, "window", DEFAULT_WINDOW_S)
    if not SHORTEST_WINDOW_S <= window_s <= LONGEST_S:
        raise BadInput(f"window must be from {SHORTEST_WINDOW_S} to {LONGEST_S:.0f} seconds")
    return await request.app.state.charts.series(window_s)


# ---------------------------------------------------------------------- actions


async def update_topic(request: Request, admin: Admin) -> dict:
    """updateTopic -c: create or update the topic on every master of the cluster."""
    body = await _json_body(request)
    topic, cluster_name = _text(body, "topic"), _text(body, "cluster")
    numbers = {name: _integer(body, name, default) for name, default in TOPIC_FIELDS.items()}
    written = await admin.create_topic(
        topic,
        numbers["readQueueNums"],
        numbers["writeQueueNums"],
        numbers["perm"],
        cluster=cluster_name,
        order=_boolean(body, "order", False),
    )
    return {"topic": topic, "written": written}


async def delete_topic(request: Request, admin: Admin) -> dict:
    topic = request.path_params["topic"]
    written = await admin.delete_topic(topic, _text(request.query_params, "cluster"))
    return {"topic": topic, "written": written}


async def update_group(request: Request, admin: Admin) -> dict:
    """updateSubGroup -c: fields not given keep updateSubGroup's defaults."""
    body = await _json_body(request)
    config = {"groupName": _text(body, "groupName")}
    for name, default in SUB_GROUP_DEFAULTS.items():
        if isinstance(default, bool):
            config[name] = _boolean(body, name, default)
        else:
            config[name] = _integer(body, name, default)
    written = await write_sub_group(admin, config, {"cluster": _text(body, "cluster")})
    return {"config": config, "written": written}


async def delete_group(request: Request, admin: Admin) -> dict:
    group = request.path_params["group"]
    target = {"cluster": _text(request.query_params, "cluster")}
    written, topics_deleted = await remove_sub_group(admin, group, target)
    return {"group": group, "written": written, "topicsDeleted": topics_deleted}


# ---------------------------------------------------------------------- the app


def create_app(admin: Admin, charts: Sampler | PrometheusSeries) -> Starlette:
    """The console over `admin`, which the caller opens and closes around serving; the
    charts from `charts` (a Sampler the caller runs, or a Prometheus server)."""

    async def index(request: Request) -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/cluster", _api(cluster)),
            Route("/api/topics", _api(topics)),
            Route("/api/topics", _api(update_topic), methods=["POST"]),
            Route("/api/topics/{topic}", _api(delete_topic), methods=["DELETE"]),
            Route("/api/groups", _api(groups)),
            Route("/api/groups", _api(update_group), methods=["POST"]),
            Route("/api/groups/{group}", _api(delete_group), methods=["DELETE"]),
            Route("/api/messages", _api(messages)),
            Route("/api/traces", _api(traces)),
            Route("/api/series", _api(series)),
            Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
        ]
    )
    app.state.admin = admin
    app.state.charts = charts
    return app
