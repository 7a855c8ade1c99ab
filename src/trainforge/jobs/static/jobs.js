// The jobs page: the table refreshes every 2 s from /api/jobs; the form submits JSON to POST /api/jobs; the ticked
// jobs (kept across refreshes) open /compare?ids=...
"use strict";
(function () {
  const tbody = document.querySelector("#jobs tbody");
  const form = document.getElementById("submit-form");
  const status = document.getElementById("submit-status");
  const compare = document.getElementById("compare");
  const MAX_COMPARED = 10;  // the server's limit (report.runs.MAX_COMPARED: one color each)
  const picked = new Set();

  function pickCell(job) {
    const td = tf.el("td", { class: "pick" });
    const box = tf.el("input", { type: "checkbox", "aria-label": "compare job " + job.id, "data-job-id": job.id });
    box.checked = picked.has(job.id);
    box.addEventListener("change", () => {
      if (box.checked) picked.add(job.id); else picked.delete(job.id);
      compare.disabled = picked.size < 2 || picked.size > MAX_COMPARED;
    });
    td.appendChild(box);
    return td;
  }

  function row(job) {
    const tr = tf.el("tr", { "data-job-id": job.id, "data-state": job.state });
    tr.appendChild(pickCell(job));
    const idCell = tf.el("td");
    idCell.appendChild(tf.el("a", { href: "/jobs/" + job.id }, job.id));
    tr.appendChild(idCell);
    tr.appendChild(tf.el("td", {}, job.name));
    tr.appendChild(tf.el("td", { class: "state state-" + job.state, title: job.reason || "" }, job.state));
    tr.appendChild(tf.el("td", {}, job.gpus.join(",")));
    tr.appendChild(tf.progressCell(job.progress));
    tr.appendChild(tf.el("td", {}, job.state === "running" ? tf.duration(job.progress.eta_s) : ""));
    tr.appendChild(tf.el("td", {}, job.restarts + "/" + job.max_restarts));
    tr.appendChild(tf.el("td", {}, job.priority));
    tr.appendChild(tf.el("td", {}, tf.mib(job.memory_bytes)));
    tr.appendChild(tf.el("td", {}, new Date(job.submitted_at * 1000).toLocaleTimeString()));
    const actions = tf.el("td");
    if (!tf.final(job.state) && !job.cancel_requested) {
      const b = tf.el("button", { type: "button", class: "cancel" }, "cancel");
      b.addEventListener("click", () => tf.postJSON("/api/jobs/" + job.id + "/cancel").then(refresh));
      actions.appendChild(b);
    }
    tr.appendChild(actions);
    return tr;
  }

  async function refresh() {
    try {
      const jobs = await tf.getJSON("/api/jobs");
      tbody.replaceChildren(...jobs.slice().reverse().map(row));
    } catch (e) { /* the server restarting: try again on the next tick */ }
  }

  compare.addEventListener("click", () => {
    location.href = "/compare?" + [...picked].sort((a, b) => a - b).map((id) => "ids=" + id).join("&");
  });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const overrides = document.getElementById("overrides").value
      .split("\n").map((s) => s.trim()).filter((s) => s.length > 0);
    const body = {
      recipe: document.getElementById("recipe").value,
      overrides: overrides,
      gpus: parseInt(document.getElementById("gpus").value || "1", 10),
      priority: parseInt(document.getElementById("priority").value || "0", 10),
      max_restarts: parseInt(document.getElementById("max_restarts").value || "0", 10),
    };
    status.className = "status";
    status.textContent = "submitting (the planner sizes the job)...";
    try {
      const job = await tf.postJSON("/api/jobs", body);
      status.textContent = "queued job " + job.id + " (" + job.name + ")";
      status.setAttribute("data-job-id", job.id);
      refresh();
    } catch (e) {
      status.className = "status error";
      status.textContent = e.message;
    }
  });

  async function recipes() {
    const select = document.getElementById("recipe");
    try {
      select.replaceChildren(...(await tf.getJSON("/api/recipes")).map((r) => tf.el("option", { value: r }, r)));
    } catch (e) { /* no token yet: the login form is showing */ }
  }

  recipes();
  refresh();
  setInterval(refresh, 2000);
})();
