// batchfleet console: polls api/overview and renders it. Plain DOM, no build step.
"use strict";
(function () {
  const refreshMs = Math.max(1000, Number(document.body.dataset.refreshMs) || 2000);
  let csrf = "";
  const sparks = {};  // "model:figure" -> uPlot

  const $ = (sel) => document.querySelector(sel);
  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else if (k === "onclick") node.addEventListener("click", v);
      else node[k] = v;
    }
    for (const kid of kids) node.append(kid instanceof Node ? kid : String(kid ?? ""));
    return node;
  }
  const num = (v, d = 0) => (v === null || v === undefined) ? "–" :
    Number(v).toLocaleString(undefined, {minimumFractionDigits: d, maximumFractionDigits: d});
  const pct = (v) => (v === null || v === undefined) ? "–" : (100 * v).toFixed(1) + "%";
  function age(s) {
    if (s === null || s === undefined) return "–";
    if (s < 120) return s.toFixed(1) + "s";
    return s < 7200 ? (s / 60).toFixed(0) + "m" : (s / 3600).toFixed(1) + "h";
  }
  const when = (t) => t ? new Date(typeof t === "number" ? t * 1000 : t).toLocaleTimeString() : "–";
  function td(text, cls, attrs) { return el("td", {class: cls || "", ...(attrs || {})}, text); }
  function breakers(states) {
    const bad = [];
    for (const [name, counts] of Object.entries(states || {}))
      for (const [state, n] of Object.entries(typeof counts === "object" ? counts : {[counts]: 1}))
        if (state !== "closed") bad.push(`${name} ${state}${typeof counts === "object" ? " " + n : ""}`);
    return bad.length ? td(bad.join(", "), "bad text") : td("closed", "good text");
  }
  function fill(tbody, rows) { tbody.replaceChildren(...rows); }

  async function api(path, options) {
    const r = await fetch(path, {credentials: "same-origin", ...(options || {})});
    const body = r.status === 204 ? {} : await r.json().catch(() => ({}));
    if (!r.ok) { const e = new Error((body.error && body.error.message) || r.statusText); e.status = r.status; throw e; }
    return body;
  }
  async function act(action, payload, question) {
    if (!window.confirm(question)) return;
    try {
      const done = await api("api/actions/" + action, {method: "POST",
        headers: {"Content-Type": "application/json", "X-CSRF-Token": csrf},
        body: JSON.stringify(payload)});
      window.alert(`${done.action} ${done.target}: ${done.outcome}`);
    } catch (e) { window.alert(`${action} refused: ${e.message}`); }
    poll(true);
  }

  function spark(key, parent, t, values, color) {
    let chart = sparks[key];
    const data = [t, values.map((v) => v === null ? null : Number(v))];
    if (!chart || !parent.contains(chart.root)) {
      chart = sparks[key] = new uPlot({width: 90, height: 24, class: "spark",
        cursor: {show: false}, legend: {show: false}, select: {show: false},
        scales: {x: {time: true}}, axes: [{show: false}, {show: false}],
        series: [{}, {stroke: color, width: 1.2, fill: color + "22", spanGaps: true, points: {show: false}}]},
        data, parent);
    } else chart.setData(data);
  }

  function latency(l) {
    // end to end p50 / p95 / p99, then queue wait and compute (p50 / p99) apart
    const ms = (a, b, c) => [a, b, c].filter((v) => v !== undefined).map((v) => num(v, 1)).join(" / ");
    return el("td", {class: "latency", title: `queue wait p50/p99 ${ms(l.queue_p50_ms, l.queue_p99_ms)} ms · ` +
      `compute p50/p99 ${ms(l.compute_p50_ms, l.compute_p99_ms)} ms`},
      ms(l.p50_ms, l.p95_ms, l.p99_ms), el("br"),
      el("span", {class: "muted"}, `queue ${ms(l.queue_p99_ms)} · compute ${ms(l.compute_p99_ms)}`));
  }

  function renderModels(o) {
    const h = o.history || {t: [], models: {}};
    const rows = o.models.map((m) => {
      const cell = el("td", {class: "text sparks"});
      const tr = el("tr", {"data-model": m.model},
        td(m.model, "text name"), td(num(m.depth), m.depth ? "warn depth" : "depth"),
        td(num(m.lag), "lag"), td(age(m.oldest_age_s), "oldest"),
        td(num(m.rps, 1), "rps"), td(num(m.mean_batch_size, 1), "batch"),
        td(pct(m.batch_fill), "fill"), latency(m.latency_ms || {}), td(pct(m.error_rate), m.error_rate ? "bad errors" : "errors"),
        td(pct(m.degraded_rate), m.degraded_rate ? "warn degraded" : "degraded"),
        td(pct(m.cache_hit_ratio), "cache"), breakers(m.breakers),
        td(num(m.dlq), m.dlq ? "bad dlq" : "dlq"), td(num(m.workers), m.workers ? "workers" : "bad workers"),
        cell, el("td", {class: "text"}, m.paused
          ? el("button", {class: "resume", title: `paused by ${m.paused.who} at ${when(m.paused.at)}`,
              onclick: () => act("resume", {model: m.model}, `Resume ${m.model}'s lanes?`)}, "Resume")
          : el("button", {class: "pause", onclick: () => act("pause", {model: m.model,
              why: window.prompt(`Pause ${m.model}'s lanes: why?`) || ""}, `Pause ${m.model}'s lanes?`)}, "Pause")));
      if (m.paused) tr.classList.add("paused");
      tr._spark = cell;
      if (m.paused) tr.querySelector(".name").append(el("span", {class: "warn"}, " paused"));
      return tr;
    });
    fill($("#models tbody"), rows);
    for (const tr of rows) {
      const model = tr.dataset.model, series = h.models[model];
      if (!series || h.t.length < 2 || typeof uPlot === "undefined") continue;
      spark(model + ":rps", tr._spark, h.t, series.rps, "#3558d6");
      spark(model + ":depth", tr._spark, h.t, series.depth, "#b26a00");
      spark(model + ":p99", tr._spark, h.t, series.p99_ms, "#6a1b9a");
    }
  }

  function renderWorkers(o) {
    fill($("#workers tbody"), o.workers.map((w) => el("tr",
      {"data-worker": w.worker_id, class: w.stale ? "stale" : ""},
      td(w.worker_id, "text"), td(w.host, "text"), td(w.device, "text"),
      td(w.models.join(", ") + (w.loaded ? " (loaded: " + (w.loaded.join(", ") || "none") + ")" : ""),
        "text"), td(age(w.up_s)),
      td(age(w.seen_s_ago) + (w.stale ? " stale" : ""), w.stale ? "bad" : ""),
      breakers(w.breakers), td(num(w.rps, 1)),
      td(num(w.counters.succeeded)), td(num(w.counters.failed), w.counters.failed ? "bad" : ""))));
  }

  function renderRollouts(o) {
    const box = $("#rollouts");
    if (!o.rollouts.length) { box.replaceChildren(el("p", {class: "muted"}, "no rollouts")); return; }
    box.replaceChildren(...o.rollouts.map((r) => {
      const p = r.policy || {};
      const split = p.canary ? `${p.stable} ${100 - p.percent}% · ${p.canary} ${p.percent}%` : `${p.stable} 100%`;
      const versions = Object.entries(r.versions || {}).map(([label, v]) => {
        const roles = (v.stats || {}).roles || {};
        const s = roles[v.role] || Object.values(roles)[0] || {};
        return el("tr", {}, td(label, "text"), td(v.role || "–", "text"), td((v.workers || []).length),
          td(num(s.requests)), td(pct(s.error_rate)), td(num(s.p99_compute_ms, 1)));
      });
      const decisions = (r.decisions || []).map((d) => el("li", {class: "decision"},
        `${when(d.at)} · ${d.action} by ${d.who}: `, el("span", {class: "reason"}, d.why || "(no reason given)")));
      return el("div", {class: "card rollout", "data-model": r.model},
        el("h3", {}, r.model, " ", el("span", {class: "muted"}, `epoch ${p.epoch} · ${split}` +
          (p.shadow ? ` · shadow ${p.shadow}` : "") + (r.converged ? "" : " · converging"))),
        el("p", {class: "muted"}, "guard: " + JSON.stringify(r.guard || {})),
        el("table", {}, el("thead", {}, el("tr", {}, ...["version", "role", "workers", "requests", "errors", "compute p99 ms"].map((c) => el("th", {}, c)))),
          el("tbody", {}, ...versions)),
        el("ul", {class: "decisions"}, ...decisions),
        p.canary || p.previous ? el("button", {onclick: () => act("rollback", {model: r.model},
          `Roll back ${r.model}?`)}, "Roll back") : "");
    }));
  }

  function renderOutputs(o) {
    const found = Object.entries((o.outputs || {}).models || {});
    if (!found.length) {
      $("#outputs").replaceChildren(el("p", {class: "muted"}, "no output statistics")); return;
    }
    const head = ["version", "role", "reference", "count", "nan rate", "mean", "p50", "p99", "psi", "ks"];
    const fig = (v) => v === null || v === undefined ? "–" : Number(v).toPrecision(4);
    $("#outputs").replaceChildren(...found.map(([model, rows]) => el("div", {class: "card", "data-outputs-model": model},
      el("h3", {}, model, " ", el("span", {class: "muted"}, `last ${o.outputs.since_s / 60} min`)),
      el("table", {}, el("thead", {}, el("tr", {}, ...head.map((c) => el("th", {}, c)))),
        el("tbody", {}, ...rows.map((r) => el("tr", {"data-version": r.version},
          td(r.version, "text"), td(r.role, "text"), td(r.reference || "–", "text"), td(num(r.count)),
          td(fig(r.nan_rate)), td(fig(r.mean)), td(fig(r.p50)), td(fig(r.p99)),
          td(fig(r.psi)), td(fig(r.ks)))))))));
  }

  function renderDlq(o) {
    const box = $("#dlq");
    if (!o.dlq.length) { box.replaceChildren(el("p", {class: "good"}, "empty")); return; }
    box.replaceChildren(...o.dlq.map((q) => {
      const size = (o.models.find((m) => m.model === q.model) || {}).dlq;
      const types = Object.entries(q.error_types).map(([t, n]) => `${t} ${n}`).join(", ");
      return el("div", {class: "card", "data-dlq-model": q.model},
        el("h3", {}, `${q.model}: ${num(size)} letter(s)`, " ",
          el("span", {class: "muted"}, `newest ${q.letters.length}: ${types}`)),
        el("table", {}, el("tbody", {}, ...q.letters.map((l) => el("tr", {"data-request-id": l.request_id},
          td(l.request_id, "text"), td(l.error_type, "text bad"), td(l.attempts), td(when(l.dead_at)),
          el("td", {class: "text"}, el("details", {}, el("summary", {}, l.reason),
            el("pre", {}, l.errors.map((e) => `${e.at || ""} ${e.type}: ${e.message}`).join("\n")))),
          el("td", {}, el("button", {onclick: () => act("replay", {model: l.model, request_id: l.request_id},
            `Replay ${l.request_id}?`)}, "Replay")))))));
    }));
  }

  function renderBulk(o) {
    fill($("#bulk tbody"), o.bulk.map((j) => {
      const share = j.total ? Math.min(1, j.rows_done / j.total) : 0;
      return el("tr", {"data-job": j.job_id}, td(j.job_id, "text"), td(j.model, "text"),
        td(j.status, "text"), el("td", {class: "text"}, el("span", {class: "bar"},
          el("div", {style: `width:${(100 * share).toFixed(1)}%`})),
          `${num(j.rows_done)}${j.total ? " / " + num(j.total) : ""}`),
        td(num(j.rows_per_s, 1)), td(num(j.failed), j.failed ? "bad" : ""));
    }));
  }

  function renderActions(o) {
    fill($("#actions tbody"), (o.actions || []).map((a) => el("tr", {},
      td(when(a.at), "text"), td(a.who, "text"), td(a.action, "text"), td(a.target, "text"),
      td(a.outcome, "text"))));
  }

  function render(o) {
    const t = o.totals, stale = o.workers.filter((w) => w.stale).length;
    const open = o.models.filter((m) => Object.values(m.breakers || {}).some((c) => c.open)).length;
    $("#where").textContent = `${o.namespace} on ${o.broker}`;
    $("#summary").textContent = `${t.workers} worker(s)${stale ? ` (${stale} stale)` : ""} · ` +
      `${num(t.throughput_rps, 1)} req/s · depth ${num(t.depth)} · dlq ${num(t.dlq)}` +
      (open ? ` · ${open} model(s) with an open breaker` : "") + ` · ${when(o.taken_at)}`;
    renderModels(o); renderWorkers(o); renderRollouts(o); renderOutputs(o); renderDlq(o);
    renderBulk(o); renderActions(o);
    document.body.dataset.takenAt = String(o.taken_at);
    document.body.dataset.ready = "1";
  }

  let timer = null;
  async function poll(once) {
    try { render(await api("api/overview")); }
    catch (e) {
      if (e.status === 401) { showLogin(e.message); return; }
      $("#summary").textContent = "cannot read the fleet: " + e.message;
    }
    if (!once) timer = setTimeout(poll, refreshMs);
  }
  function start(session) {
    csrf = session.csrf;
    $("#who").textContent = session.open ? "open on loopback" : "signed in as " + session.who;
    $("#login").hidden = true; $("#console").hidden = false;
    if (timer === null) poll(false);
  }
  function showLogin(message) {
    $("#console").hidden = true; $("#login").hidden = false;
    $("#login-error").textContent = message || "";
    if (timer !== null) { clearTimeout(timer); timer = null; }
  }
  $("#login").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try { start(await api("api/session", {method: "POST", headers: {"Content-Type": "application/json"},
      body: JSON.stringify({key: $("#key").value})})); }
    catch (e) { $("#login-error").textContent = e.message; }
  });
  $("#cancel-go").addEventListener("click", () => {
    const id = $("#cancel-id").value.trim();
    if (id) act("cancel", {request_id: id}, `Cancel ${id}?`);
  });
  (async () => {
    try {
      const s = await api("api/session");
      start(s.open && !s.csrf_bound ? await api("api/session", {method: "POST",
        headers: {"Content-Type": "application/json"}, body: "{}"}) : s);
    } catch (e) { showLogin(e.status === 401 ? "" : e.message); }
  })();
})();
