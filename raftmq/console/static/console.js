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
  for (const child of children.flat()) {
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
  const groups = doc.groups.map((g) => {
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
    return el("section", { class: "group", dataset: { brokerName: g.brokerName } },
      el("h2", {}, g.brokerName, el("span", { class: "muted" }, ` cluster ${g.cluster}`), " — master: ", master, pending),
      table(["SelfId", "BrokerId", "Addr", "DLedger addr", "Role", "Term", "Ledger end", "Committed",
        "Version", "In total", "Out total"], rows));
  });
  if (!groups.length) groups.push(el("p", {}, "The name servers know no broker."));
  document.getElementById("cluster-groups").replaceChildren(...groups);
  document.getElementById("cluster-updated").textContent =
    `Updated ${new Date().toLocaleTimeString()} (${Math.round(elapsedMs)} ms).`;
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

// ------------------------------------------------------------------ topics

function expander(key, label) {
  return el("a", { href: "#", class: "expand", onclick: (event) => {
    event.preventDefault();
    if (expanded.has(key)) expanded.delete(key); else expanded.add(key);
    refreshPage();
  } }, (expanded.has(key) ? "▾ " : "▸ ") + label);
}

function renderTopics(doc) {
  const rows = [];
  for (const t of doc.topics) {
    const key = `topic:${t.topic}`;
    const remove = el("button", { type: "button", class: "danger", dataset: { topic: t.topic },
      onclick: () => deleteTopic(t.topic) }, "Delete");
    if (t.error) {
      rows.push(el("tr", { dataset: { topic: t.topic } }, el("td", {}, t.topic),
        el("td", { colspan: 4, class: "failed" }, t.error), el("td", {}, remove)));
      continue;
    }
    const brokers = t.brokers.map((b) => `${b.brokerName} ${b.readQueueNums}/${b.writeQueueNums} perm ${b.perm}`);
    rows.push(el("tr", { dataset: { topic: t.topic } }, el("td", {}, expander(key, t.topic)),
      el("td", {}, brokers.join(", ")), el("td", { class: "messages" }, t.messages),
      el("td", { class: "tps" }, t.putTps), el("td", {}, t.putLastDay), el("td", {}, remove)));
    if (expanded.has(key)) {
      const queues = t.queues.map((q) => el("tr", {}, el("td", {}, q.brokerName), el("td", {}, q.queueId),
        el("td", {}, q.minOffset), el("td", {}, q.maxOffset), el("td", {}, clock(q.lastUpdateMs))));
      rows.push(el("tr", { class: "detail" }, el("td", { colspan: 6 },
        table(["Broker", "Queue", "Min offset", "Max offset", "Last updated"], queues))));
    }
  }
  document.querySelector("#topics-table tbody").replaceChildren(...rows);
}

async function deleteTopic(topic) {
  const cluster = document.getElementById("topic-cluster").value;
  if (!confirm(`Delete topic ${topic} from cluster ${cluster} and the name servers?`)) return;
  try {
    const doc = await api("DELETE", `/api/topics/${encodeURIComponent(topic)}?cluster=${encodeURIComponent(cluster)}`);
    notice(`Deleted topic ${topic} from ${doc.written.join(", ")}.`);
  } catch (err) {
    notice(`Delete topic ${topic}: ${err.message}`, true);
  }
  refreshPage();
}

async function submitTopic(event) {
  event.preventDefault();
  const form = event.target;
  const body = {
    topic: form.topic.value.trim(), cluster: form.cluster.value,
    readQueueNums: Number(form.readQueueNums.value), writeQueueNums: Number(form.writeQueueNums.value),
    perm: Number(form.perm.value), order: form.order.checked,
  };
  try {
    const doc = await api("POST", "/api/topics", body);
    notice(`Topic ${doc.topic} written to ${doc.written.join(", ")}.`);
  } catch (err) {
    notice(`Topic ${body.topic}: ${err.message}`, true);
  }
  refreshPage();
}

// ------------------------------------------------------------------ consumer groups

function renderGroups(doc) {
  const rows = [];
  for (const g of doc.groups) {
    const key = `group:${g.group}`;
    const remove = el("button", { type: "button", class: "danger", dataset: { group: g.group },
      onclick: () => deleteGroup(g.group) }, "Delete");
    const enabled = g.config.consumeEnable === false ? "no" : "yes";
    if (g.error) {
      rows.push(el("tr", { dataset: { group: g.group } }, el("td", {}, g.group), el("td", {}, enabled),
        el("td", {}, g.config.retryMaxTimes), el("td", { colspan: 2, class: "failed" }, g.error), el("td", {}, remove)));
      continue;
    }
    rows.push(el("tr", { dataset: { group: g.group } }, el("td", {}, expander(key, g.group)),
      el("td", {}, enabled), el("td", {}, g.config.retryMaxTimes),
      el("td", { class: "lag" }, g.diffTotal), el("td", {}, g.consumeTps), el("td", {}, remove)));
    if (expanded.has(key)) {
      const queues = g.queues.map((q) => el("tr", {}, el("td", {}, q.topic), el("td", {}, q.brokerName),
        el("td", {}, q.queueId), el("td", {}, q.brokerOffset), el("td", {}, q.consumerOffset),
        el("td", { class: "lag" }, q.diff), el("td", {}, clock(q.lastTimestampMs))));
      rows.push(el("tr", { class: "detail" }, el("td", { colspan: 6 },
        table(["Topic", "Broker", "Queue", "Broker offset", "Consumer offset", "Lag", "Last consumed"], queues))));
    }
  }
  document.querySelector("#groups-table tbody").replaceChildren(...rows);
}

async function deleteGroup(group) {
  const cluster = document.getElementById("group-cluster").value;
  if (!confirm(`Delete subscription group ${group} (and its retry and DLQ topics) from cluster ${cluster}?`)) return;
  try {
    await api("DELETE", `/api/groups/${encodeURIComponent(group)}?cluster=${encodeURIComponent(cluster)}`);
    notice(`Deleted subscription group ${group}.`);
  } catch (err) {
    notice(`Delete group ${group}: ${err.message}`, true);
  }
  refreshPage();
}

async function submitGroup(event) {
  event.preventDefault();
  const form = event.target;
  const body = {
    groupName: form.groupName.value.trim(), cluster: form.cluster.value,
    retryMaxTimes: Number(form.retryMaxTimes.value), consumeEnable: form.consumeEnable.checked,
    consumeBroadcastEnable: form.consumeBroadcastEnable.checked,
    consumeFromMinEnable: form.consumeFromMinEnable.checked,
  };
  try {
    const doc = await api("POST", "/api/groups", body);
    notice(`Subscription group ${doc.config.groupName} written to ${doc.written.join(", ")}.`);
  } catch (err) {
    notice(`Group ${body.groupName}: ${err.message}`, true);
  }
  refreshPage();
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
window.addEventListener("hashchange", showPage);
lookupFields();
showPage();
pollCluster();
