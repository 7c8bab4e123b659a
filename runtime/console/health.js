// Health: this server's node(s) and small live charts of its request
// rate and latency, exchanges in flight and the state store's commits,
// from GET /v1/stats once a second (figures computed by the server). With
// tenancy on they are the admin token's: another token is told so, and
// the page stops asking.

import { api } from "./api.js";
import { $, h, replace } from "./dom.js";
import { setLive } from "./main.js";
import { refusal } from "./session.js";
/** @typedef {import("./api.js").Schemas} Schemas */

const POINTS = 60;
const CHARTS = [
  { key: "rps", title: "Requests per second", unit: "/s", series: ["requests/s"] },
  { key: "latency", title: "Latency (ms)", unit: " ms", series: ["p50", "p95", "p99"] },
  { key: "exchanges", title: "Exchanges in flight", unit: "", series: ["exchanges"] },
  { key: "commits", title: "Store commits per second", unit: "/s", series: ["commits/s"] },
  { key: "wpc", title: "Writes per commit", unit: "", series: ["writes/commit"] },
];
const COLOURS = ["#1f5fbf", "#b35900", "#a3174d"];

const state = { root: null, timer: 0, last: null, data: {}, charts: {} };

export function show(root, args, first) {
  if (first || !state.root) build(root);
  if (!state.timer) {
    poll();
    state.timer = setInterval(poll, 1000);
  }
}

export function leave() {
  clearInterval(state.timer);
  state.timer = 0;
}

function build(root) {
  state.root = root;
  const grid = h("div", { class: "charts" });
  for (const c of CHARTS) {
    state.data[c.key] = c.series.map(() => []);
    const canvas = h("canvas", { width: 320, height: 90, role: "img", "aria-label": c.title });
    const value = h("output", { class: "value", id: "value-" + c.key, text: "–" });
    grid.append(
      h(
        "figure",
        { class: "chart", "data-chart": c.key },
        h("figcaption", null, c.title, " ", value),
        canvas,
        c.series.length > 1 ? h("p", { class: "keys" }, c.series.map((s, i) => h("span", { class: "key key-" + i, text: s }))) : null,
      ),
    );
    state.charts[c.key] = { canvas, value, spec: c };
  }
  replace(
    root,
    h("header", { class: "view-head" }, h("h2", { id: "health-title", text: "Health" })),
    h("h3", { text: "Nodes" }),
    h(
      "table",
      { class: "nodes" },
      h("thead", null, h("tr", null, ["Node", "Address", "PID", "Version", "Up", "Connections", "Threads", "Tasks"].map((t) => h("th", { scope: "col", text: t })))),
      h("tbody", { id: "nodes" }),
    ),
    h("h3", { text: "Last minute" }),
    grid,
  );
}

function push(key, values) {
  const d = state.data[key];
  values.forEach((v, i) => {
    d[i].push(v);
    if (d[i].length > POINTS) d[i].shift();
  });
  const c = state.charts[key];
  c.value.textContent = values.map((v) => fmt(v) + c.spec.unit).join(" / ");
  draw(c.canvas, d);
}

const fmt = (v) => (v >= 100 ? Math.round(v).toString() : v >= 10 ? v.toFixed(1) : v.toFixed(2));

function draw(canvas, series) {
  const ctx = canvas.getContext("2d");
  const { width, height } = canvas;
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1e-9, ...series.flat()) * 1.15;
  ctx.strokeStyle = "#d0d4da";
  ctx.lineWidth = 1;
  ctx.beginPath();
  ctx.moveTo(0, height - 0.5);
  ctx.lineTo(width, height - 0.5);
  ctx.stroke();
  ctx.fillStyle = "#4a5160";
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillText(fmt(max), 4, 11);
  series.forEach((points, i) => {
    ctx.strokeStyle = COLOURS[i];
    ctx.lineWidth = 2;
    ctx.beginPath();
    // The newest point at the right edge.
    const first = POINTS - points.length;
    points.forEach((v, x) => {
      const px = ((first + x) / (POINTS - 1)) * width;
      const py = height - 2 - (v / max) * (height - 14);
      if (x === 0) ctx.moveTo(px, py);
      else ctx.lineTo(px, py);
    });
    ctx.stroke();
  });
}

async function poll() {
  const root = state.root;
  /** @type {Schemas["Stats"]} */
  let s;
  try {
    s = await api("GET", "/v1/stats?window=2");
    if (!root || state.root !== root) return; // refused meanwhile
    setLive("live");
  } catch (err) {
    if (!root || state.root !== root) return;
    if (err.status === 403) {
      // Not this token's: said once, not asked again every second.
      leave();
      setLive("off", err);
      replace(state.root, h("header", { class: "view-head" }, h("h2", { id: "health-title", text: "Health" })), refusal(err, "The server's health"));
      state.root = null; // built again on the next visit
      return;
    }
    setLive("down");
    replace($("#nodes", state.root), h("tr", null, h("td", { colspan: 8, class: "error", role: "alert", text: String(err) })));
    return;
  }
  replace(
    $("#nodes", state.root),
    s.nodes.map((n) =>
      h(
        "tr",
        null,
        h("td", null, h("span", { class: "dot ok", "aria-hidden": "true" }), n.name + (n.self ? " (this node)" : "")),
        h("td", null, h("code", { text: n.address })),
        h("td", { text: n.pid }),
        h("td", { text: n.version }),
        h("td", { text: uptime(n.uptime_s) }),
        h("td", { text: s.http.connections_open }),
        h("td", { text: s.threads ?? "–" }),
        h("td", { text: s.tasks ? `${s.tasks.running} running, ${s.tasks.pending} pending` : "–" }),
      ),
    ),
  );
  push("rps", [s.http.requests_per_s]);
  push("latency", [s.http.latency_ms.p50, s.http.latency_ms.p95, s.http.latency_ms.p99]);
  push("exchanges", [s.exchanges_in_flight]);
  // Rates from two readings of the store's counters.
  const prev = state.last;
  state.last = s;
  if (prev) {
    const dt = Math.max(0.001, (s.time - prev.time) / 1000);
    const commits = s.storage.commits - prev.storage.commits;
    const writes = s.storage.writes - prev.storage.writes;
    push("commits", [commits / dt]);
    push("wpc", [commits > 0 ? writes / commits : 0]);
  }
}

function uptime(sec) {
  if (sec < 120) return Math.round(sec) + " s";
  if (sec < 7200) return Math.round(sec / 60) + " min";
  return (sec / 3600).toFixed(1) + " h";
}
