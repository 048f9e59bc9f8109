// poolserve dashboard: every few seconds, fetch dashboard/data (the session cookie goes with it),
// swap in the sections the server rendered, and redraw the memory chart with uPlot.
"use strict";
(function () {
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"];
  const updated = document.getElementById("updated");
  const refreshMs = 1000 * parseFloat(updated.dataset.refreshS || "5");
  let plot = null;
  let history = null;

  function drawChart() {
    const box = document.getElementById("memory-chart");
    if (plot) { plot.destroy(); plot = null; }
    if (!box || !history || history.t.length === 0) return;
    const names = Object.keys(history.series);
    // The pool bar's colours: a replica's place in the table (the server's order) picks its colour.
    const order = Array.from(document.querySelectorAll("[data-replica]")).map(e => e.dataset.replica);
    const colour = (n, i) => PALETTE[(order.indexOf(n) >= 0 ? order.indexOf(n) : i) % PALETTE.length];
    const data = [history.t].concat(names.map(n => history.series[n].map(v => v === null ? null : v / 1048576)));
    const series = [{}].concat(names.map((n, i) => ({label: n, stroke: colour(n, i), width: 2,
                                                       value: (u, v) => v === null ? "-" : v.toFixed(1) + " MiB"})));
    plot = new uPlot({width: Math.max(320, box.clientWidth), height: 220, series: series,
                      axes: [{}, {label: "MiB", size: 70}]}, data, box);
    box.dataset.points = String(history.t.length);
  }

  async function refresh() {
    try {
      const response = await fetch("dashboard/data", {credentials: "same-origin", cache: "no-store"});
      if (response.status === 401) { window.location.href = "dashboard/login"; return; }
      if (!response.ok) throw new Error("HTTP " + response.status);
      const body = await response.json();
      document.getElementById("sections").innerHTML = body.html;
      history = body.history;
      drawChart();
      updated.textContent = "updated " + body.taken_at;
      updated.dataset.takenAt = body.taken_at;
      updated.classList.remove("stale");
    } catch (err) {
      updated.textContent = "refresh failed (" + err.message + "); showing the last figures";
      updated.classList.add("stale");
    } finally {
      window.setTimeout(refresh, refreshMs);
    }
  }

  refresh();
})();
