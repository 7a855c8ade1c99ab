// The job page: loss and metric curves from /api/jobs/ID/metrics, the log tail from /api/jobs/ID/logs,
// polled every 2 s until the job has ended.
"use strict";
(function () {
  const root = document.getElementById("job");
  const id = root.getAttribute("data-job-id");
  const logEl = document.getElementById("log");
  let logOffset = null;
  let timer = null;

  function pts(rows, key) {
    return rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
  }

  async function refreshMetrics() {
    const m = await tf.getJSON("/api/jobs/" + id + "/metrics");
    tfChart.draw(document.getElementById("chart-loss"), [
      { name: "train loss", points: pts(m.train, "loss") },
      { name: "val loss", points: pts(m.val, "loss") },
    ]);
    const key = (m.charts || []).find((k) => m.val.some((r) => typeof r[k] === "number"));
    if (key) {
      document.getElementById("metric-caption").textContent = "validation " + key;
      const series = [{ name: "val " + key, points: pts(m.val, key) }];
      if (key === "accuracy" && m.val.some((r) => typeof r.macro_f1 === "number")) {
        series.push({ name: "val macro_f1", points: pts(m.val, "macro_f1") });
      }
      tfChart.draw(document.getElementById("chart-metric"), series);
    } else {
      tfChart.draw(document.getElementById("chart-metric"), []);
    }
    const p = m.progress;
    document.getElementById("job-progress").textContent = p.unreadable ? "unreadable: " + p.unreadable
      : p.step + (p.total_steps ? "/" + p.total_steps : "");
    const lastVal = m.val.length ? m.val[m.val.length - 1].step : null;
    if (lastVal !== null && lastVal !== shownPictureStep) await refreshPicture(lastVal);
  }

  // a detection or segmentation run's picture of its first validation images, redrawn at each evaluation: fetched
  // with the token's header (an <img src> could not send it) and shown from a blob URL
  let shownPictureStep = null;
  let pictureUrl = null;
  async function refreshPicture(step) {
    const r = await fetch("/api/jobs/" + id + "/val_images.png", { headers: tf.headers({ "Accept": "image/png" }),
                                                                   credentials: "omit", cache: "no-store" });
    if (!r.ok) return;  // 404: this task draws none, or not yet
    const url = URL.createObjectURL(await r.blob());
    document.getElementById("val-images-img").src = url;
    if (pictureUrl) URL.revokeObjectURL(pictureUrl);
    pictureUrl = url;
    shownPictureStep = step;
    document.getElementById("val-images-step").textContent = "(step " + step + ")";
    document.getElementById("val-images").hidden = false;
  }

  async function refreshJob() {
    const job = await tf.getJSON("/api/jobs/" + id);
    document.title = "job " + job.id + " · " + job.name;
    document.getElementById("job-name").textContent = job.name;
    document.getElementById("job-recipe").textContent = job.recipe;
    document.getElementById("job-overrides").textContent = job.overrides.join(" ");
    document.getElementById("job-memory").textContent = tf.mib(job.memory_bytes);
    document.getElementById("job-memory-label").textContent = "memory per " + (job.memory_per || "slot");
    document.getElementById("job-priority").textContent = job.priority;
    document.getElementById("job-run-dir").textContent = job.run_dir;
    document.getElementById("config").textContent = job.config_yaml;
    const st = document.getElementById("job-state");
    st.textContent = job.state;
    st.className = "state state-" + job.state;
    document.getElementById("job-gpus").textContent = job.gpus.join(",");
    document.getElementById("job-backend").textContent =
      job.backend === "local" || !job.backend ? "this machine" : job.backend + (job.backend_id ? " job " + job.backend_id : " (not submitted yet)");
    document.getElementById("job-restarts").textContent = job.restarts + " of " + job.max_restarts;
    document.getElementById("job-reason").textContent = job.reason || "";
    document.getElementById("job-eta").textContent = job.state === "running" ? tf.duration(job.progress.eta_s) : "";
    document.getElementById("cancel").disabled = tf.final(job.state) || job.cancel_requested;
    return job;
  }

  async function refreshLog() {
    if (logOffset === null) {  // start from the tail
      const r = await tf.getJSON("/api/jobs/" + id + "/logs?offset=-20000");
      logEl.textContent = r.text;
      logOffset = r.offset;
    } else {
      const r = await tf.getJSON("/api/jobs/" + id + "/logs?offset=" + logOffset);
      if (r.text) {
        logEl.textContent = (logEl.textContent + r.text).slice(-200000);
        logEl.scrollTop = logEl.scrollHeight;
      }
      logOffset = r.offset;
    }
  }

  async function tick() {
    try {
      const job = await refreshJob();
      await refreshMetrics();
      await refreshLog();
      if (tf.final(job.state) && timer !== null) { clearInterval(timer); timer = null; }
    } catch (e) { /* the server restarting: try again on the next tick */ }
  }

  document.getElementById("cancel").addEventListener("click", () => tf.postJSON("/api/jobs/" + id + "/cancel").then(tick));
  tick();
  timer = setInterval(tick, 2000);
})();
