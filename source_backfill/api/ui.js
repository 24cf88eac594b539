// The status page (GET /ui): polls GET jobs about once a second and shows each job: a progress bar,
// sparklines of rows/s and live latency over the last minutes, its splits (folded when there are many),
// and the controls that apply to it (pause / resume / throttle while history is left, retry when failed,
// drop). Job names, errors and transforms are user data: every text is set with textContent, never as
// HTML. The token lives in sessionStorage only (never in a URL); its box shows only when the daemon has one.
// With jobs of more than one namespace, a filter shows one namespace's jobs (or all), kept in the URL
// query (?namespace=NS) so that a view can be linked, and each job says its namespace.
"use strict";
(() => {
  const TOKEN_KEY = "source-backfill-token";
  const POLL_MS = 1000;
  const RATE_WINDOW_MS = 10000; // rows/s over the polls of the last 10 s (progress moves once an epoch)
  const SPLIT_COLUMNS = ["split", "stage", "progress", "backfilled", "target", "rows", "lag"];
  const SPARK_MS = 5 * 60 * 1000; // the sparklines' span: the last 5 minutes of polls
  const FOLD_SPLITS = 8; // more splits than this: the splits table starts folded
  const SVG = "http://www.w3.org/2000/svg";
  const tokenRequired = document.body.dataset.tokenRequired === "true";
  const $ = (id) => document.getElementById(id);
  const views = new Map(); // job name -> its section's parts
  const samples = new Map(); // job name -> [[ms, rows], ...]
  const history = new Map(); // job name -> [[ms, rows/s, p99 s or null], ...] (the sparklines)
  let timer = 0;
  let polling = false;
  let again = false; // a poll was asked for while one was under way
  let shownNamespace = new URLSearchParams(window.location.search).get("namespace") || ""; // "": all
  let lastJobs = []; // the last poll's jobs, drawn again when the filter changes
  let namespaceOptions = ""; // the filter's options as last built (rebuilt only when they change)

  const token = () => sessionStorage.getItem(TOKEN_KEY) || "";
  const num = (n) => (n === null || n === undefined ? "—" : n.toLocaleString());

  function el(tag, props, ...children) {
    const node = Object.assign(document.createElement(tag), props || {});
    node.append(...children); // strings become text nodes
    return node;
  }

  function duration(s) {
    if (s === null || s === undefined) return "—";
    s = Math.round(s);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  }

  // A request to the API; throws an Error carrying the HTTP status and the API's error message.
  async function call(method, path, body) {
    const headers = {};
    if (token()) headers.Authorization = `Bearer ${token()}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, cache: "no-store", body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const message = (data && data.error && data.error.message) || response.statusText;
      throw Object.assign(new Error(`${response.status} ${message}`), { status: response.status });
    }
    return data;
  }

  async function act(name, label, method, suffix, body) {
    $("message").textContent = "";
    try {
      update(await call(method, `jobs/${encodeURIComponent(name)}${suffix}`, body));
    } catch (e) {
      const hint = e.status === 401 ? " (enter the token)" : "";
      $("message").textContent = `${label} "${name}" failed: ${e.message}${hint}`;
    }
  }

  function throttle(name, input) {
    const text = input.value.trim();
    const rate = text === "" ? null : Number(text);
    if (rate !== null && !(Number.isFinite(rate) && rate >= 0)) {
      $("message").textContent = `Throttle "${name}": rows/s must be a number >= 0, or empty for unlimited`;
      return;
    }
    act(name, "Throttle", "PATCH", "", { rate_limit: rate });
  }

  const button = (className, label, onclick) => el("button", { type: "button", className, onclick }, label);

  // The section of a job, made once and updated in place (so inputs and buttons survive the polls).
  function section(name) {
    const p = {
      name: el("h2", { className: "name" }, name),
      namespace: el("span", { className: "namespace", title: "namespace" }),
      status: el("span", { className: "status" }),
      pause: button("pause", "Pause", () => act(name, "Pause", "POST", "/pause")),
      resume: button("resume", "Resume", () => act(name, "Resume", "POST", "/resume")),
      rate: el("input", { className: "rate", size: 22, placeholder: "rows/s (empty: unlimited)" }),
      throttle: button("throttle", "Throttle", () => throttle(name, p.rate)),
      retry: button("retry", "Retry", () => act(name, "Retry", "POST", "/retry")),
      drop: button("drop", "Drop", () => {
        if (window.confirm(`Drop job "${name}"? It is detached at the next epoch; its table is kept.`)) {
          act(name, "Drop", "DELETE", "");
        }
      }),
      fill: el("div", { className: "fill" }),
      pct: el("span", { className: "pct" }),
      rateLine: sparkline("rates", "rows/s"),
      latencyLine: sparkline("latencies", "live latency p99 (s)"),
      facts: el("p", { className: "facts" }),
      error: el("p", { className: "error" }),
      splits: el("tbody"),
    };
    p.buttons = [p.pause, p.resume, p.throttle, p.retry, p.drop];
    const head = el("tr", {}, ...SPLIT_COLUMNS.map((h) => el("th", {}, h)));
    p.summary = el("summary", {});
    p.table = el("details", { className: "splits" }, p.summary, el("table", {}, el("thead", {}, head), p.splits));
    p.folded = null; // set once from the split count; the user's own folding is kept after
    const controls = el("div", { className: "controls" }, p.pause, p.resume, p.rate, p.throttle, p.retry, p.drop);
    p.bar = el("div", { className: "jobbar", title: "history copied (reads ahead included)" }, p.fill);
    const progress = el("div", { className: "progress" }, p.bar, p.pct);
    const lines = el("div", { className: "sparks" }, p.rateLine.box, p.latencyLine.box);
    p.section = el("section", { className: "job" }, p.name, p.namespace, p.status, controls, progress, lines, p.facts,
                   p.error, p.table);
    p.section.dataset.job = name;
    return p;
  }

  // A small line chart: an SVG polyline over the last SPARK_MS, its newest value beside it.
  function sparkline(className, label) {
    const line = document.createElementNS(SVG, "polyline");
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 120 24");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("class", "spark");
    svg.append(line);
    const value = el("span", { className: "value" });
    return { line, value, box: el("span", { className: `sparkbox ${className}`, title: label }, label + " ", svg, value) };
  }

  function draw(spark, points, format) {
    const values = points.filter(([, v]) => v !== null);
    spark.value.textContent = values.length ? format(values[values.length - 1][1]) : "—";
    if (values.length < 2) { spark.line.setAttribute("points", ""); return; }
    const now = Date.now();
    const span = Math.max(10000, now - values[0][0]); // the polls kept (at most SPARK_MS), 10 s at least
    const top = Math.max(...values.map(([, v]) => v)) || 1;
    spark.line.setAttribute("points", values.map(([t, v]) =>
      `${(120 * (1 - (now - t) / span)).toFixed(1)},${(23 - (22 * v) / top).toFixed(1)}`).join(" "));
  }

  function remember(name, rate, lat) {
    const now = Date.now();
    const list = history.get(name) || [];
    list.push([now, rate, lat && lat.p99_s !== null ? lat.p99_s : null]);
    while (list.length && now - list[0][0] > SPARK_MS) list.shift();
    history.set(name, list);
    return list;
  }

  function rowsPerSecond(name, rows) {
    const now = Date.now();
    let list = samples.get(name) || [];
    if (list.length && rows < list[list.length - 1][1]) list = []; // rebuilt (retry): start over
    list.push([now, rows]);
    while (list.length > 2 && now - list[0][0] > RATE_WINDOW_MS) list.shift();
    samples.set(name, list);
    const [t0, r0] = list[0];
    return now - t0 >= 500 ? ((rows - r0) * 1000) / (now - t0) : null;
  }

  const namespaceOf = (job) => job.namespace || "default";

  function update(job) {
    let p = views.get(job.name);
    if (!p) {
      p = section(job.name);
      views.set(job.name, p);
      $("jobs").append(p.section);
    }
    p.namespace.textContent = namespaceOf(job);
    p.section.dataset.namespace = namespaceOf(job);
    const failed = job.status === "failed";
    p.status.textContent = job.status + (job.paused ? " (paused)" : "") + (job.dropped ? " (dropping)" : "");
    p.status.classList.toggle("failed", failed);
    p.section.dataset.status = job.status;
    p.section.dataset.paused = String(job.paused);
    // history left to copy: pause and throttle apply (a Finished job has none: its live rows never wait)
    const copying = !failed && job.status !== "finished";
    p.pause.hidden = job.paused || !copying;
    p.resume.hidden = !job.paused;
    p.rate.hidden = p.throttle.hidden = !copying;
    p.retry.hidden = !failed;
    p.drop.hidden = job.dropped;
    const locked = tokenRequired && !token();
    for (const b of p.buttons) {
      b.disabled = locked;
      b.title = locked ? "enter the API token to control jobs" : "";
    }
    const stages = {};
    for (const s of job.splits) stages[s.stage] = (stages[s.stage] || 0) + 1;
    const rate = rowsPerSecond(job.name, job.rows_history + job.rows_live);
    const frac = job.progress === null || job.progress === undefined ? null : Math.max(0, Math.min(1, job.progress));
    p.fill.style.width = `${frac === null ? 0 : frac * 100}%`;
    p.bar.dataset.progress = frac === null ? "" : String(frac);
    p.pct.textContent = frac === null ? "—" : `${(Math.floor(frac * 1000) / 10).toFixed(1)}%`;
    const seen = remember(job.name, rate, job.live_latency);
    draw(p.rateLine, seen.map(([t, r]) => [t, r]), (v) => `${num(Math.round(v))}/s`);
    draw(p.latencyLine, seen.map(([t, , l]) => [t, l]), (v) => `${v.toFixed(2)} s`);
    p.latencyLine.box.hidden = Boolean(job.table); // table jobs have no live latency figure
    const t = job.table; // a job on a delta source: its strategy's phase, vnodes copied, versions behind
    const facts = [
      t ? ["tablecopy", `${t.strategy}: ${t.phase}, ` +
                        (t.rows_total === null || t.rows_total === undefined ? ""
                          : `rows ${num(t.rows_copied)}/${num(t.rows_total)}, `) +
                        (t.files_copied === null || t.files_copied === undefined
                          ? `vnodes ${t.vnodes_completed}/${t.vnodes_total}, `
                          : `files ${t.files_copied}/${t.files_total ?? "?"} (Spark), `) +
                        `lag ${num(t.lag_versions)} versions`]
        : ["splits", `splits ${job.splits_finished}/${job.splits_total} finished` +
          (job.splits.length ? ` (${Object.entries(stages).map(([k, v]) => `${k} ${v}`).join(", ")})` : "")],
      ["rows", `${num(job.rows_history)} history` +
               (job.rows_read_ahead ? ` (+${num(job.rows_read_ahead)} read ahead)` : "") +
               ` / ${num(job.rows_live)} live`],
      ["speed", rate === null ? "— rows/s" : `${num(Math.round(rate))} rows/s`],
      ["eta", (job.progress === null || job.progress === undefined ? "" :
               `${(Math.floor(job.progress * 1000) / 10).toFixed(1)}% · `) +
              (job.history_paused ? "paused" : `ETA ${duration(job.eta_seconds)}`) +
              (job.status === "backfilling" && job.history_rows_per_s != null
                ? ` at ${num(Math.round(job.history_rows_per_s))} history rows/s` : "")],
      ["limit", `limit ${job.rate_limit === null ? "unlimited" : num(job.rate_limit) + " rows/s"}`],
      ["epoch", `epoch ${num(job.epoch)}`],
    ];
    const lat = job.live_latency; // record timestamp -> commit, live rows of the last window_s
    if (lat && lat.p50_s !== null && lat.p99_s !== null) {
      facts.push(["latency", `latency p50 ${lat.p50_s.toFixed(2)} s / p99 ${lat.p99_s.toFixed(2)} s ` +
                             `(last ${lat.window_s} s)`]);
    }
    const tiers = job.history_tiers; // a job reading its source's archive: offsets per tier, as the CLI
    if (tiers) {
      const held = ["archive", "kafka", "gap", "loss"].filter((k) => tiers[k])
        .map((k) => `${k} ${num(tiers[k])}`);
      facts.push(["tiers", `history from ${held.length ? held.join(", ") : "nothing yet"}` +
                           (job.history_broker_bytes == null ? ""
                             : `; ${num(job.history_broker_bytes)} bytes from the broker`)]);
    }
    if (job.pending_mutations) facts.push(["pending", `${job.pending_mutations} change(s) pending`]);
    if (job.transform) facts.push(["transform", `transform: ${job.transform}`]);
    p.facts.replaceChildren(...facts.flatMap(([k, v], i) => [i ? " · " : "", el("span", { className: k }, v)]));
    p.error.textContent = job.error || (job.last_error ? `retrying after: ${job.last_error}` : "");
    p.table.hidden = job.splits.length === 0;
    if (p.folded === null && job.splits.length) {
      p.folded = job.splits.length > FOLD_SPLITS;
      p.table.open = !p.folded;
    }
    p.summary.textContent = `${job.splits.length} split${job.splits.length === 1 ? "" : "s"}`;
    p.splits.replaceChildren(...job.splits.map((s) => {
      const bar = el("progress", { max: 1 });
      if (s.progress !== null) bar.value = s.progress; // no value: indeterminate (target unknown)
      const pct = s.progress === null ? "" : ` ${Math.floor(s.progress * 100)}%`;
      // committed, and what reads ahead copied and no epoch committed yet (the bar counts both, as the CLI)
      const ahead = s.read_ahead_offset !== null && s.read_ahead_offset !== undefined;
      const cells = [num(s.backfilled_offset) + (ahead ? ` (read ahead to ${num(s.read_ahead_offset)})` : ""),
                     num(s.target_offset),
                     num(s.rows) + (s.rows_read_ahead ? ` (+${num(s.rows_read_ahead)} read ahead)` : ""),
                     num(s.lag)];
      return el("tr", { className: "split" }, el("td", {}, s.split), el("td", {}, s.stage),
        el("td", {}, bar, pct), ...cells.map((c) => el("td", { className: "num" }, c)));
    }));
  }

  // The namespace filter: "all" and each namespace of the jobs (and the one chosen, even with no job yet).
  function namespaceFilter(jobs) {
    const present = [...new Set(jobs.map(namespaceOf))].sort();
    const listed = shownNamespace && !present.includes(shownNamespace)
      ? [...present, shownNamespace].sort() : present;
    const key = JSON.stringify(listed);
    if (key !== namespaceOptions) { // rebuilt only when the namespaces change: an open list stays open
      namespaceOptions = key;
      $("namespace").replaceChildren(el("option", { value: "" }, "all"),
                                     ...listed.map((ns) => el("option", { value: ns }, ns)));
    }
    $("namespace").value = shownNamespace;
    $("namespace-filter").hidden = listed.length < 2 && !shownNamespace;
    return present.length > 1;
  }

  // Jobs of the namespaces not shown keep their sections (and their sparklines' polls), hidden.
  function render(jobs) {
    lastJobs = jobs;
    const names = new Set(jobs.map((j) => j.name));
    for (const [name, p] of views) {
      if (!names.has(name)) {
        p.section.remove(); views.delete(name); samples.delete(name); history.delete(name);
      }
    }
    jobs.forEach(update);
    const several = namespaceFilter(jobs);
    let shown = 0;
    for (const job of jobs) {
      const p = views.get(job.name);
      const visible = !shownNamespace || namespaceOf(job) === shownNamespace;
      p.section.hidden = !visible;
      p.namespace.hidden = !several; // one namespace: no tag to tell jobs apart
      shown += visible ? 1 : 0;
    }
    $("empty").textContent = shownNamespace && jobs.length
      ? `No jobs in namespace "${shownNamespace}".` : "No jobs.";
    $("empty").hidden = shown > 0;
  }

  function showNamespace(ns) {
    shownNamespace = ns;
    const url = new URL(window.location.href);
    if (ns) url.searchParams.set("namespace", ns);
    else url.searchParams.delete("namespace");
    window.history.replaceState(null, "", url); // linkable; never the token (sessionStorage only)
    render(lastJobs);
  }

  async function poll() {
    clearTimeout(timer);
    if (polling) { again = true; return; } // the poll under way schedules the next
    polling = true;
    try {
      render(await call("GET", "jobs"));
      $("poll").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (e) {
      if (e.status === 401) {
        render([]);
        $("empty").hidden = true;
        $("poll").textContent = token()
          ? "The token was refused: enter the right token."
          : "Reading jobs needs the API token: enter the token.";
      } else {
        $("poll").textContent = `Cannot read jobs: ${e.message}`;
      }
    } finally {
      polling = false;
      timer = setTimeout(poll, again ? 0 : POLL_MS);
      again = false;
    }
  }

  function useToken(value) {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    $("token").placeholder = value ? "(token in use)" : "";
    $("message").textContent = "";
    poll();
  }

  $("auth").hidden = !tokenRequired; // a daemon without a token asks for none
  $("use-token").onclick = () => useToken($("token").value);
  $("forget-token").onclick = () => useToken("");
  $("token").onkeydown = (e) => { if (e.key === "Enter") useToken($("token").value); };
  $("token").placeholder = token() ? "(token in use)" : "";
  $("namespace").onchange = () => showNamespace($("namespace").value);
  poll();
})();
