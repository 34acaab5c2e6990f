// The Tickertape web console: reads /events (Server-Sent Events) from the admin endpoint and
// draws it. No build step, no library: the charts are a small canvas line chart below.
"use strict";

const HOUR = 3600;
const samples = []; // the server's one-second samples, oldest first (at most an hour)
let details = { clients: [], clients_total: 0, queues: {}, segments: [] };
let clientSort = { key: "output_buffer_bytes", desc: true };
let subSort = { key: "lag_bytes", desc: true };

// -- units -------------------------------------------------------------------------------------

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}
function rate(n) {
  if (n === null || n === undefined) return "–";
  if (n >= 1e6) return (n / 1e6).toFixed(2) + " M msg/s";
  if (n >= 1e4) return (n / 1e3).toFixed(1) + " k msg/s";
  return n.toFixed(n < 10 && n % 1 ? 1 : 0) + " msg/s";
}
function ms(s) {
  if (s === null || s === undefined) return "–";
  return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
}
function count(n, unit) { return n === null || n === undefined ? "–" : n.toLocaleString("en") + " " + unit; }
function pct(n) { return n === null || n === undefined ? "–" : n.toFixed(1) + " %"; }
function secs(s) {
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
// a wall-clock time (seconds since the epoch) in the browser's time zone
function when(t) { return !t ? "–" : new Date(t * 1000).toLocaleString(); }

// -- the overview ----------------------------------------------------------------------------

function quantile(values, q) {
  const v = values.filter((x) => x !== null && x !== undefined).sort((a, b) => a - b);
  if (!v.length) return null;
  return v[Math.min(v.length - 1, Math.floor(q * v.length))];
}

const TILES = [
  ["Publish", (s) => rate(s.publish_per_s)],
  ["Delivery", (s) => rate(s.delivery_per_s)],
  ["Replay", (s) => rate(s.replay_per_s)],
  ["Queue acks", (s) => rate(s.queue_ack_per_s)],
  ["Commit p50 (1 min)", () => ms(quantile(samples.slice(-60).map((x) => x.commit_latency_s), 0.5))],
  ["Commit p99 (1 min)", () => ms(quantile(samples.slice(-60).map((x) => x.commit_latency_s), 0.99))],
  ["Connections", (s) => count(s.connections, "clients")],
  ["Subscriptions", (s) => count(s.subscriptions, "subs")],
  ["Journal", (s) => bytes(s.journal_bytes)],
  ["Free disk", (s) => bytes(s.disk_free_bytes)],
  ["CPU", (s) => pct(s.cpu_percent)],
  ["RSS", (s) => bytes(s.rss_bytes)],
];

const CHARTS = [
  { title: "Messages (msg/s)", fmt: rate, series: [
    ["publish", "publish_per_s"], ["delivery", "delivery_per_s"], ["replay", "replay_per_s"]] },
  { title: "Queues (msg/s)", fmt: rate, series: [
    ["acked", "queue_ack_per_s"], ["delivered", "queue_delivery_per_s"]] },
  { title: "Commit latency (ms)", fmt: ms, series: [["last commit", "commit_latency_s"]] },
  { title: "Connections (clients)", fmt: (n) => count(n, "clients"), series: [
    ["connections", "connections"]] },
  { title: "Journal and disk (bytes)", fmt: bytes, series: [
    ["journal", "journal_bytes"], ["free disk", "disk_free_bytes"]] },
  { title: "CPU (%)", fmt: pct, series: [["cpu", "cpu_percent"]] },
  { title: "Resident memory (bytes)", fmt: bytes, series: [["rss", "rss_bytes"]] },
];

function buildOverview() {
  const tiles = document.getElementById("tiles");
  for (const [label] of TILES) {
    const d = document.createElement("div");
    d.className = "tile";
    d.innerHTML = '<div class="label"></div><div class="value">–</div>';
    d.firstChild.textContent = label;
    tiles.appendChild(d);
  }
  const charts = document.getElementById("charts");
  CHARTS.forEach((c, i) => {
    const d = document.createElement("div");
    d.className = "chart";
    const h = document.createElement("h2");
    h.textContent = c.title;
    const canvas = document.createElement("canvas");
    canvas.id = "chart-" + i;
    const legend = document.createElement("div");
    legend.className = "legend";
    c.series.forEach(([name], k) => {
      const s = document.createElement("span");
      s.innerHTML = '<i style="background: var(--s' + (k + 1) + ')"></i>';
      s.appendChild(document.createTextNode(name));
      legend.appendChild(s);
    });
    d.append(h, canvas, legend);
    charts.appendChild(d);
    c.canvas = canvas;
  });
}

function drawOverview() {
  const last = samples[samples.length - 1];
  if (!last) return;
  document.querySelectorAll("#tiles .tile .value").forEach((el, i) => {
    el.textContent = TILES[i][1](last);
  });
  for (const c of CHARTS) drawChart(c);
}

// A line chart of the samples: time on x (the last hour, right edge = now), 0..max on y.
function drawChart(c) {
  const canvas = c.canvas;
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const css = getComputedStyle(document.documentElement);
  const now = samples[samples.length - 1].t;
  const t0 = Math.max(samples[0].t, now - HOUR);
  const span = Math.max(now - t0, 30);
  let top_ = 0;
  for (const s of samples) for (const [, key] of c.series) if (s[key] > top_) top_ = s[key];
  const max = top_ > 0 ? top_ * 1.1 : 1;
  const left = 0, top = 14, bottom = h - 14;
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = css.getPropertyValue("--muted");
  ctx.strokeStyle = css.getPropertyValue("--line");
  ctx.beginPath();
  ctx.moveTo(left, bottom + 0.5);
  ctx.lineTo(w, bottom + 0.5);
  ctx.stroke();
  ctx.fillText("max " + c.fmt(top_), 2, 10);
  ctx.fillText("−" + secs(span), 2, h - 2);
  ctx.textAlign = "right";
  ctx.fillText("now", w - 2, h - 2);
  ctx.textAlign = "left";
  c.series.forEach(([, key], k) => {
    ctx.strokeStyle = css.getPropertyValue("--s" + (k + 1));
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let pen = false;
    for (const s of samples) {
      const v = s[key];
      if (v === null || v === undefined) { pen = false; continue; }
      const x = left + ((s.t - (now - span)) / span) * (w - left);
      const y = bottom - (v / max) * (bottom - top);
      if (pen) ctx.lineTo(x, y); else ctx.moveTo(x, y);
      pen = true;
    }
    ctx.stroke();
  });
}

// -- tables ------------------------------------------------------------------------------------

function table(el, columns, rows, sort, onSort) {
  const head = "<tr>" + columns.map((c) =>
    '<th data-key="' + c.key + '"' + (c.num ? ' class="num"' : "") + ">" + c.label +
    (sort && sort.key === c.key ? (sort.desc ? " ▾" : " ▴") : "") + "</th>").join("") + "</tr>";
  el.innerHTML = head;
  for (const r of rows) {
    const tr = document.createElement("tr");
    if (r.behind) tr.className = "behind";
    for (const c of columns) {
      const td = document.createElement("td");
      if (c.num) td.className = "num";
      const v = r[c.key];
      if (c.button) td.appendChild(c.button(r));
      else td.textContent = c.fmt ? c.fmt(v, r) : (v === null || v === undefined ? "–" : String(v));
      tr.appendChild(td);
    }
    el.appendChild(tr);
  }
  if (onSort) {
    el.querySelectorAll("th").forEach((th) => th.addEventListener("click", () => onSort(th.dataset.key)));
  }
}

const CLIENT_COLUMNS = [
  { key: "name", label: "Name" },
  { key: "user", label: "User" },
  { key: "peer", label: "Peer" },
  { key: "transport", label: "Transport" },
  { key: "logon_time", label: "Logon", fmt: (t) => when(t) },
  { key: "connected_s", label: "Connected", num: true, fmt: secs },
  { key: "subscriptions", label: "Subscriptions", num: true, fmt: (n) => count(n, "subs") },
  { key: "messages_in", label: "In", num: true, fmt: (n) => count(n, "msg") },
  { key: "messages_out", label: "Out", num: true, fmt: (n) => count(n, "msg") },
  { key: "bytes_in", label: "In (bytes)", num: true, fmt: bytes },
  { key: "bytes_out", label: "Out (bytes)", num: true, fmt: bytes },
  { key: "output_buffer_bytes", label: "Output buffer", num: true, fmt: bytes },
  { key: "behind", label: "Falling behind", fmt: (b, r) => (b ? "yes" : "no") +
    (r.replaying ? " (" + r.replaying + " replaying)" : "") },
  { key: "id", label: "", button: disconnectButton },
];

// The one action: disconnect a client, after the user confirms. The header is what the admin
// endpoint asks of every action (a page of another site cannot send it).
function disconnectButton(r) {
  const b = document.createElement("button");
  b.className = "action";
  b.textContent = "Disconnect";
  b.addEventListener("click", async () => {
    const who = (r.name || "client " + r.id) + " (" + r.peer + ")";
    if (!confirm("Disconnect " + who + "?")) return;
    const resp = await fetch("clients/" + r.id + "/disconnect", {
      method: "POST", headers: { "X-Requested-By": "tickertape-console" },
    });
    if (!resp.ok) alert("Could not disconnect " + who + ": " + (await resp.text()));
  });
  return b;
}

// rows whose `fields` contain the text of the filter box `input`, sorted by `sort`
function pick(rows, input, fields, sort) {
  const q = document.getElementById(input).value.trim().toLowerCase();
  const { key, desc } = sort;
  return rows.filter((c) => !q || fields.some((f) => c[f] && String(c[f]).toLowerCase().includes(q)))
    .sort((a, b) => {
      const x = a[key], y = b[key];
      const r = typeof x === "number" && typeof y === "number" ? x - y
        : String(x ?? "").localeCompare(String(y ?? ""));
      return desc ? -r : r;
    });
}

function drawClients() {
  const rows = pick(details.clients, "client-filter", ["name", "user", "peer", "transport"], clientSort);
  document.getElementById("clients-count").textContent = rows.length + " shown of " +
    details.clients_total + " clients" + (details.clients.length < details.clients_total
      ? " (the " + details.clients.length + " with the most output waiting are sent)" : "");
  table(document.getElementById("clients-table"), CLIENT_COLUMNS, rows, clientSort, (k) => {
    clientSort = { key: k, desc: clientSort.key === k ? !clientSort.desc : true };
    drawClients();
  });
}

const SUB_COLUMNS = [
  { key: "client", label: "Client" },
  { key: "sub_id", label: "Sub id" },
  { key: "topic", label: "Topic", fmt: (t, r) => (r.regex ? "regex " : "") + t },
  { key: "filter", label: "Filter" },
  { key: "options", label: "Options" },
  { key: "state", label: "State" },
  { key: "position", label: "Position", num: true, fmt: (n) => count(n, "B") },
  { key: "lag_bytes", label: "Behind journal end", num: true, fmt: bytes },
];

function drawSubscriptions() {
  const rows = pick(details.subscriptions || [], "sub-filter",
    ["client", "topic", "filter", "state", "options"], subSort);
  document.getElementById("subs-count").textContent = rows.length + " shown of " +
    (details.subscriptions_total || 0) + " subscriptions" +
    ((details.subscriptions || []).length < (details.subscriptions_total || 0)
      ? " (the " + details.subscriptions.length + " furthest behind are sent)" : "");
  table(document.getElementById("subs-table"), SUB_COLUMNS, rows, subSort, (k) => {
    subSort = { key: k, desc: subSort.key === k ? !subSort.desc : true };
    drawSubscriptions();
  });
}

const QUEUE_COLUMNS = [
  { key: "name", label: "Queue" },
  { key: "depth", label: "Depth", num: true, fmt: (n) => count(n, "msg") },
  { key: "leased", label: "Leased", num: true, fmt: (n) => count(n, "msg") },
  { key: "acked_per_s", label: "Acked", num: true, fmt: rate },
  { key: "acked", label: "Acked (total)", num: true, fmt: (n) => count(n, "msg") },
  { key: "redelivered", label: "Redelivered", num: true, fmt: (n) => count(n, "msg") },
  { key: "expired", label: "Expired", num: true, fmt: (n) => count(n, "msg") },
  { key: "dead_lettered", label: "Dead-lettered", num: true, fmt: (n) => count(n, "msg") },
  { key: "oldest_age_s", label: "Oldest waiting", num: true, fmt: (s) => s === null ? "–" : secs(s) },
  { key: "subscribers", label: "Consumers", num: true, fmt: (n) => count(n, "subs") },
  { key: "consumers", label: "Backlog per consumer", fmt: (cs) => cs.map((c) =>
    (c.consumer.match(/client=(\S+)/) || [null, c.consumer])[1] + " " + c.outstanding + "/" +
    c.max_backlog + " msg").join("; ") || "–" },
];

const SEGMENT_COLUMNS = [
  { key: "name", label: "Segment" },
  { key: "kind", label: "State" },
  { key: "start_position", label: "Start", num: true, fmt: (n) => count(n, "B") },
  { key: "end_position", label: "End", num: true, fmt: (n) => count(n, "B") },
  { key: "file_bytes", label: "Size", num: true, fmt: bytes },
  { key: "first_time_us", label: "From", fmt: (t) => when(t && t / 1e6) },
  { key: "until_time_us", label: "Until", fmt: (t, r) => r.kind === "active" ? "now" : when(t && t / 1e6) },
];

function drawQueues() {
  const rows = Object.entries(details.queues).map(([name, q]) => ({ name, ...q }));
  table(document.getElementById("queues-table"), QUEUE_COLUMNS, rows);
}

// -- SOW topics: the view from each sample, and queries on demand (GET sow/<topic>) ----------

const SOW_COLUMNS = [
  { key: "topic", label: "Topic" },
  { key: "records", label: "Records", num: true, fmt: (n) => count(n, "rec") },
  { key: "keys", label: "Key", fmt: (k) => k.join(", ") },
  { key: "updates_per_s", label: "Updates", num: true, fmt: rate },
  { key: "updates", label: "Since start", num: true, fmt: (n) => count(n, "msg") },
  { key: "expiration_s", label: "Expiration", fmt: (s) => (s ? secs(s) : "–") },
];

const RECORD_COLUMNS = [
  { key: "k", label: "Key" },
  { key: "bm", label: "Bookmark" },
  { key: "time_us", label: "Updated", fmt: (t) => when(t / 1e6) },
  { key: "body", label: "Record", fmt: (b) => JSON.stringify(b) },
];

function drawSow() {
  const sow = details.sow || { topics: {}, store_bytes: null };
  const rows = Object.entries(sow.topics).map(([topic, t]) => ({ topic, ...t }));
  document.getElementById("sow-store").textContent = rows.length
    ? "Store: " + bytes(sow.store_bytes) : "No SOW topic holds records.";
  table(document.getElementById("sow-table"), SOW_COLUMNS, rows);
  const select = document.getElementById("sow-topic");
  const names = rows.map((r) => r.topic);
  if ([...select.options].map((o) => o.value).join() !== names.join()) {
    const keep = select.value;
    select.innerHTML = "";
    for (const n of names) select.add(new Option(n, n, false, n === keep));
  }
}

async function querySow(e) {
  e.preventDefault();
  const topic = document.getElementById("sow-topic").value;
  const out = document.getElementById("sow-result");
  if (!topic) return;
  const args = new URLSearchParams({
    filter: document.getElementById("sow-filter").value,
    order_by: document.getElementById("sow-order").value,
    top_n: document.getElementById("sow-top").value || "100",
  });
  const resp = await fetch("sow/" + encodeURIComponent(topic) + "?" + args);
  if (!resp.ok) {
    out.textContent = "Query refused: " + (await resp.text());
    table(document.getElementById("sow-records"), RECORD_COLUMNS, []);
    return;
  }
  const a = await resp.json();
  out.textContent = a.returned + " of " + a.matches + " matching records of " + a.topic;
  table(document.getElementById("sow-records"), RECORD_COLUMNS, a.records);
}

const ACTION_COLUMNS = [
  { key: "name", label: "Action" },
  { key: "steps", label: "Steps", fmt: (s) => s.join(", ") },
  { key: "last", label: "Last run", fmt: (l, r) => r.running ? "running" : when(l && l.started) },
  { key: "last", label: "Result", fmt: actionResult },
  { key: "next_run", label: "Next run", fmt: (t, r) => r.trigger === "startup" ? "at startup" : when(t) },
  { key: "name", label: "", button: runButton },
];

// What the last run's last step said; `failed:` when a step failed (the rest were skipped), and
// `held:` for each step that ran but could not do all it should, with its reason.
function actionResult(l) {
  if (!l) return "–";
  const out = (l.ok === false ? "failed: " : "") + l.result;
  const held = (l.held || []).map((h) => "held: " + h);
  return [out, ...held].join("\n");
}

// The other action: run a scheduled journal action now, after the user confirms (the same
// header as the disconnect action).
function runButton(r) {
  const b = document.createElement("button");
  b.className = "action";
  b.textContent = "Run now";
  b.disabled = r.running;
  b.addEventListener("click", async () => {
    if (!confirm("Run the journal action " + r.name + " (" + r.steps.join(", ") + ") now?")) return;
    const resp = await fetch("actions/" + encodeURIComponent(r.name) + "/run", {
      method: "POST", headers: { "X-Requested-By": "tickertape-console" },
    });
    if (!resp.ok) alert("Could not run " + r.name + ": " + (await resp.text()));
  });
  return b;
}

function drawJournal() {
  const actions = details.actions || [];
  document.getElementById("actions").hidden = actions.length === 0;  // none configured
  table(document.getElementById("actions-table"), ACTION_COLUMNS, actions);
  table(document.getElementById("journal-table"), SEGMENT_COLUMNS, details.segments);
}

// -- views and the stream --------------------------------------------------------------------

const DRAW = {
  overview: drawOverview, clients: drawClients, subscriptions: drawSubscriptions,
  queues: drawQueues, sow: drawSow, journal: drawJournal,
};
let view = "overview";

function show() {
  view = (location.hash || "#overview").slice(1);
  if (!DRAW[view]) view = "overview";
  document.querySelectorAll(".view").forEach((el) => { el.hidden = el.id !== view; });
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  DRAW[view]();
}

function connect() {
  const status = document.getElementById("status");
  const es = new EventSource("events");
  es.addEventListener("history", (e) => {
    samples.length = 0;
    for (const s of JSON.parse(e.data)) samples.push(s);
    status.dataset.state = "live";
    status.textContent = "live";
    DRAW[view]();
  });
  es.addEventListener("sample", (e) => {
    const m = JSON.parse(e.data);
    const s = m.sample;
    if (!samples.length || samples[samples.length - 1].n < s.n) samples.push(s);
    while (samples.length > HOUR) samples.shift();
    details = m;
    document.getElementById("instance").textContent = m.instance || "";
    DRAW[view]();
  });
  es.onerror = () => {
    status.dataset.state = "down";
    status.textContent = "disconnected, retrying…";
  };
}

buildOverview();
window.addEventListener("hashchange", show);
window.addEventListener("resize", () => DRAW[view]());
document.getElementById("client-filter").addEventListener("input", drawClients);
document.getElementById("sub-filter").addEventListener("input", drawSubscriptions);
document.getElementById("sow-query").addEventListener("submit", querySow);
show();
connect();
