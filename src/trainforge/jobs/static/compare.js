// The comparison page: the jobs of ?ids=1&ids=2... from GET /api/compare (their runs, curves, the config keys whose
// values differ, test metrics), drawn with textContent only; one color per job, the same on every chart and beside
// its name. "Download" saves the same comparison as `trainforge runs compare`'s page (GET /api/compare.html).
"use strict";
(function () {
  const query = new URLSearchParams(location.search).getAll("ids").map((i) => "ids=" + encodeURIComponent(i)).join("&");
  const status = document.getElementById("compare-status");
  const NS = "http://www.w3.org/2000/svg";

  function num(v) {
    if (v === null || v === undefined) return "–";
    return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
  }
  function raw(v) { return typeof v === "string" ? v : JSON.stringify(v); }  // a config value as written, never rounded

  function row(name, cells, swatch) {
    const tr = tf.el("tr", { "data-key": name });
    const th = tf.el("th");
    if (swatch !== undefined) th.appendChild(tf.el("span", { class: "swatch s" + swatch }));
    th.appendChild(document.createTextNode(name));
    tr.appendChild(th);
    for (const c of cells) tr.appendChild(tf.el("td", {}, c));
    return tr;
  }

  function table(id, head, rows) {
    const t = document.getElementById(id);
    const hr = tf.el("tr");
    for (const h of head) hr.appendChild(tf.el("th", {}, h));
    t.tHead.replaceChildren(hr);
    t.tBodies[0].replaceChildren(...rows);
  }

  function draw(doc) {
    const labels = doc.runs.map((r) => r.label);
    document.querySelector("#compare-runs tbody").replaceChildren(...doc.runs.map((r, i) => row(r.label, [
      r.status, String(r.steps),
      r.best_val === null ? "" : r.metric + " " + num(r.best_val) + " at step " + r.best_val_step,
      r.test === null ? "" : r.metric + " " + num(r.test), tf.duration(r.duration_s),
      r.micro_batch_size === null ? "" : String(r.micro_batch_size), r.device || ""], i)));
    document.getElementById("compare-charts").replaceChildren(...doc.curves.map((c) => {
      const fig = tf.el("figure");
      fig.appendChild(tf.el("figcaption", {}, c.title));
      const svg = document.createElementNS(NS, "svg");
      for (const [k, v] of Object.entries({ id: "chart-" + c.id, class: "chart", viewBox: "0 0 480 260", role: "img",
                                            "aria-label": c.title + " by step" })) svg.setAttribute(k, v);
      fig.appendChild(svg);
      tfChart.draw(svg, c.series.map((s) => ({ name: s.run, points: s.points })), { legend: false });
      return fig;
    }));
    table("config-differences", ["key", ...labels],
          Object.entries(doc.config_differences).map(([k, values]) => row(k, values.map(raw))));
    table("test-metrics", ["metric", ...labels],
          Object.entries(doc.test_metrics).map(([k, values]) => row(k, values.map(num))));
  }

  async function load() {
    try {
      const doc = await tf.getJSON("/api/compare?" + query);
      document.title = "compare " + doc.ids.map((i) => "job " + i).join(", ") + " · trainforge";
      draw(doc);
      status.textContent = "";
    } catch (e) {
      status.className = "status error";
      status.textContent = e.message;
    }
  }

  document.getElementById("download").addEventListener("click", async () => {
    try {
      const r = await fetch("/api/compare.html?" + query, { headers: tf.headers({ Accept: "text/html" }),
                                                            credentials: "omit", cache: "no-store" });
      if (r.status === 401) { tf.askToken(); throw new Error("this server needs its API token"); }
      if (!r.ok) throw new Error((await tf.detail(r)) || r.statusText);
      const url = URL.createObjectURL(await r.blob());
      const a = tf.el("a", { href: url, download: "compare.html" });
      document.body.appendChild(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (e) {
      status.className = "status error";
      status.textContent = e.message;
    }
  });

  load();
})();
