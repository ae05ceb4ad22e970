// The console page: polls the JSON API (app.py) and renders it; no framework, no build.
"use strict";

const CLUSTER_POLL_MS = 500; // the cluster view follows a failover at this pace
const PAGE_POLL_MS = 5000; // topics and groups: heavier, refreshed less often
const PAGES = ["cluster", "topics", "groups", "messages"];
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
    el("td", {}, m.version || ""), el("td", {}, number(m.inTotal)), el("td", {}, number(m.outTotal))));
  return groupSection(g, master, pending, ["SelfId", "BrokerId", "Addr", "DLedger addr", "Role", "Term",
    "Ledger end", "Committed", "Version", "In total", "Out total"], rows);
}

/* A classic master/slave group: brokerRole, CommitLog end and each slave's HA lag. */
function classicGroup(g) {
  const master = g.master
    ? el("span", { class: "master", dataset: { brokerId: g.master.brokerId } }, `brokerId 0 · ${g.master.addr}`)
    : el("span", { class: "master none" }, "no master");
  const rows = g.members.map((m) => {
    const lag = m.slaveFallBehindBytes;
    const ha = m.brokerId === 0 ? `${number(m.haConnections)} slave(s)` : (m.haMasterAddr || "-");
    const kind = m.role === "SLAVE" || m.role === "UNREACHABLE" ? m.role : "MASTER";
    return el("tr", { dataset: { brokerId: m.brokerId }, class: `role-${kind}` },
      el("td", {}, m.brokerId), el("td", {}, m.addr), el("td", { class: "role" }, m.role),
      el("td", { class: "end" }, number(m.commitLogMaxOffset)),
      el("td", { class: lag > 0 ? "lag behind" : "lag" }, lag === -1 ? "no slave" : number(lag)),
      el("td", {}, ha), el("td", {}, m.version || ""), el("td", { class: "in" }, number(m.inTotal)),
      el("td", {}, number(m.outTotal)));
  });
  return groupSection(g, master, null, ["BrokerId", "Addr", "Role", "CommitLog max offset",
    "Slave fall behind (bytes)", "HA", "Version", "In total", "Out total"], rows);
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
    (g) => cell(g.diffTotal, "lag"), (g) => cell(g.consumeTps),
  ], deleteGroup, (g) => table(["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag", "Last consumed"],
    g.queues.map((q) => el("tr", {}, cell(q.topic), cell(q.brokerName), cell(q.queueId), cell(q.brokerOffset),
      cell(q.consumerOffset), cell(q.diff, "lag"), cell(clock(q.lastTimestampMs))))));
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
  const cards = doc.messages.map((m) => el("article", { class: "message", dataset: { msgId: m.msgId } },
    el("dl", {}, [
      ["msgId (offset)", m.msgId], ["Unique key", m.uniqKey], ["Topic", m.topic], ["Tags", m.tags],
      ["Keys", m.keys], ["Queue", `${m.brokerName ? m.brokerName + " " : ""}${m.queueId}`],
      ["Queue offset", m.queueOffset], ["CommitLog offset", m.commitLogOffset],
      ["Born", `${clock(m.bornTimestampMs)} from ${m.bornHost}`], ["Stored", `${clock(m.storeTimestampMs)} on ${m.storeHost}`],
      ["Reconsume times", m.reconsumeTimes],
      ["Properties", Object.entries(m.properties).map(([k, v]) => `${k}=${v}`).join(", ")],
    ].map(([name, value]) => [el("dt", {}, name), el("dd", {}, number(value))])),
    el("pre", { class: "body" }, m.body)));
  if (!cards.length) cards.push(el("p", {}, "No message there."));
  document.getElementById("lookup-results").replaceChildren(
    el("p", { class: "muted" }, `${doc.messages.length} message(s)`), ...cards);
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

// ------------------------------------------------------------------ pages

function currentPage() {
  const page = location.hash.slice(1);
  return PAGES.includes(page) ? page : "cluster";
}

async function refreshPage() {
  clearTimeout(pageTimer);
  const page = currentPage();
  try {
    if (page === "topics") {
      const system = document.getElementById("topics-system").checked;
      renderTopics(await api("GET", `/api/topics?system=${system}`));
    } else if (page === "groups") {
      renderGroups(await api("GET", "/api/groups"));
    }
  } catch (err) {
    notice(`${page}: ${err.message}`, true);
  }
  if (page === "topics" || page === "groups") pageTimer = setTimeout(refreshPage, PAGE_POLL_MS);
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
for (const button of document.querySelectorAll("button.refresh")) button.addEventListener("click", refreshPage);
window.addEventListener("hashchange", () => {
  notice("");
  showPage();
});
lookupFields();
showPage();
pollCluster();
