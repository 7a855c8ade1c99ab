// The GPU page: slots, their reservations and (with pynvml) live utilization, refreshed every 3 s.
"use strict";
(function () {
  const tbody = document.querySelector("#slots tbody");

  function row(s) {
    const tr = tf.el("tr", { "data-slot-id": s.id });
    tr.appendChild(tf.el("td", {}, s.id));
    tr.appendChild(tf.el("td", {}, s.name));
    const used = tf.el("td");
    const bar = tf.el("span", { class: "bar" });
    const fill = tf.el("span");
    fill.style.width = Math.min(100, Math.round(100 * s.reserved_bytes / s.memory_bytes)) + "%";
    bar.appendChild(fill);
    used.appendChild(bar);
    used.appendChild(document.createTextNode(tf.mib(s.reserved_bytes) + " / " + tf.mib(s.memory_bytes)));
    tr.appendChild(used);
    const jobs = tf.el("td");
    s.jobs.forEach((j) => { jobs.appendChild(tf.el("a", { href: "/jobs/" + j.id }, j.id + " " + j.name)); jobs.appendChild(document.createTextNode(" ")); });
    tr.appendChild(jobs);
    tr.appendChild(tf.el("td", {}, s.live ? s.live.utilization_pct + "%" : "-"));
    tr.appendChild(tf.el("td", {}, s.live ? tf.mib(s.live.used_bytes) + " / " + tf.mib(s.live.total_bytes) : "-"));
    return tr;
  }

  async function refresh() {
    try { tbody.replaceChildren(...(await tf.getJSON("/api/gpus")).map(row)); } catch (e) { /* retry next tick */ }
  }
  refresh();
  setInterval(refresh, 3000);
})();
