// The monitor page: polls /monitor.json once a second and draws the numbers and one card per
// device. No build step, no framework. An API key, when the server wants one, comes from the
// URL (#key=...) or the form, and is kept in this browser's localStorage.
"use strict";

const KEY_STORE = "strata-api-key";
const $ = (id) => document.getElementById(id);

function apiKey() {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) localStorage.setItem(KEY_STORE, decodeURIComponent(m[1]));
  return localStorage.getItem(KEY_STORE);
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function duration(s) {
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  return h ? `${h}h ${m}m` : m ? `${m}m ${sec}s` : `${sec}s`;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}

function row(name, value, attrs) {
  return el("tr", attrs, el("td", {}, name), el("td", { class: "num" }, value));
}

function deviceCard(d) {
  const engineBytes = d.regions.reduce((sum, r) => sum + r.n_bytes, 0);
  const card = el("div", { class: "card device-card", "data-device": d.device });
  const layers = d.layers ? `layers ${d.layers[0]}–${d.layers[1] - 1}` : "all layers";
  card.append(el("h3", {}, `${d.device} · ${d.label}`), el("div", { class: "meta" }, layers));
  if (d.total_bytes) {
    const other = Math.max(0, d.used_bytes - engineBytes);
    const bar = el("div", { class: "bar", title: "engine regions / other use / free" });
    bar.append(el("span", { class: "used-engine", style: `width:${100 * Math.min(engineBytes, d.used_bytes) / d.total_bytes}%` }),
               el("span", { class: "used-other", style: `width:${100 * other / d.total_bytes}%` }));
    card.append(bar);
  }
  const table = el("table");
  if (d.total_bytes) {
    table.append(row("VRAM used (NVML)", bytes(d.used_bytes), { "data-vram": "used" }),
                 row("VRAM free (NVML)", bytes(d.free_bytes), { "data-vram": "free" }));
  }
  for (const r of d.regions) table.append(row(r.name, bytes(r.n_bytes), { class: "region", "data-region": r.name }));
  if (d.expert_slots !== null) {
    const hit = d.expert_hit_rate === null ? "–" : `${(100 * d.expert_hit_rate).toFixed(1)}%`;
    table.append(row("expert cache slots", String(d.expert_slots), { "data-expert": "slots" }),
                 row("expert hit rate", hit, { "data-expert": "hit-rate" }));
  }
  card.append(table);
  return card;
}

function show(data) {
  const m = data.metrics;
  $("model").textContent = data.model;
  $("context").textContent = data.max_context.toLocaleString();
  $("uptime").textContent = duration(m.uptime_s);
  $("decode-rate").textContent = m.decode_tok_s.toFixed(1);
  $("prefill-rate").textContent = m.prefill_tok_s.toFixed(1);
  $("active").textContent = m.active;
  $("slots").textContent = m.slots;
  $("queue").textContent = m.queue_depth;
  $("requests").textContent = m.requests;
  $("tokens-in").textContent = m.prompt_tokens.toLocaleString();
  $("tokens-out").textContent = m.completion_tokens.toLocaleString();
  $("devices").replaceChildren(...data.devices.map(deviceCard));
}

function problem(text, askKey) {
  $("banner").hidden = !text;
  $("banner-text").textContent = text || "";
  $("key-form").hidden = !askKey;
}

async function poll() {
  const key = apiKey();
  try {
    const r = await fetch("/monitor.json", { headers: key ? { "x-api-key": key } : {} });
    if (r.status === 401) { problem("This server needs an API key.", true); return; }
    if (!r.ok) { problem(`The server answered ${r.status}.`, false); return; }
    show(await r.json());
    problem("", false);
    document.body.dataset.ready = "1";
  } catch (e) {
    problem(`The server is not answering (${e.message}).`, false);
  }
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  localStorage.setItem(KEY_STORE, $("key").value);
  poll();
});
poll();
setInterval(poll, 1000);
