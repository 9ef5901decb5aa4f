// The kernelcore web console: a chat playground and an operator console. Plain DOM, no build step, no CDN.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "kc-api-key";
let keyWaiters = [];

// Text from the server (model output, model and plugin names, error messages) reaches the page only as text:
// textContent, Text nodes (append() of a string) and inert attributes. No HTML-parsing or code-evaluating sink
// is used anywhere, and el() refuses the attributes that would run text or load it as a URL or a style (event
// handlers, href, src, style...). On top of this, the page's CSP forbids inline script.
const UNSAFE_ATTRIBUTES = /^(on|href$|src|xlink:href$|action$|formaction$|style$|srcdoc$|background$|poster$|data$)/i;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (UNSAFE_ATTRIBUTES.test(k)) throw new Error(`el(): refusing the ${k} attribute`);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);  // a string becomes a Text node, never markup
  return node;
}

// A class name from the server's words only when it is one the stylesheet knows.
const STATUS_CLASSES = new Set(["discovered", "loaded", "blocked", "not-allowed", "failed"]);
const statusTag = (status) => (STATUS_CLASSES.has(status) ? `tag ${status}` : "tag");

// -- the API key: asked for when a call answers 401, kept in this browser's session ------------------------------
// It only ever travels in the Authorization header: never in a URL (no query string, no form submission).

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function askForKey(wasRefused) {
  $("key-error").hidden = !wasRefused;
  $("key-dialog").hidden = false;
  $("api-key").focus();
  return new Promise((resolve) => keyWaiters.push(resolve));
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY_STORAGE, $("api-key").value);
  $("key-dialog").hidden = true;
  const waiters = keyWaiters;
  keyWaiters = [];
  waiters.forEach((resolve) => resolve());
});

async function api(path, options = {}) {
  for (;;) {
    const response = await fetch(path, { ...options, headers: { ...(options.headers || {}), ...authHeaders() } });
    if (response.status !== 401) return response;
    await askForKey(sessionStorage.getItem(KEY_STORAGE) !== null);
  }
}

async function apiJSON(path) {
  const response = await api(path);
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

// -- tabs ---------------------------------------------------------------------------------------------------------

function showTab() {
  const tab = location.hash === "#console" ? "console" : "chat";
  $("chat-view").hidden = tab !== "chat";
  $("console-view").hidden = tab !== "console";
  $("tab-chat").classList.toggle("active", tab === "chat");
  $("tab-console").classList.toggle("active", tab === "console");
  if (tab === "console") Console.start(); else Console.stop();
}
window.addEventListener("hashchange", showTab);

// -- chat playground ----------------------------------------------------------------------------------------------

const Chat = {
  history: [],
  controller: null,

  async loadModels() {
    const models = (await apiJSON("/v1/models")).data;
    const select = $("model");
    select.replaceChildren(...models.map((m) =>
      el("option", { value: m.id, text: m.parent ? `${m.id} (LoRA adapter of ${m.parent})` : m.id })));
    $("server-info").textContent = `${models.length ? models[0].id : "no model"} · ${location.host}`;
  },

  settings() {
    const body = { model: $("model").value, temperature: Number($("temperature").value),
                   top_p: Number($("top_p").value), max_tokens: Number($("max_tokens").value) };
    if ($("top_k").value !== "") body.top_k = Number($("top_k").value);
    if ($("seed").value !== "") body.seed = Number($("seed").value);
    const stops = $("stop_strings").value.split("\n").filter((s) => s !== "");
    if (stops.length) body.stop = stops;
    if ($("ignore_eos").checked) body.ignore_eos = true;
    return body;
  },

  addMessage(role, text) {
    const node = el("div", { class: `msg ${role}` }, el("span", { class: "role", text: role }), el("span", { class: "content", text }));
    $("messages").append(node);
    node.scrollIntoView({ block: "end" });
    return node.querySelector(".content");
  },

  setStatus(status, text) {
    $("gen-stats").dataset.status = status;
    $("gen-stats").textContent = text;
  },

  async send(text) {
    this.history.push({ role: "user", content: text });
    this.addMessage("user", text);
    const system = $("system").value.trim();
    const messages = (system ? [{ role: "system", content: system }] : []).concat(this.history);
    const body = { ...this.settings(), messages, stream: true,
                   stream_options: { include_usage: true, continuous_usage_stats: true } };
    const content = this.addMessage("assistant", "");
    const controller = this.controller = new AbortController();
    $("send").disabled = true;
    $("stop").disabled = false;
    this.setStatus("waiting", "waiting for the first token...");
    const started = performance.now();
    let firstAt = null, tokens = 0, reply = "";
    const show = (state) => {
      const seconds = firstAt === null ? 0 : (performance.now() - firstAt) / 1000;
      const rate = seconds > 0 && tokens > 1 ? ((tokens - 1) / seconds).toFixed(1) : "-";
      const ttft = firstAt === null ? "-" : (firstAt - started).toFixed(0);
      this.setStatus(state, `${state} · ${tokens} tokens · ${rate} tokens/s · TTFT ${ttft} ms`);
    };
    try {
      const response = await api("/v1/chat/completions", { method: "POST", signal: controller.signal,
        headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
      if (!response.ok) {
        const error = await response.json().catch(() => ({}));
        throw new Error((error.error && error.error.message) || `HTTP ${response.status}`);
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        const lines = buffer.split("\n");
        buffer = lines.pop();
        for (const line of lines) {
          if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
          const event = JSON.parse(line.slice(6));
          if (event.error) throw new Error(event.error.message || JSON.stringify(event.error));
          if (event.usage) tokens = event.usage.completion_tokens;
          for (const choice of event.choices || []) {
            const piece = (choice.delta && choice.delta.content) || "";
            if (piece && firstAt === null) firstAt = performance.now();
            reply += piece;
            content.textContent = reply;
          }
          show("streaming");
        }
      }
      show("done");
    } catch (error) {
      if (error.name === "AbortError") {
        show("stopped");
      } else {
        content.parentElement.classList.add("error");
        content.textContent = error.message;
        this.setStatus("error", "error");
      }
    } finally {
      this.history.push({ role: "assistant", content: reply });
      this.controller = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  },

  init() {
    $("composer").addEventListener("submit", (event) => {
      event.preventDefault();
      const text = $("prompt").value;
      if (!text.trim() || this.controller) return;
      $("prompt").value = "";
      this.send(text);
    });
    $("prompt").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
    });
    $("stop").addEventListener("click", () => this.controller && this.controller.abort());  // closes the stream: the server aborts
    $("reset").addEventListener("click", () => { this.history = []; $("messages").replaceChildren(); this.setStatus("idle", ""); });
  },
};

// -- small line charts on a canvas ----------------------------------------------------------------------------------

const COLORS = ["#2f6fde", "#e0842f"];
const POINTS = 90;

function drawChart(canvas, series, unit) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width, h = canvas.height;
  ctx.clearRect(0, 0, w, h);
  const values = series.flat().filter((v) => v !== null);
  const max = Math.max(1e-9, ...values) * 1.15;
  series.forEach((points, i) => {
    ctx.strokeStyle = COLORS[i];
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    let drawing = false;
    points.forEach((v, j) => {
      if (v === null) { drawing = false; return; }
      const x = (j + POINTS - points.length) * (w / (POINTS - 1)), y = h - 4 - (v / max) * (h - 16);
      drawing ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
      drawing = true;
    });
    ctx.stroke();
  });
  ctx.fillStyle = "#1d2330";
  ctx.font = "11px system-ui";
  const last = series.map((s) => s[s.length - 1]).map((v) => (v === null || v === undefined ? "-" : +v.toFixed(2)));
  ctx.fillText(`${last.join(" / ")} ${unit}  (max ${+(max / 1.15).toFixed(2)})`, 4, 11);
}

const resultText = (r) => (r === undefined || r === null ? "" : typeof r === "string" ? r : JSON.stringify(r));

// -- operator console -----------------------------------------------------------------------------------------------

const Console = {
  timers: [],
  previous: null,
  series: { running: [], waiting: [], kv: [], throughput: [], ttft: [] },
  traceOffset: 0,
  events: new Map(),  // "pid role" -> events

  start() {
    if (this.timers.length) return;
    const every = (fn, ms) => { fn(); this.timers.push(setInterval(fn, ms)); };
    every(() => this.overview().catch(console.error), 5000);
    every(() => this.stats().catch(console.error), 1000);
    every(() => this.trace().catch(console.error), 2000);
  },

  stop() { this.timers.forEach(clearInterval); this.timers = []; },

  async overview() {
    const o = await apiJSON("/console/api/overview");
    const p = o.platform;
    const dl = (pairs) => el("dl", {}, ...pairs.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: String(v) })]));
    if (p) {
      const detections = el("table", {}, el("tr", {}, ...["detector", "distribution", "answer"].map((t) => el("th", { text: t }))),
        ...p.detections.map((d) => el("tr", {}, el("td", {}, d.name, d.name === p.name ? el("span", { class: "tag winner", text: "chosen" }) : ""),
          el("td", { text: d.dist }), el("td", { text: d.qualname || (d.error ? `error: ${d.error}` : "inactive") }))));
      $("platform").replaceChildren(dl([["platform", p.name], ["class", p.class], ["device", `${p.device_name} (${p.device_type})`],
        ["why", p.why || "-"]]), detections);
    }
    const m = o.model;
    $("model-info").replaceChildren(dl([["served as", m.name], ["path", m.path], ["architecture", `${m.architecture} (plugin ${o.models[m.architecture] || "?"})`],
      ["dtype", m.dtype], ["max model len", m.max_model_len], ...Object.entries(o.config), ["metrics prefix", `${o.metrics_prefix}:`], ["version", o.version]]));
    const header = (...names) => el("tr", {}, ...names.map((t) => el("th", { text: t })));
    $("plugins").replaceChildren(header("group", "plugin", "distribution", "origin", "status", "hooks"),
      ...o.plugins.map((r) => el("tr", { "data-plugin": r.name },
        el("td", { text: r.group.replace("kernelcore.", "") }), el("td", { text: r.name }), el("td", { text: `${r.dist} ${r.version}` }),
        el("td", { text: r.is_builtin ? "built-in" : "third-party" }),
        el("td", {}, el("span", { class: statusTag(r.status), text: r.status }), r.error ? el("div", { class: "error", text: r.error }) : ""),
        el("td", {}, ...r.hooks.map((h) => el("span", { class: "tag", text: h }))))));
    const depth = new Map();
    $("processes").replaceChildren(header("process", "pid", "host", "platform", "state", "plugins loaded"),
      ...o.processes.map((proc) => {
        depth.set(proc.pid, proc.parent_pid === null ? 0 : (depth.get(proc.parent_pid) || 0) + 1);
        return el("tr", { "data-role": proc.role },
          el("td", { text: `${"\u2003".repeat(depth.get(proc.pid))}${proc.role}` }), el("td", { text: proc.pid }), el("td", { text: proc.host }),
          el("td", { text: proc.platform || "-" }), el("td", {}, el("span", { class: `tag ${proc.alive ? "alive" : "dead"}`, text: proc.alive ? "alive" : "gone" })),
          el("td", {}, ...proc.plugins.map((pl) => el("span", { class: "tag", title: `${pl.group} · ${pl.dist}`, text: pl.name }))));
      }));
    this.traceEnabled = o.trace_enabled;
  },

  async stats() {
    const s = await apiJSON("/console/api/stats");
    const push = (name, v) => { const a = this.series[name]; a.push(v); if (a.length > POINTS) a.shift(); };
    push("running", s.running);
    push("waiting", s.waiting);
    push("kv", 100 * s.kv_cache_usage);
    const prev = this.previous;
    if (prev) {
      const dt = s.time - prev.time;
      push("throughput", dt > 0 ? (s.generation_tokens - prev.generation_tokens) / dt : null);
      const n = s.ttft_count - prev.ttft_count;
      push("ttft", n > 0 ? (1000 * (s.ttft_sum - prev.ttft_sum)) / n : null);
    }
    this.previous = s;
    drawChart($("chart-requests"), [this.series.running, this.series.waiting], "reqs");
    drawChart($("chart-kv"), [this.series.kv], "%");
    drawChart($("chart-throughput"), [this.series.throughput], "tok/s");
    drawChart($("chart-ttft"), [this.series.ttft], "ms");
  },

  async trace() {
    const t = await apiJSON(`/console/api/trace?offset=${encodeURIComponent(this.traceOffset)}`);
    if (!t.enabled) {
      $("timeline").replaceChildren(el("p", { class: "muted",
        text: "No trace: start the server with KC_TRACE_PLUGINS=/path/trace.jsonl to see every hook call, per process, here (the `kc plugins tour` view)." }));
      return;
    }
    this.traceOffset = t.offset;
    for (const e of t.events) {
      const key = `${e.role} (pid ${e.pid})`;
      if (!this.events.has(key)) this.events.set(key, []);
      const list = this.events.get(key);
      list.push(e);
      if (list.length > 500) list.shift();
    }
    if (!t.events.length && $("timeline").childElementCount) return;
    const all = [...this.events.values()].flat();
    const t0 = Math.min(...all.map((e) => e.time));
    $("timeline").replaceChildren(...[...this.events.entries()].map(([key, list], i) => el("div", { class: "proc", "data-process": key },
      el("h3", { text: `${i + 1}. ${key}` }),
      el("pre", { text: list.map((e) => `+${(e.time - t0).toFixed(3).padStart(8)}s  ${e.hook.padEnd(34)} ${((e.plugins || []).join(",") || "-").padEnd(24)} ` +
        `${(e.duration_ms || 0).toFixed(2).padStart(8)} ms  -> ${resultText(e.result)}${e.ok === false ? "  FAILED" : ""}`).join("\n") }))));
  },
};

Chat.init();
showTab();
Chat.loadModels().catch((error) => Chat.setStatus("error", `cannot list models: ${error.message}`));
