// keel's operator console. Plain JavaScript with no build step: it calls
// the same HTTP API as any client, with the key the operator entered, and
// builds every element with textContent, never innerHTML, because tool
// outputs and model answers are untrusted text.
"use strict";

const KEY = "keel.api_key";
const TERMINAL = new Set(["run_completed", "run_failed", "run_cancelled"]);
const LIVE_STATUS = new Set(["queued", "running", "waiting_input", "waiting_approval"]);
const STATUSES = ["queued", "running", "waiting_input", "waiting_approval", "completed", "failed", "cancelled"];

// Whatever the current page started (timers, streams) is stopped when the
// operator navigates away.
let pageAbort = new AbortController();

// ---- DOM -----------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function json(v) {
  return h("pre", {}, JSON.stringify(v, null, 2));
}

function statusBadge(status) {
  return h("span", { class: `status status-${status}`, "data-status": status }, status);
}

function short(text, n) {
  const s = String(text ?? "");
  return s.length > n ? s.slice(0, n - 1) + "…" : s;
}

function when(ts) {
  if (!ts) return "";
  const d = new Date(ts);
  return isNaN(d) ? String(ts) : d.toLocaleString();
}

function setMain(...children) {
  const main = document.getElementById("main");
  main.replaceChildren(...children);
}

function banner(message) {
  const b = document.getElementById("banner");
  if (!message) {
    b.hidden = true;
    b.textContent = "";
    return;
  }
  b.hidden = false;
  b.textContent = message;
}

// ---- API -----------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, options = {}) {
  const init = {
    method: options.method || "GET",
    headers: { ...authHeaders(), Accept: "application/json" },
    signal: options.signal,
  };
  if (options.body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(options.body);
  }
  const res = await fetch(path, init);
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!res.ok) {
    const err = body && body.error ? body.error : { code: String(res.status), message: text };
    if (res.status === 401) showKeyState(`key refused: ${err.message}`);
    throw new ApiError(res.status, err.code, err.message);
  }
  return body;
}

// A run's events over SSE. EventSource cannot send an Authorization header,
// so the stream is read with fetch and parsed here; after a dropped
// connection it resumes with Last-Event-ID, as any SSE client would.
async function followEvents(runId, onEvent, signal) {
  let last = 0;
  let ended = false;
  while (!ended && !signal.aborted) {
    try {
      const headers = { ...authHeaders(), Accept: "text/event-stream" };
      if (last > 0) headers["Last-Event-ID"] = String(last);
      const res = await fetch(`/ai/runs/${encodeURIComponent(runId)}/events`, { headers, signal });
      if (!res.ok) {
        const body = await res.json().catch(() => null);
        throw new ApiError(res.status, body?.error?.code, body?.error?.message || res.statusText);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const frame = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          const data = [];
          let id = null;
          for (const line of frame.split("\n")) {
            if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (data.length === 0) continue; // a heartbeat comment
          const event = JSON.parse(data.join("\n"));
          if (id) last = Number(id);
          onEvent(event);
          if (TERMINAL.has(event.type)) ended = true;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if (e instanceof ApiError && (e.status === 404 || e.status === 401 || e.status === 400)) throw e;
    }
    if (!ended && !signal.aborted) await sleep(1000, signal);
  }
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}

// Runs `tick` now and then every `ms` until the page changes.
function every(ms, tick) {
  const signal = pageAbort.signal;
  (async () => {
    while (!signal.aborted) {
      try {
        await tick(signal);
      } catch (e) {
        if (!signal.aborted) banner(e.message);
      }
      await sleep(ms, signal);
    }
  })();
}

// ---- key -----------------------------------------------------------------

function showKeyState(text) {
  const s = document.getElementById("key-state");
  if (text) s.textContent = text;
  else s.textContent = sessionStorage.getItem(KEY) ? "key set for this tab" : "no key";
}

function setupKeyForm() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const v = input.value.trim();
    if (v) sessionStorage.setItem(KEY, v);
    input.value = "";
    showKeyState();
    route();
  });
  document.getElementById("key-forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    showKeyState();
    route();
  });
  showKeyState();
}

// ---- pages ---------------------------------------------------------------

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/runs";
  const [path, query] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(query || "") };
}

function route() {
  pageAbort.abort();
  pageAbort = new AbortController();
  banner(null);
  const { parts, query } = parseHash();
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.nav === parts[0]);
  }
  if (parts[0] === "runs" && parts[1]) return runPage(parts[1]);
  if (parts[0] === "approvals") return approvalsPage();
  if (parts[0] === "tools") return toolsPage(query);
  if (parts[0] === "api") return apiPage();
  return runsPage(query);
}

// Runs: filtered by status, agent and session, refreshed every second.
function runsPage(query) {
  const status = h("select", { id: "filter-status", name: "status" },
    h("option", { value: "" }, "any status"),
    STATUSES.map((s) => h("option", { value: s, selected: query.get("status") === s }, s)));
  const agent = h("input", { id: "filter-agent", name: "agent", value: query.get("agent") || "", placeholder: "agent" });
  const session = h("input", { id: "filter-session", name: "session", value: query.get("session") || "", placeholder: "session" });
  const apply = () => {
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (agent.value.trim()) q.set("agent", agent.value.trim());
    if (session.value.trim()) q.set("session", session.value.trim());
    location.hash = `#/runs?${q}`;
  };
  const filters = h("form", { class: "filters", id: "run-filters", onsubmit: (e) => { e.preventDefault(); apply(); } },
    h("label", {}, "status", status),
    h("label", {}, "agent", agent),
    h("label", {}, "session", session),
    h("button", { type: "submit" }, "Filter"));
  status.addEventListener("change", apply);
  const summary = h("div", { class: "summary", id: "summary" });
  const body = h("tbody", { id: "runs-body" });
  const table = h("table", { id: "runs" },
    h("thead", {}, h("tr", {}, ["run", "status", "agent", "session", "input", "steps", "tools", "created"].map((c) => h("th", {}, c)))),
    body);
  setMain(h("h1", {}, "Runs"), summary, filters, table);

  const q = new URLSearchParams({ limit: "50" });
  for (const k of ["status", "agent", "session"]) if (query.get(k)) q.set(k, query.get(k));
  every(1000, async (signal) => {
    const page = await api(`/ai/runs?${q}`, { signal });
    body.replaceChildren(...page.runs.map((r) => h("tr", { "data-run": r.id },
      h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id)),
      h("td", {}, statusBadge(r.status)),
      h("td", {}, r.agent),
      h("td", {}, r.session),
      h("td", { title: r.input }, short(r.input, 80)),
      h("td", {}, r.steps),
      h("td", {}, r.usage?.tool_calls ?? 0),
      h("td", {}, when(r.created_at)))));
    if (page.runs.length === 0) body.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No runs.")));
    await renderSummary(summary, page.runs, signal);
    // Marks which listing is on screen, for anyone waiting on a filter.
    table.dataset.loaded = location.hash;
    banner(null);
  });
}

async function renderSummary(el, runs, signal) {
  const counts = {};
  let tools = 0, tokens = 0;
  for (const r of runs) {
    counts[r.status] = (counts[r.status] || 0) + 1;
    tools += r.usage?.tool_calls || 0;
    tokens += (r.usage?.prompt_tokens || 0) + (r.usage?.completion_tokens || 0);
  }
  const cells = [
    h("div", {}, h("b", {}, runs.length), "runs shown"),
    h("div", {}, h("b", {}, (counts.running || 0) + (counts.queued || 0)), "running"),
    h("div", {}, h("b", {}, (counts.waiting_approval || 0) + (counts.waiting_input || 0)), "waiting"),
    h("div", {}, h("b", {}, counts.failed || 0), "failed"),
    h("div", {}, h("b", {}, tools), "tool calls"),
    h("div", {}, h("b", {}, tokens), "tokens"),
  ];
  // The node's own gauge: how many runs this server is executing now.
  try {
    const res = await fetch("/metrics", { signal });
    const text = await res.text();
    const m = text.match(/^keel_active_runs(?:\{[^}]*\})? ([0-9.e+-]+)$/m);
    if (m) cells.push(h("div", {}, h("b", {}, Number(m[1])), "active on this node"));
  } catch {
    // Metrics are a nicety; the run counts above stand without them.
  }
  el.replaceChildren(...cells);
}

// What one event says, in a line or two.
function describe(e) {
  switch (e.type) {
    case "run_started": return [`agent ${e.agent}, session ${e.session}`, h("div", {}, e.input)];
    case "mode_decision": return `${e.mode} (${e.source})`;
    case "react_plan": return [
      `step ${e.step}: ${e.action}`,
      e.intent ? ` — ${e.intent}` : "",
      e.brief_rationale ? h("div", { class: "muted" }, e.brief_rationale) : null,
      (e.tool_calls || []).map((c) => h("div", {}, `${c.tool} `, json(c.arguments))),
      e.missing_slots?.length ? h("div", {}, `missing: ${e.missing_slots.join(", ")}`) : null,
    ];
    case "policy_decision": return [
      h("b", { class: e.decision === "deny" ? "bad" : "" }, e.decision),
      ` by rule `, h("code", { class: "rule" }, e.rule),
      e.call_id ? ` (${e.call_id})` : "",
      h("div", {}, e.reason),
    ];
    case "tool_call": return [h("code", {}, e.tool), ` ${e.call_id}`, json(e.arguments)];
    case "tool_result": return [
      h("code", {}, e.tool), " ",
      h("b", { class: e.ok ? "ok" : "bad" }, e.ok ? "ok" : "error"),
      ` in ${e.duration_ms} ms`,
      e.error ? h("div", { class: "bad" }, e.error) : null,
      h("pre", {}, short(e.output, 4000)),
    ];
    case "verify": return [h("b", { class: e.passed ? "ok" : "bad" }, e.passed ? "passed" : "failed"), ` ${e.rule}: ${e.detail}`];
    case "react_feedback": return `${e.code}: ${e.detail}`;
    case "clarification_needed": return [`round ${e.round}: `, e.question];
    case "handoff_requested": return [e.question, h("div", { class: "muted" }, e.reason)];
    case "waiting_client_tool": return json(e.calls);
    case "approval_required": return [h("code", {}, e.tool), ` risk ${e.risk}: ${e.reason}`, json(e.arguments)];
    case "approval_resolved": return `${e.decision} by ${e.by}${e.reason ? `: ${e.reason}` : ""}`;
    case "loop_detected": return `${e.level}: ${e.detector} on ${e.tool} ×${e.count}`;
    case "drift_detected": return `score ${e.score}: ${e.reason}`;
    case "reflection": return `${e.on_track ? "on track" : "off track"}: ${e.note}`;
    case "checkpoint": return `${e.checkpoint_id} at step ${e.step}`;
    case "context_reset": return [`reset to ${e.checkpoint_id}`, json(e.kept)];
    case "compaction": return `${e.mode}: ${e.tokens_before} → ${e.tokens_after} tokens`;
    case "steering_applied": return [e.text, e.skipped_calls?.length ? ` (skipped ${e.skipped_calls.join(", ")})` : ""];
    case "follow_up_started": return e.text;
    case "final": return h("div", { class: "answer" }, e.answer);
    case "run_completed": return `${e.reason}; ${e.usage?.llm_calls ?? 0} model calls, ${e.usage?.tool_calls ?? 0} tool calls`;
    case "run_failed": return `${e.error?.code}: ${e.error?.message}`;
    case "run_cancelled": return `by ${e.by}`;
    default: return json(e);
  }
}

function eventItem(e) {
  return h("li", { class: `ev-${e.type}`, "data-type": e.type, "data-seq": e.seq },
    h("span", { class: "seq" }, `#${e.seq}`),
    h("span", { class: "type" }, e.type),
    h("span", { class: "muted" }, new Date(e.ts).toLocaleTimeString()),
    h("div", {}, describe(e)));
}

// A run: its record, what it waits for, its live timeline, its checkpoints,
// and for a finished run a step-by-step replay.
async function runPage(id) {
  const signal = pageAbort.signal;
  let run;
  try {
    run = await api(`/ai/runs/${encodeURIComponent(id)}`, { signal });
  } catch (e) {
    if (e.status === 404) {
      setMain(h("h1", {}, "Run"), h("p", { id: "run-not-found" }, `Run ${id} not found.`));
      return;
    }
    setMain(h("h1", {}, "Run"), h("p", { class: "bad" }, e.message));
    return;
  }
  const info = h("div", { class: "card", id: "run-info" });
  const pending = h("div", { id: "run-pending" });
  const checkpoints = h("div", { id: "checkpoints" });
  const streaming = h("div", { class: "card streaming", id: "streaming", hidden: true });
  const timeline = h("ol", { class: "timeline", id: "timeline" });
  const replay = h("div", { class: "replay", id: "replay", hidden: true });
  setMain(h("h1", {}, "Run ", h("code", {}, id)), info, pending, streaming,
    h("h2", {}, "Timeline"), replay, timeline, checkpoints);

  const events = [];
  const renderInfo = () => {
    info.replaceChildren(h("dl", {},
      h("dt", {}, "status"), h("dd", { id: "run-status" }, statusBadge(run.status)),
      h("dt", {}, "agent"), h("dd", {}, run.agent),
      h("dt", {}, "session"), h("dd", {}, h("a", { href: `#/runs?session=${encodeURIComponent(run.session)}` }, run.session)),
      h("dt", {}, "input"), h("dd", {}, run.input),
      h("dt", {}, "output"), h("dd", { id: "run-output" }, run.output ?? ""),
      h("dt", {}, "steps"), h("dd", {}, `${run.steps} (${run.usage?.llm_calls ?? 0} model calls, ${run.usage?.tool_calls ?? 0} tool calls)`),
      run.error ? [h("dt", {}, "error"), h("dd", { class: "bad" }, `${run.error.code}: ${run.error.message}`)] : null,
      h("dt", {}, "created"), h("dd", {}, when(run.created_at))),
    LIVE_STATUS.has(run.status)
      ? h("div", { class: "actions" }, h("button", { id: "cancel-run", onclick: () => act(`/ai/runs/${encodeURIComponent(id)}/cancel`, undefined) }, "Cancel run"))
      : "");
    renderPending();
    renderCheckpoints();
  };
  const act = async (path, body) => {
    try {
      await api(path, { method: "POST", body: body ?? {} });
      banner(null);
      await refresh();
    } catch (e) {
      banner(e.message);
    }
  };
  // Rebuilt only when what the run waits for changes, so that a reason or
  // an answer being typed survives the refreshes events trigger.
  let pendingShown = null;
  const renderPending = () => {
    const p = LIVE_STATUS.has(run.status) ? run.pending : null;
    const key = JSON.stringify(p);
    if (key === pendingShown) return;
    pendingShown = key;
    if (!p) return pending.replaceChildren();
    if (p.type === "approval") {
      pending.replaceChildren(h("div", { class: "card" }, h("h2", {}, "Waiting for approval"),
        approvalControls({ id: p.approval_id, tool: p.tool, arguments: p.arguments, risk: p.risk, reason: p.reason, expires_at: p.expires_at }, refresh)));
    } else if (p.type === "input") {
      const answer = h("input", { type: "text", id: "answer-text", placeholder: "answer" });
      pending.replaceChildren(h("div", { class: "card" }, h("h2", {}, p.handoff ? "Handed to a person" : "Waiting for an answer"),
        h("p", {}, p.question),
        h("form", { class: "actions", onsubmit: (e) => { e.preventDefault(); act(`/ai/runs/${encodeURIComponent(id)}/input`, { text: answer.value }); } },
          answer, h("button", { type: "submit", id: "answer-send" }, "Send"))));
    } else {
      pending.replaceChildren(h("div", { class: "card" }, h("h2", {}, "Waiting for client tool outputs"), json(p.calls)));
    }
  };
  const renderCheckpoints = () => {
    const cps = events.filter((e) => e.type === "checkpoint");
    if (cps.length === 0) return checkpoints.replaceChildren();
    const live = LIVE_STATUS.has(run.status);
    checkpoints.replaceChildren(h("h2", {}, "Checkpoints"), h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "checkpoint"), h("th", {}, "step"), h("th", {}, ""))),
      h("tbody", {}, cps.map((c) => h("tr", {},
        h("td", {}, c.checkpoint_id), h("td", {}, c.step),
        h("td", {}, live
          ? h("button", { "data-checkpoint": c.checkpoint_id, onclick: () => act(`/ai/runs/${encodeURIComponent(id)}/restore`, { checkpoint_id: c.checkpoint_id }) }, "Restore")
          : h("span", { class: "muted" }, "run finished")))))));
  };
  const refresh = async () => {
    run = await api(`/ai/runs/${encodeURIComponent(id)}`, { signal });
    renderInfo();
  };
  let deltas = "";
  const onEvent = (e) => {
    if (e.type === "message_delta") {
      deltas += e.text;
      streaming.hidden = false;
      streaming.textContent = deltas;
      return;
    }
    if (e.type === "final") {
      deltas = "";
      streaming.hidden = true;
    }
    events.push(e);
    timeline.append(eventItem(e));
    if (["approval_required", "approval_resolved", "clarification_needed", "checkpoint", "final"].includes(e.type) || TERMINAL.has(e.type)) {
      refresh().catch((err) => banner(err.message));
    }
    if (TERMINAL.has(e.type)) setupReplay(replay, timeline, events);
  };
  renderInfo();
  try {
    await followEvents(id, onEvent, signal);
  } catch (e) {
    if (!signal.aborted) banner(e.message);
  }
}

// Steps through a finished run: the timeline shows the events up to the
// chosen one, which is highlighted.
function setupReplay(el, timeline, events) {
  const items = [...timeline.children];
  const range = h("input", { type: "range", min: 0, max: items.length - 1, value: items.length - 1, id: "replay-range" });
  const label = h("span", { id: "replay-label" });
  const show = (i) => {
    i = Math.max(0, Math.min(items.length - 1, i));
    range.value = i;
    items.forEach((li, j) => {
      li.hidden = j > i;
      li.classList.toggle("current", j === i);
    });
    label.textContent = `event ${i + 1} of ${items.length}: ${events[i].type}`;
  };
  el.replaceChildren(h("b", {}, "Replay"),
    h("button", { id: "replay-first", onclick: () => show(0) }, "First"),
    h("button", { id: "replay-prev", onclick: () => show(Number(range.value) - 1) }, "◀"),
    range,
    h("button", { id: "replay-next", onclick: () => show(Number(range.value) + 1) }, "▶"),
    h("button", { id: "replay-last", onclick: () => show(items.length - 1) }, "Last"),
    label);
  range.addEventListener("input", () => show(Number(range.value)));
  el.hidden = false;
  label.textContent = `${items.length} events`;
}

// Approve or deny one call, with a reason; the API checks the role.
function approvalControls(a, after) {
  const reason = h("input", { type: "text", class: "reason", placeholder: "reason (optional)", "data-approval-reason": a.id });
  const decide = async (decision) => {
    try {
      await api(`/ai/approvals/${encodeURIComponent(a.id)}`, { method: "POST", body: { decision, reason: reason.value } });
      banner(null);
      await after();
    } catch (e) {
      banner(`${decision} failed: ${e.message}`);
    }
  };
  return h("div", { class: "approval", "data-approval": a.id },
    h("dl", {},
      h("dt", {}, "tool"), h("dd", {}, h("code", {}, a.tool)),
      h("dt", {}, "risk"), h("dd", {}, a.risk),
      h("dt", {}, "reason"), h("dd", {}, a.reason),
      a.expires_at ? [h("dt", {}, "expires"), h("dd", {}, when(a.expires_at))] : null,
      h("dt", {}, "arguments"), h("dd", {}, json(a.arguments))),
    h("div", { class: "actions" },
      reason,
      h("button", { class: "approve", "data-approve": a.id, onclick: () => decide("approve") }, "Approve"),
      h("button", { class: "deny", "data-deny": a.id, onclick: () => decide("deny") }, "Deny")));
}

function approvalsPage() {
  const list = h("div", { id: "approvals" });
  setMain(h("h1", {}, "Pending approvals"), list);
  let shown = null;
  const load = async (signal) => {
    const page = await api("/ai/approvals?status=pending", { signal });
    // Re-render only when the set changes, so a reason being typed survives.
    const ids = page.approvals.map((a) => a.id).join(",");
    if (ids === shown) return;
    shown = ids;
    if (page.approvals.length === 0) {
      list.replaceChildren(h("p", { class: "muted", id: "no-approvals" }, "Nothing waits for a decision."));
      return;
    }
    list.replaceChildren(...page.approvals.map((a) => h("div", { class: "card" },
      h("div", {}, "run ", h("a", { href: `#/runs/${encodeURIComponent(a.run_id)}` }, a.run_id), h("span", { class: "muted" }, ` · ${when(a.created_at)}`)),
      approvalControls(a, () => load(pageAbort.signal)))));
  };
  every(1500, load);
}

async function toolsPage(query) {
  const agent = query.get("agent") || "";
  const q = agent ? `?agent=${encodeURIComponent(agent)}` : "";
  try {
    const { tools } = await api(`/ai/tools${q}`, { signal: pageAbort.signal });
    setMain(h("h1", {}, "Tools", agent ? ` of ${agent}` : ""), h("table", { id: "tools" },
      h("thead", {}, h("tr", {}, ["tool", "source", "risk", "approval", "description"].map((c) => h("th", {}, c)))),
      h("tbody", {}, tools.map((t) => h("tr", { "data-tool": t.name },
        h("td", {}, h("code", {}, t.name)),
        h("td", {}, typeof t.source === "object" ? JSON.stringify(t.source) : t.source),
        h("td", {}, t.risk),
        h("td", {}, (t.needs_approval ?? t.requires_approval) ? "required" : "no"),
        h("td", {}, t.description))))));
  } catch (e) {
    setMain(h("h1", {}, "Tools"), h("p", { class: "bad" }, e.message));
  }
}

// The API as the server describes it in its OpenAPI document.
async function apiPage() {
  try {
    const res = await fetch("/openapi.json", { signal: pageAbort.signal });
    if (!res.ok) throw new Error(`GET /openapi.json: ${res.status}`);
    const doc = await res.json();
    const rows = [];
    for (const [path, ops] of Object.entries(doc.paths || {})) {
      for (const [method, op] of Object.entries(ops)) {
        if (typeof op !== "object" || !op) continue;
        rows.push(h("tr", {}, h("td", {}, method.toUpperCase()), h("td", {}, h("code", {}, path)), h("td", {}, op.summary || op.description || "")));
      }
    }
    setMain(h("h1", {}, doc.info?.title || "API", " ", h("span", { class: "muted" }, doc.info?.version || "")),
      h("p", {}, "The full document: ", h("a", { href: "/openapi.json" }, "/openapi.json")),
      h("table", { id: "api" }, h("thead", {}, h("tr", {}, h("th", {}, "method"), h("th", {}, "path"), h("th", {}, "what"))), h("tbody", {}, rows)));
  } catch (e) {
    setMain(h("h1", {}, "API"), h("p", { class: "bad" }, e.message));
  }
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  setupKeyForm();
  route();
});
