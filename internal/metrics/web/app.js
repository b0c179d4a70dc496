// rlhub dashboard: polls /api/state every second and redraws the panels.
// No build step, no libraries. The markup mirrors index.html.
"use strict";
const W = 600, H = 160, L = 56; // viewBox; L: the y labels' margin
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (v) => (v === undefined || v === null ? "–" : v.toFixed(1));
function bytes(n) {
  for (const [u, s] of [[1 << 30, "GiB"], [1 << 20, "MiB"], [1 << 10, "KiB"]]) if (n >= u) return (n / u).toFixed(1) + " " + s;
  return n + " B";
}
function rows(list, cols, render) {
  return list.length ? list.map(render).join("") : `<tr><td colspan="${cols}" class="none">none</td></tr>`;
}
// plot maps (x, y) points onto the W×H box, like polyline() in dashboard.go.
function plot(pts) {
  if (!pts.length) return "";
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const xy = pts.map((p) => [L + (p[0] - x0) / (x1 - x0) * (W - L - 4), H - 14 - (p[1] - y0) / (y1 - y0) * (H - 22)]);
  return `<polyline points="${xy.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ")}"/>` +
    xy.map((p) => `<circle cx="${p[0].toFixed(1)}" cy="${p[1].toFixed(1)}" r="2.5"/>`).join("") +
    `<text x="${L - 4}" y="12" font-size="11" fill="#667" text-anchor="end">${y1.toFixed(1)}</text>` +
    `<text x="${L - 4}" y="${H - 12}" font-size="11" fill="#667" text-anchor="end">${y0.toFixed(1)}</text>` +
    `<text x="${L}" y="${H - 2}" font-size="10" fill="#667">${x0}</text><text x="${W - 4}" y="${H - 2}" font-size="10" fill="#667" text-anchor="end">${x1} training episodes</text>`;
}
function draw(s) {
  document.getElementById("updated").textContent = s.time.slice(11, 19) + " UTC";
  // A row with sum set is the "other" row: the rest past the cap, summed.
  document.querySelector("#models tbody").innerHTML = rows(s.models, 5, (m) =>
    (m.sum ? `<tr class="sum" data-others="${m.others}"><td>other (${m.others} models)</td>` : `<tr data-model="${esc(m.name)}"><td>${esc(m.name)}</td>`) +
    `<td class="version">${m.version}</td><td>${bytes(m.bytes)}</td><td>${m.pushes}</td><td>${m.reads}</td></tr>`);
  const r = s.reducer, flow = document.querySelector("#reducer .flow");
  if (r) {
    const dropped = Object.entries(r.dropped).map(([k, v]) => `${esc(k)} ${v}`).join(" ") || "0";
    flow.innerHTML = `<span data-count="pushed"><b>${r.pushed}</b> pushed</span> → <span data-count="reduced"><b>${r.reduced}</b> reduced</span> → ` +
      `<span data-count="applied"><b>${r.applied}</b> applied</span> · <span data-count="dropped"><b>${dropped}</b> dropped</span> · ` +
      `<span data-count="lost"><b>${r.lost}</b> lost</span> · queue <b>${r.queue}</b> · ${r.steps} steps · publish p50 ${r.p50_ms.toFixed(1)} ms, p99 ${r.p99_ms.toFixed(1)} ms`;
  }
  document.querySelector("#collectors tbody").innerHTML = rows(s.collectors, 6, (c) => c.sum ?
    `<tr class="sum${c.lag ? " behind" : ""}" data-others="${c.others}"><td>–</td><td>other (${c.others} collectors)</td><td class="version">–</td><td>–</td><td class="lag">${c.lag}</td><td></td></tr>` :
    `<tr data-collector="${esc(c.id)}" class="${c.lag ? "behind" : ""}"><td>${esc(c.model)}</td><td>${esc(c.id)}</td><td class="version">${c.version}</td>` +
    `<td>${c.newest}</td><td class="lag">${c.lag}</td><td>${esc(c.via)}${c.attached ? " (attached)" : ""}</td></tr>`);
  document.querySelector("#learners tbody").innerHTML = rows(s.learners, 5, (l) =>
    (l.sum ? `<tr class="sum" data-others="${l.others}"><td>other (${l.others} learners)</td><td>–</td><td></td>` :
      `<tr data-learner="${esc(l.id)}"><td>${esc(l.id)}</td><td>${l.lease_left_ms} ms</td><td>${esc(l.task)}</td>`) +
    `<td>${l.done}</td><td>${l.failed}</td></tr>`);
  document.getElementById("runlist").innerHTML = s.runs.length ? s.runs.map((u) =>
    `<div class="run" data-run="${esc(u.id)}"><h3>${esc(u.id)} · ${esc(u.env)} <span class="state">${u.done ? "done: " + esc(u.reason) : "running"}</span></h3>` +
    `<p>iteration <b class="iteration">${u.iteration}</b> · version ${u.version} · ${u.episodes} episodes · ${u.steps_per_s.toFixed(0)} steps/s · ` +
    `eval <b class="eval">${num(u.eval)}</b> · train ${num(u.train)}</p><p class="caption">evaluation return by training episodes` +
    (u.evals > u.curve.length ? ` (${u.curve.length} of ${u.evals} evaluations drawn: each stretch's lowest and highest)` : "") + `</p>` +
    `<svg viewBox="0 0 ${W} ${H}" class="curve" data-points="${u.curve.length}">${plot(u.curve)}</svg></div>`).join("") : `<p class="none">no ARS runs</p>`;
  const w = s.worker, wl = document.getElementById("workerline");
  if (w && wl) wl.textContent = `iteration ${w.iteration} · ${w.tasks} tasks · ${w.steps} env steps · ${w.pulls} policy pulls`;
  const c = s.cluster, cb = document.getElementById("clusterbody");
  if (c && cb) cb.innerHTML = cluster(c);
  const f = s.refusals, fb = document.getElementById("refusalbody");
  if (f && fb) fb.innerHTML = refusals(f);
}
// counts renders named counts, a non-zero one marked (index.html's markup).
const counts = (list) => list.map((c) => `<span data-name="${esc(c.name)}"${c.n ? ' class="warn"' : ""}>${esc(c.name)} <b>${c.n}</b></span>`).join(" · ");
// refusals renders the Turned away panel's body.
function refusals(f) {
  let h = "";
  if (f.conns && f.conns.length) h += `<p class="conns">connections closed: ${counts(f.conns)}</p>`;
  if (f.streams_cut && f.streams_cut.length) h += `<p class="cut">gRPC streams cut at a body's deadline: ${counts(f.streams_cut)}</p>`;
  if (f.auth_calls_cut !== undefined) h += `<p class="auth">calls cut with their token <b>${f.auth_calls_cut}</b> · quota refusals: ${counts(f.quota || [])}</p>`;
  return h;
}
// cluster renders the Cluster panel's body (the markup of index.html's).
function cluster(c) {
  const standby = c.role === "standby", primary = c.role === "primary";
  let h = `<p><b class="crole" data-role="${esc(c.role)}">${c.role === "outside" ? "outside the cluster" : esc(c.role)}</b> · epoch <b class="epoch">${c.epoch}</b> · unit <b class="unit">${c.unit}</b>` +
    (standby ? ` · <span class="synced${c.synced ? "" : " warn"}">${c.synced ? "synced" : "not synced"}</span> · ${c.applied} units applied` : "") + `</p>`;
  if (c.warning) h += `<p class="warning">${esc(c.warning)}</p>`;
  if (primary) {
    h += `<p class="insync">` + (c.keeps_in_sync ? `in-sync standbys <b class="count">${c.in_sync_standbys}</b>` + (c.in_sync.length ? ": " + c.in_sync.map(esc).join(", ") : "") :
      "no in-sync record (--replica-acks not all)") + ` · ${c.connected} connected</p>` +
      `<table><thead><tr><th>standby</th><th>lag (units)</th><th>in sync</th></tr></thead><tbody>` +
      (c.standbys.length ? c.standbys.map((m) => `<tr data-standby="${esc(m.id)}" class="${m.lag ? "behind" : ""}"><td>${esc(m.id)}</td><td class="lag">${m.lag}</td><td>${m.in_sync ? "yes" : c.keeps_in_sync ? "no" : "–"}</td></tr>`).join("") :
        `<tr><td colspan="3" class="none">no standby connected</td></tr>`) + `</tbody></table>`;
  }
  return h + `<p>faults <b class="faults">${c.faults}</b> · scrubs <b class="scrubs">${c.scrubs}</b> · <span class="damaged${c.damaged_files ? " warn" : ""}">damaged files <b>${c.damaged_files}</b></span></p>`;
}
// stale marks the page's figures as no longer live (the process stopped
// answering, restarts, or answered an error); the next good poll clears it.
let lastOK = Date.now();
function stale(why) {
  const u = document.getElementById("updated");
  u.classList.add("warning");
  u.dataset.stale = "1";
  u.textContent = `not live: ${why}; figures as of ${new Date(lastOK).toISOString().slice(11, 19)} UTC`;
}
async function poll() {
  try {
    // A process that accepts but does not answer (stopped, stalled) must not
    // hold the poll forever.
    const resp = await fetch("/api/state", {cache: "no-store", signal: AbortSignal.timeout(5000)});
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    const s = await resp.json();
    lastOK = Date.now();
    const u = document.getElementById("updated");
    u.classList.remove("warning");
    delete u.dataset.stale;
    draw(s);
  } catch (e) {
    stale(e.name === "TimeoutError" ? "no answer within 5 s" : e.message || "unreachable");
  }
  setTimeout(poll, 1000);
}
poll();
