// Helpers shared by the dashboard pages. Same-origin fetches carry the token cookie when a token is set.
"use strict";
const tf = {
  async getJSON(url) {
    const r = await fetch(url, { headers: { "Accept": "application/json" }, credentials: "same-origin" });
    if (!r.ok) throw new Error((await tf.detail(r)) || r.statusText);
    return r.json();
  },
  async postJSON(url, body) {
    const r = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "Accept": "application/json" },
      body: JSON.stringify(body || {}),
    });
    if (!r.ok) throw new Error((await tf.detail(r)) || r.statusText);
    return r.json();
  },
  async detail(r) {
    try { return (await r.json()).detail; } catch (e) { return ""; }
  },
  el(tag, attrs, text) {  // textContent only: job names and logs are never parsed as HTML
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  },
  duration(s) {
    if (s === null || s === undefined) return "";
    s = Math.round(s);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  },
  mib(bytes) { return (bytes / 1048576).toFixed(1) + " MiB"; },
  final(state) { return state === "succeeded" || state === "failed" || state === "cancelled"; },
  progressCell(p) {
    const td = tf.el("td");
    if (p.total_steps) {
      const bar = tf.el("span", { class: "bar" });
      const fill = tf.el("span", { style: "width:" + Math.round(100 * (p.fraction || 0)) + "%" });
      bar.appendChild(fill);
      td.appendChild(bar);
      td.appendChild(document.createTextNode(p.step + "/" + p.total_steps));
    } else {
      td.textContent = String(p.step);
    }
    return td;
  },
};
