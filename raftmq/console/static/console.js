// The console page: polls the JSON API (app.py) and renders it; no framework, no build.
"use strict";

const CLUSTER_POLL_MS = 500; // the cluster view follows a failover at this pace
const PAGE_POLL_MS = 5000; // topics and groups: heavier, refreshed less often
const PAGES = ["cluster", "topics", "groups", "messages", "charts"];
const expanded = new Set(); // topic or group rows whose queues are shown
let clusterNames = [];
let pageTimer = null;

// ------------------------------------------------------------------ plumbing

async function api(method, path, body) {
  const init = { method, headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new Error(`the console did not answer (${err.message})`);
  }
  let doc;
  try {
    doc = await response.json();
  } catch (err) {
    throw new Error(`${method} ${path}: HTTP ${response.status}`);
  }
  if (!response.ok) throw new Error(doc.error || `HTTP ${response.status}`);
  return doc;
}

// el("td", {class: "x", dataset: {k: "v"}}, "text", child, ...): text is never parsed as HTML.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function show(id, message) {
  const box = document.getElementById(id);
  box.textContent = message;
  box.hidden = !message;
}

function notice(message, failed) {
  const box = document.getElementById("notice");
  box.classList.toggle("failed", Boolean(failed));
  show("notice", message);
}

function number(value) {
  return value === null || value === undefined ? "-" : value;
}

function clock(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return d.toLocaleString() + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function table(headers, rows) {
  return el("table", { class: "grid inner" },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

// ------------------------------------------------------------------ the cluster

function renderCluster(doc, elapsedMs) {
  document.getElementById("namesrv").textContent = `name servers ${doc.namesrv}`;
  const names = Object.keys(doc.clusters);
  if (names.join() !== clusterNames.join()) {
    clusterNames = names;
    for (const select of document.querySelectorAll("select.clusters")) {
      const chosen = select.value;
      select.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
      if (names.includes(chosen)) select.value = chosen;
    }
  }
  const groups = doc.groups.map((g) => (g.replication === "classic" ? classicGroup(g) : dledgerGroup(g)));
  if (!groups.length) groups.push(el("p", {}, "The name servers know no broker."));
  document.getElementById("cluster-groups").replaceChildren(...groups);
  document.getElementById("cluster-updated").textContent =
    `Updated ${new Date().toLocaleTimeString()} (${Math.round(elapsedMs)} ms).`;
}

function groupSection(g, master, pending, headers, rows) {
  return el("section", { class: "group", dataset: { brokerName: g.brokerName } },
    el("h2", {}, g.brokerName, el("span", { class: "muted" }, ` cluster ${g.cluster}`), " — master: ", master, pending),
    table(headers, rows));
}

function dledgerGroup(g) {
  const master = g.master
    ? el("span", { class: "master", dataset: { selfId: g.master.selfId } },
        `${g.master.selfId} · ${g.master.addr}`)
    : el("span", { class: "master none", dataset: { selfId: "" } }, "no master");
  const pending = g.leader && (!g.master || g.master.selfId !== g.leader)
    ? el("span", { class: "pending" }, ` DLedger leader ${g.leader}, not yet the registered master`)
    : null;
  const rows = g.members.map((m) => el("tr", { dataset: { selfId: m.selfId }, class: `role-${m.role}` },
    el("td", {}, m.selfId), el("td", {}, number(m.brokerId)), el("td", {}, m.addr || "-"),
    el("td", {}, m.peerAddr || "-"), el("td", { class: "role" }, m.role), el("td", { class: "term" }, number(m.term)),
    el("td", { class: "end" }, number(m.ledgerEndIndex)), el("td", { class: "committed" }, number(m.committedIndex)),
    el("td", {}, m.version || ""), el("td", {}, number(m.inTotal)), el("td", {}, number(m.outTotal)),
    el("td", { class: "timers" }, number(m.timerBacklog))));
  return groupSection(g, master, pending, ["SelfId", "BrokerId", "Addr", "DLedger addr", "Role", "Term",
    "Ledger end", "Committed", "Version", "In total", "Out total", "Timers pending"], rows);
}

/* A classic master/slave group: brokerRole, CommitLog end and each slave's HA lag; in
   controller mode also each member's epoch and the master's SyncStateSet. */
function classicGroup(g) {
  const inSync = g.syncStateSet ? ` · in sync {${g.syncStateSet.join(",")}}` : "";
  const master = g.master
    ? el("span", { class: "master", dataset: { brokerId: g.master.brokerId } }, `brokerId 0 · ${g.master.addr}${inSync}`)
    : el("span", { class: "master none" }, "no master");
  const rows = g.members.map((m) => {
    const lag = m.slaveFallBehindBytes;
    const ha = m.brokerId === 0 ? `${number(m.haConnections)} slave(s)` : (m.haMasterAddr || "-");
    const kind = m.role === "SLAVE" || m.role === "UNREACHABLE" ? m.role : "MASTER";
    return el("tr", { dataset: { brokerId: m.brokerId }, class: `role-${kind}` },
      el("td", {}, m.brokerId), el("td", {}, m.addr), el("td", { class: "role" }, m.role),
      el("td", { class: "end" }, number(m.commitLogMaxOffset)),
      el("td", { class: lag > 0 ? "lag behind" : "lag" }, lag === -1 ? "no slave" : number(lag)),
      el("td", {}, ha), el("td", { class: "epoch" }, number(m.masterEpoch)), el("td", {}, m.version || ""),
      el("td", { class: "in" }, number(m.inTotal)),
      el("td", {}, number(m.outTotal)), el("td", { class: "timers" }, number(m.timerBacklog)));
  });
  return groupSection(g, master, null, ["BrokerId", "Addr", "Role", "CommitLog max offset",
    "Slave fall behind (bytes)", "HA", "Epoch", "Version", "In total", "Out total", "Timers pending"], rows);
}

async function pollCluster() {
  const started = performance.now();
  try {
    renderCluster(await api("GET", "/api/cluster"), performance.now() - started);
    show("error", "");
  } catch (err) {
    show("error", `Cluster: ${err.message}`);
  }
  setTimeout(pollCluster, CLUSTER_POLL_MS);
}

// ------------------------------------------------------------------ topics and groups

function expander(key, label) {
  return el("a", { href: "#", class: "expand", onclick: (event) => {
    event.preventDefault();
    if (expanded.has(key)) expanded.delete(key); else expanded.add(key);
    refreshPage();
  } }, (expanded.has(key) ? "▾ " : "▸ ") + label);
}

// The rows of a topics or groups table: per item its cells (or its error) and a Delete
// button, and beneath it, when expanded, its queues.
function itemRows(items, kind, name, cells, remove, queues) {
  const rows = [];
  for (const item of items) {
    const id = item[name];
    const key = `${kind}:${id}`;
    const button = el("button", { type: "button", class: "danger", dataset: { [kind]: id },
      onclick: () => remove(id) }, "Delete");
    const shown = item.error
      ? [el("td", {}, id), el("td", { colspan: cells.length, class: "failed" }, item.error)]
      : [el("td", {}, expander(key, id)), ...cells.map((cell) => cell(item))];
    rows.push(el("tr", { dataset: { [kind]: id } }, shown, el("td", {}, button)));
    if (!item.error && expanded.has(key)) {
      rows.push(el("tr", { class: "detail" }, el("td", { colspan: cells.length + 2 }, queues(item))));
    }
  }
  return rows;
}

// An action's request; its outcome in the notice line, then the page refreshed.
async function act(what, method, path, body, done) {
  try {
    notice(done(await api(method, path, body)));
  } catch (err) {
    notice(`${what}: ${err.message}`, true);
  }
  refreshPage();
}

function cell(value, cls) {
  return el("td", cls ? { class: cls } : {}, value);
}

function renderTopics(doc) {
  const rows = itemRows(doc.topics, "topic", "topic", [
    (t) => cell(t.brokers.map((b) => `${b.brokerName} ${b.readQueueNums}/${b.writeQueueNums} perm ${b.perm}`).join(", ")),
    (t) => cell(t.messages, "messages"), (t) => cell(t.putTps, "tps"), (t) => cell(t.putLastDay),
  ], deleteTopic, (t) => table(["Broker", "Queue", "Min offset", "Max offset", "Last updated"],
    t.queues.map((q) => el("tr", {}, cell(q.brokerName), cell(q.queueId), cell(q.minOffset),
      cell(q.maxOffset), cell(clock(q.lastUpdateMs))))));
  document.querySelector("#topics-table tbody").replaceChildren(...rows);
}

function deleteTopic(topic) {
  const cluster = document.getElementById("topic-cluster").value;
  if (!confirm(`Delete topic ${topic} from cluster ${cluster} and the name servers?`)) return;
  const path = `/api/topics/${encodeURIComponent(topic)}?cluster=${encodeURIComponent(cluster)}`;
  act(`Delete topic ${topic}`, "DELETE", path, undefined,
    (doc) => `Deleted topic ${topic} from ${doc.written.join(", ")}.`);
}

function submitTopic(event) {
  event.preventDefault();
  const form = event.target;
  const body = {
    topic: form.topic.value.trim(), cluster: form.cluster.value,
    readQueueNums: Number(form.readQueueNums.value), writeQueueNums: Number(form.writeQueueNums.value),
    perm: Number(form.perm.value), order: form.order.checked,
  };
  act(`Topic ${body.topic}`, "POST", "/api/topics", body,
    (doc) => `Topic ${doc.topic} written to ${doc.written.join(", ")}.`);
}

function renderGroups(doc) {
  const rows = itemRows(doc.groups, "group", "group", [
    (g) => cell(g.config.consumeEnable === false ? "no" : "yes"), (g) => cell(g.config.retryMaxTimes),
    (g) => cell(g.diffTotal, "lag"), (g) => cell(g.consumeTps), (g) => cell(g.popInFlight, "pop"),
  ], deleteGroup, (g) => table(["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag", "Last consumed",
    "POP in flight"],
    g.queues.map((q) => el("tr", {}, cell(q.topic), cell(q.brokerName), cell(q.queueId), cell(q.brokerOffset),
      cell(q.consumerOffset), cell(q.diff, "lag"), cell(clock(q.lastTimestampMs)), cell(q.popInFlight, "pop")))));
  document.querySelector("#groups-table tbody").replaceChildren(...rows);
}

function deleteGroup(group) {
  const cluster = document.getElementById("group-cluster").value;
  if (!confirm(`Delete subscription group ${group} (and its retry and DLQ topics) from cluster ${cluster}?`)) return;
  const path = `/api/groups/${encodeURIComponent(group)}?cluster=${encodeURIComponent(cluster)}`;
  act(`Delete group ${group}`, "DELETE", path, undefined, () => `Deleted subscription group ${group}.`);
}

function submitGroup(event) {
  event.preventDefault();
  const form = event.target;
  const body = {
    groupName: form.groupName.value.trim(), cluster: form.cluster.value,
    retryMaxTimes: Number(form.retryMaxTimes.value), consumeEnable: form.consumeEnable.checked,
    consumeBroadcastEnable: form.consumeBroadcastEnable.checked,
    consumeFromMinEnable: form.consumeFromMinEnable.checked,
  };
  act(`Group ${body.groupName}`, "POST", "/api/groups", body,
    (doc) => `Subscription group ${doc.config.groupName} written to ${doc.written.join(", ")}.`);
}

// ------------------------------------------------------------------ messages

function lookupFields() {
  const by = document.getElementById("lookup-by").value;
  for (const label of document.querySelectorAll("#lookup-form label[data-for]")) {
    label.hidden = !label.dataset.for.split(" ").includes(by);
  }
}

function renderMessages(doc) {
  const cards = doc.messages.map((m) => {
    const card = el("article", { class: "message", dataset: { msgId: m.msgId } },
    el("dl", {}, [
      ["msgId (offset)", m.msgId], ["Unique key", m.uniqKey], ["Topic", m.topic], ["Tags", m.tags],
      ["Keys", m.keys], ["Queue", `${m.brokerName ? m.brokerName + " " : ""}${m.queueId}`],
      ["Queue offset", m.queueOffset], ["CommitLog offset", m.commitLogOffset],
      ["Born", `${clock(m.bornTimestampMs)} from ${m.bornHost}`], ["Stored", `${clock(m.storeTimestampMs)} on ${m.storeHost}`],
      ["Reconsume times", m.reconsumeTimes],
      ["Properties", Object.entries(m.properties).map(([k, v]) => `${k}=${v}`).join(", ")],
    ].map(([name, value]) => [el("dt", {}, name), el("dd", {}, number(value))])),
    el("pre", { class: "body" }, m.body),
    el("button", { type: "button", class: "trace-button", onclick: () => showTrace(m.uniqKey || m.msgId, card) },
      "Trace"),
    el("div", { class: "trace" }));
    return card;
  });
  if (!cards.length) cards.push(el("p", {}, "No message there."));
  document.getElementById("lookup-results").replaceChildren(
    el("p", { class: "muted" }, `${doc.messages.length} message(s)`), ...cards);
}

// A message's trace (GET /api/traces): its sends and consumptions, as queryMsgTraceById.
async function showTrace(msgId, card) {
  const box = card.querySelector(".trace");
  const topic = document.getElementById("lookup-trace-topic").value.trim();
  const params = new URLSearchParams({ msgId });
  if (topic) params.set("traceTopic", topic);
  box.replaceChildren(el("p", { class: "muted" }, "Looking up the trace…"));
  try {
    const doc = await api("GET", `/api/traces?${params}`);
    if (!doc.traces.length) {
      box.replaceChildren(el("p", { class: "muted" }, `No trace in ${doc.traceTopic}.`));
      return;
    }
    box.replaceChildren(el("table", {},
      el("thead", {}, el("tr", {}, ["Type", "Group", "Client host", "Time", "Cost", "Status"].map((h) => el("th", {}, h)))),
      el("tbody", {}, doc.traces.map((t) => el("tr", { dataset: { type: t.type } },
        el("td", {}, t.type), el("td", {}, t.group), el("td", {}, t.clientHost),
        el("td", {}, t.timestampMs ? clock(t.timestampMs) : ""), el("td", {}, `${t.costMs} ms`),
        el("td", {}, t.success ? "success" : "failed"))))));
  } catch (err) {
    box.replaceChildren(el("p", { class: "failed" }, err.message));
  }
}

async function submitLookup(event) {
  event.preventDefault();
  const form = event.target;
  const params = new URLSearchParams({ by: form.by.value });
  for (const label of form.querySelectorAll("label[data-for]")) {
    const input = label.querySelector("input");
    if (!label.hidden && input.value.trim()) params.set(input.name, input.value.trim());
  }
  document.getElementById("lookup-results").replaceChildren(el("p", { class: "muted" }, "Looking up…"));
  try {
    renderMessages(await api("GET", `/api/messages?${params}`));
  } catch (err) {
    document.getElementById("lookup-results").replaceChildren(el("p", { class: "failed" }, err.message));
  }
}

// ------------------------------------------------------------------ charts

// Drawn as plain SVG: no charting library, nothing fetched. [id, title] in page order.
const CHARTS = [
  ["brokerPutTps", "Put TPS per broker"], ["brokerGetTps", "Get TPS per broker"],
  ["topicPutTps", "Put TPS per topic"], ["topicGetTps", "Get TPS per topic (committed offsets)"],
  ["groupLag", "Consumer lag per group (messages)"], ["commitLag", "DLedger commit lag (entries appended, not committed)"],
];
const PALETTE = ["#2458c6", "#d1495b", "#1b7f3a", "#e08e0b", "#7b3fb5", "#1a9bb0", "#8c564b", "#c2185b"];
// drawn at this size in CSS pixels, unscaled, so that lines fall on whole pixels
const CHART_SIZE = { width: 560, height: 200, left: 52, right: 12, top: 14, bottom: 22 };
const CHART_POLL_LIMITS_MS = [1000, 10000]; // the charts refresh once per sample, within these
// The SVG namespace, from the parser, so that the page names no URL.
const SVG_NS = new DOMParser().parseFromString("<svg></svg>", "text/html").querySelector("svg").namespaceURI;

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

// The smallest 1, 2 or 5 times a power of ten at or above `value`: the y axis's top.
function niceCeiling(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((top) => top >= value);
}

function axisTime(ms, windowS) {
  const d = new Date(ms);
  const parts = [d.getHours(), d.getMinutes()].concat(windowS < 3600 ? [d.getSeconds()] : []);
  return parts.map((n) => String(n).padStart(2, "0")).join(":");
}

function drawChart(id, title, series, elections, fromMs, toMs, windowS) {
  const { width, height, left, right, top, bottom } = CHART_SIZE;
  const plotW = width - left - right, plotH = height - top - bottom;
  const highest = niceCeiling(series.reduce((most, s) => s.points.reduce((m, p) => Math.max(m, p[1]), most), 0));
  const x = (ms) => left + ((ms - fromMs) / (toMs - fromMs)) * plotW;
  const y = (value) => top + plotH - (value / highest) * plotH;
  const picture = svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot", "data-chart": id });
  for (let i = 0; i <= 4; i++) {
    const value = (highest * i) / 4;
    picture.append(svg("line", { class: "grid-line", x1: left, x2: width - right, y1: y(value), y2: y(value) }),
      svg("text", { x: left - 4, y: y(value) + 4, "text-anchor": "end" }, String(+value.toPrecision(3))));
  }
  for (let i = 0; i <= 5; i++) {
    const ms = fromMs + ((toMs - fromMs) * i) / 5;
    const anchor = i === 0 ? "start" : i === 5 ? "end" : "middle";
    picture.append(svg("text", { x: x(ms), y: height - 6, "text-anchor": anchor }, axisTime(ms, windowS)));
  }
  series.forEach((s, i) => {
    const points = s.points.filter((p) => p[0] >= fromMs).map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`);
    picture.append(svg("polyline", { class: "series", "data-series": s.name, points: points.join(" "), fill: "none",
      stroke: PALETTE[i % PALETTE.length], "stroke-width": 2, "stroke-linejoin": "round" },
    svg("title", {}, s.name)));
  });
  for (const e of elections.filter((e) => e.timeMs >= fromMs)) {
    const at = Math.round(x(e.timeMs)); // a 2-pixel line on whole pixels
    const label = `${e.brokerName} term ${e.term}${e.leader ? " · " + e.leader : ""}`;
    picture.append(svg("g", { class: "election", "data-broker-name": e.brokerName, "data-term": e.term },
      svg("line", { x1: at, x2: at, y1: top, y2: top + plotH }),
      svg("text", at > width - 60 ? { x: at - 3, y: top + 8, "text-anchor": "end" } : { x: at + 3, y: top + 8 },
        `term ${e.term}`), svg("title", {}, label)));
  }
  const legend = el("ul", { class: "legend" }, series.map((s, i) =>
    el("li", {}, el("span", { class: "swatch", style: `background:${PALETTE[i % PALETTE.length]}` }), s.name)));
  if (!series.length) legend.append(el("li", { class: "muted" }, "no samples yet"));
  return el("section", { class: "chart", dataset: { chart: id } }, el("h2", {}, title), picture, legend);
}

// The time axis ends now and starts at the window's start, or at the oldest point when
// the history is younger (a console just started), a minute back at least.
function renderCharts(doc, windowS) {
  const toMs = Date.now();
  const oldestMs = Object.values(doc.charts).flat().reduce((oldest, s) =>
    (s.points.length ? Math.min(oldest, s.points[0][0]) : oldest), toMs - 60000);
  const fromMs = Math.max(toMs - windowS * 1000, oldestMs);
  const source = doc.source === "prometheus" ? "Prometheus" : "the console's own samples";
  document.getElementById("charts-source").textContent = `${source}, a point every ${doc.stepS} s`;
  document.getElementById("charts").replaceChildren(...CHARTS.map(([id, title]) =>
    drawChart(id, title, doc.charts[id] || [], doc.elections, fromMs, toMs, windowS)));
}

async function refreshCharts() {
  const windowS = Number(document.getElementById("charts-window").value);
  const doc = await api("GET", `/api/series?window=${windowS}`);
  renderCharts(doc, windowS);
  const [shortest, longest] = CHART_POLL_LIMITS_MS;
  return Math.min(longest, Math.max(shortest, doc.stepS * 1000));
}

// ------------------------------------------------------------------ pages

function currentPage() {
  const page = location.hash.slice(1);
  return PAGES.includes(page) ? page : "cluster";
}

async function refreshPage() {
  clearTimeout(pageTimer);
  const page = currentPage();
  let nextMs = PAGE_POLL_MS;
  try {
    if (page === "charts") {
      nextMs = await refreshCharts();
    } else if (page === "topics") {
      const system = document.getElementById("topics-system").checked;
      renderTopics(await api("GET", `/api/topics?system=${system}`));
    } else if (page === "groups") {
      renderGroups(await api("GET", "/api/groups"));
    }
  } catch (err) {
    notice(`${page}: ${err.message}`, true);
  }
  if (page !== "cluster" && page !== "messages") pageTimer = setTimeout(refreshPage, nextMs);
}

function showPage() {
  const page = currentPage();
  for (const name of PAGES) {
    document.getElementById(`page-${name}`).hidden = name !== page;
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  refreshPage();
}

document.getElementById("topic-form").addEventListener("submit", submitTopic);
document.getElementById("group-form").addEventListener("submit", submitGroup);
document.getElementById("lookup-form").addEventListener("submit", submitLookup);
document.getElementById("lookup-by").addEventListener("change", lookupFields);
document.getElementById("topics-system").addEventListener("change", refreshPage);
document.getElementById("charts-window").addEventListener("change", refreshPage);
for (const button of document.querySelectorAll("button.refresh")) button.addEventListener("click", refreshPage);
window.addEventListener("hashchange", () => {
  notice("");
  showPage();
});
lookupFields();
showPage();
pollCluster();
