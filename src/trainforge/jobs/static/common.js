// Helpers shared by the dashboard pages. The pages themselves hold no data: everything comes from the JSON
// API. A server with a token: the token is asked for once per tab (or taken from a #token=... link, which
// never reaches the server), kept in sessionStorage (this origin and tab only; no cookie another port could
// receive) and sent as an Authorization header. State changes carry a header a cross-site form cannot send.
"use strict";
const TOKEN_KEY = "trainforge-token";
const tf = {
  token() { return sessionStorage.getItem(TOKEN_KEY); },
  headers(extra) {
    const h = Object.assign({ "Accept": "application/json" }, extra || {});
    const t = tf.token();
    if (t) h["Authorization"] = "Bearer " + t;
    return h;
  },
  async answer(r) {
    if (r.status === 401) { tf.askToken(); throw new Error("this server needs its API token"); }
    if (!r.ok) throw new Error((await tf.detail(r)) || r.statusText);
    return r.json();
  },
  async getJSON(url) {
    return tf.answer(await fetch(url, { headers: tf.headers(), credentials: "omit", cache: "no-store" }));
  },
  async postJSON(url, body) {
    return tf.answer(await fetch(url, {
      method: "POST", credentials: "omit",
      headers: tf.headers({ "Content-Type": "application/json", "X-Trainforge-Client": "dashboard" }),
      body: JSON.stringify(body || {}),
    }));
  },
  askToken() {
    const form = document.getElementById("login");
    if (!form.hidden) return;
    form.hidden = false;
    document.getElementById("token-input").focus();
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
    if (p.unreadable) {
      td.textContent = "unreadable: " + p.unreadable;
    } else if (p.total_steps) {
      const bar = tf.el("span", { class: "bar" });
      const fill = tf.el("span");
      fill.style.width = Math.round(100 * (p.fraction || 0)) + "%";  // CSSOM: allowed by the page's CSP
      bar.appendChild(fill);
      td.appendChild(bar);
      td.appendChild(document.createTextNode(p.step + "/" + p.total_steps));
    } else {
      td.textContent = String(p.step);
    }
    return td;
  },
};

(function () {
  if (location.hash.startsWith("#token=")) {  // a link the operator shared: keep the token, drop it from the address
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(location.hash.slice(7)));
    history.replaceState(null, "", location.pathname + location.search);
  }
  document.getElementById("login").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
    location.reload();
  });
})();
