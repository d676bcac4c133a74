// The Quick Start page: a view. It sends the workspace + the user's action to POST /api/workspace
// and draws what comes back. No rule lives here: dependent changes, findings, derived numbers,
// the GPU layout, memory, files and share links are all computed by the Python side.
// Drawing is incremental: each region is redrawn only when its data changed, and controls are
// updated in place, so focus and caret survive an edit.

const STORE_KEY = "slime-lab.workspace";
const LANG_KEY = "slime-lab.lang";
const $ = (s, r = document) => r.querySelector(s);
const $$ = (s, r = document) => Array.from(r.querySelectorAll(s));

const state = {
  ws: null,          // the Workspace JSON (choices + history + A)
  view: null,        // the last response
  loc: null,         // the current locale
  locs: {},
  lang: "en",
  cache: {},         // region → JSON drawn last (skip unchanged regions)
  grpo: null,
  walk: { stage: 0, timer: null },
  rev: 0,
};
let chain = Promise.resolve();
const controls = new Map(); // field path → element

// --- locale ------------------------------------------------------------------------------------

function tr(key, vars) {
  let s = state.loc?.ui?.[key];
  if (s === undefined) s = key;
  if (vars) s = s.replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m));
  return s;
}
const fieldLabel = (path) => state.loc?.fields?.[path]?.label ?? path;

async function loadLocale(lang) {
  if (!state.locs[lang]) {
    const r = await fetch(`/static/locales/${lang}.json`);
    state.locs[lang] = await r.json();
  }
  return state.locs[lang];
}

function applyLocale() {
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  for (const el of $$("[data-i18n]")) el.textContent = tr(el.dataset.i18n);
  for (const el of $$("[data-i18n-field]")) {
    const f = state.loc.fields[el.dataset.i18nField];
    if (!f) continue;
    const part = el.dataset.part;
    const text = part === "option" ? f.options?.[el.dataset.option] : f[part];
    if (text !== undefined) el.textContent = text;
  }
  $("#lang").value = state.lang;
  state.cache = {};
  if (state.view) draw(state.view);
  drawWalk();
}

async function setLang(lang) {
  state.lang = lang;
  localStorage.setItem(LANG_KEY, lang);
  state.loc = await loadLocale(lang);
  applyLocale();
}

// --- talking to the API ------------------------------------------------------------------------

function send(action) {
  const p = chain.then(() => doSend(action));
  chain = p.catch(() => false);
  return p;
}

async function request(action, ws) {
  try {
    const res = await fetch("/api/workspace", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ workspace: ws, action }),
    });
    return { ok: res.ok, data: await res.json() };
  } catch (e) {
    return { ok: false, data: { detail: [{ loc: [], msg: String(e) }] } };
  }
}

function receive({ ok, data }) {
  if (!ok) {
    showError(formatDetail(data));
    setStatus("status_error");
    if (state.view) drawControls(state.view.workspace.b, true); // keep (and show) the old state
    return false;
  }
  hideError();
  state.ws = data.workspace;
  try { localStorage.setItem(STORE_KEY, JSON.stringify(state.ws)); } catch { /* storage full: keep going */ }
  draw(data);
  setStatus("status_idle");
  return data;
}

async function doSend(action) {
  setStatus("status_busy");
  return receive(await request(action, state.ws));
}

function formatDetail(data) {
  const d = Array.isArray(data?.detail) ? data.detail[0] : null;
  if (!d) return tr("error_prefix") + ": " + JSON.stringify(data?.detail ?? data);
  const loc = (d.loc || []).filter((x) => !["body", "action", "workspace", "b"].includes(x));
  const path = loc.join(".");
  const name = state.loc?.fields?.[path] ? `${fieldLabel(path)} (${path})` : path;
  return `${tr("error_prefix")}: ${name ? name + ": " : ""}${d.msg}`;
}

function showError(msg) {
  const el = $("#error");
  el.textContent = msg;
  el.hidden = false;
}
function hideError() { $("#error").hidden = true; }
function setStatus(key) { const el = $("#status"); el.dataset.i18n = key; el.textContent = tr(key); }

function toast(msg) {
  let el = $("#toast");
  if (!el) {
    el = document.createElement("div");
    el.id = "toast";
    el.setAttribute("role", "status");
    document.body.append(el);
  }
  el.textContent = msg;
  el.classList.add("show");
  clearTimeout(toast.t);
  toast.t = setTimeout(() => el.classList.remove("show"), 3500);
}

// --- drawing -----------------------------------------------------------------------------------

const getPath = (obj, path) => path.split(".").reduce((o, k) => (o == null ? o : o[k]), obj);

function changed(region, value) {
  const s = JSON.stringify(value);
  if (state.cache[region] === s) return false;
  state.cache[region] = s;
  return true;
}

function draw(v) {
  state.view = v;
  const exp = v.workspace.b;
  drawControls(exp, false);
  if (changed("findings", v.findings)) drawFindings(v.findings);
  if (changed("layout", v.layout)) drawLayout(v.layout);
  if (changed("derived", v.derived)) drawDerived(v.derived);
  if (changed("memory", v.memory)) drawMemory(v.memory);
  if (changed("commands", v.commands)) drawCommands(v.commands);
  if (changed("files", v.files)) drawFiles(v.files);
  if (changed("ab", [v.ab_diff, v.a_findings, !!v.workspace.a, v.findings.length])) drawAB(v);
  if (changed("share", [v.share_link, v.share_link_ab])) drawShare([v.share_link, v.share_link_ab]);
  if (changed("render_error", v.render_error)) drawRenderError(v.render_error);
  if (v.last_change) drawLastChange(v.last_change);
  if (changed("recipe", v.recipe)) drawRecipe(v.recipe);
  if (changed("serving", [exp.placement, exp.serving, v.derived])) drawServing(exp, v.derived);
  if (changed("diag", [exp.resources, v.derived.dp])) drawDiag(exp, v.derived);
  drawHistory(v.workspace);
  state.rev += 1;
  document.body.dataset.rev = String(state.rev);
  document.dispatchEvent(new CustomEvent("lab:drawn", { detail: state.rev }));
}

function valueToControl(el, v) {
  const kind = el.dataset.kind;
  if (kind === "bool") {
    if (el.checked !== !!v) el.checked = !!v;
    return;
  }
  let s = v == null ? "" : kind === "list" ? (v || []).join(", ") : String(v);
  if (kind === "select" && s !== "" && !$$("option", el).some((o) => o.value === s)) {
    const o = document.createElement("option");
    o.value = o.textContent = s;
    el.append(o);
  }
  if (el.value !== s) el.value = s;
}

function drawControls(exp, force) {
  for (const [path, el] of controls) {
    if (!force && el === document.activeElement && el.dataset.dirty) continue; // user is typing
    delete el.dataset.dirty;
    valueToControl(el, getPath(exp, path));
  }
}

function controlValue(el) {
  const kind = el.dataset.kind;
  const nullable = el.dataset.nullable === "1";
  if (kind === "bool") return el.checked;
  const raw = el.value;
  if (kind === "list") return raw.split(",").map((x) => x.trim()).filter(Boolean);
  if (raw === "" && nullable) return null;
  if (kind === "int" || kind === "float") {
    const n = Number(raw);
    return raw.trim() === "" || Number.isNaN(n) ? raw : n; // the API names the field if it's wrong
  }
  return raw;
}

function esc(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

function findingHTML(f, withFields) {
  const fields = withFields
    ? " " + f.fields.map((p) => `<button type="button" class="linkish" data-focus="${esc(p)}">${esc(fieldLabel(p))}</button>`).join(" ")
    : "";
  return `<div class="finding level-${esc(f.level)}"><b>${esc(tr("level_" + f.level))} ${esc(f.id)}</b>${fields} ${esc(f.message)}` +
    (f.fix ? ` <span class="fix"><b>${esc(tr("fix"))}</b> ${esc(f.fix)}</span>` : "") + `</div>`;
}

function drawFindings(findings) {
  // The full finding sits at the first field it names that the page shows; its other fields get a
  // short reference, so one finding is not repeated in full across a step.
  const by = new Map();
  const add = (p, f, full) => { if (!by.has(p)) by.set(p, []); by.get(p).push([f, full]); };
  for (const f of findings) {
    const shown = f.fields.filter((p) => controls.has(p));
    shown.forEach((p, i) => add(p, f, i === 0));
  }
  for (const box of $$("[data-findings-for]")) {
    const list = by.get(box.dataset.findingsFor) || [];
    const html = list.map(([f, full]) => full ? findingHTML(f, false)
      : `<div class="finding ref level-${esc(f.level)}"><b>${esc(tr("level_" + f.level))} ${esc(f.id)}</b> <button type="button" class="linkish" data-focus="${esc(f.fields.find((p) => controls.has(p)))}">${esc(fieldLabel(f.fields.find((p) => controls.has(p))))}</button></div>`).join("");
    if (box.innerHTML !== html) box.innerHTML = html;
    const wrap = box.parentElement;
    wrap.classList.toggle("has-error", list.some(([f]) => f.level === "error"));
    wrap.classList.toggle("has-warning", list.some(([f]) => f.level === "warning"));
  }
  const n = { error: 0, warning: 0, info: 0 };
  for (const f of findings) n[f.level] = (n[f.level] || 0) + 1;
  const head = n.error || n.warning || n.info
    ? tr("summary_counts", { e: n.error, w: n.warning, i: n.info })
    : tr("summary_ok");
  const order = { error: 0, warning: 1, info: 2 };
  const sorted = [...findings].sort((a, b) => order[a.level] - order[b.level]);
  $("#summary").innerHTML = `<p class="summary-head ${n.error ? "bad" : n.warning ? "warn" : "ok"}">${esc(head)}</p>` +
    sorted.map((f) => findingHTML(f, true)).join("");
  $("#nav-summary").innerHTML = (n.error ? `<span class="badge bad" title="${esc(tr("level_error"))}">✕ ${n.error}</span>` : "") +
    (n.warning ? `<span class="badge warn" title="${esc(tr("level_warning"))}">! ${n.warning}</span>` : "");
}

function drawLayout(L) {
  const box = $("#layout");
  if (!L) { box.textContent = ""; return; }
  if (L.cpu_only) { box.innerHTML = `<p class="note">${esc(tr("cpu_only"))}</p>`; return; }
  const cell = (c, g) => {
    const [role, eng] = c;
    const start = eng != null && (g === 0 || cell.prev !== eng);
    cell.prev = eng;
    const cls = `cell ${role}` + (eng != null ? ` eng-${eng % 2 ? "odd" : "even"}` : "") + (start ? " eng-start" : "");
    const title = tr("gpu_title", { g, role: tr("role_" + role) }) + (eng != null ? ` · ${tr("engine", { e: eng })}` : "");
    return `<span class="${cls}" title="${esc(title)}">${start ? "E" + eng : ""}</span>`;
  };
  cell.prev = null;
  let g = 0;
  const nodes = L.nodes.map((n, i) =>
    `<div class="node"><span class="node-label">${esc(tr("node", { i }))}</span><div class="gpus">${n.map((c) => cell(c, g++)).join("")}</div></div>`).join("");
  const more = L.hidden_nodes ? `<p class="note">${esc(tr("hidden_nodes", { n: L.hidden_nodes }))}</p>` : "";
  let ext = "";
  if (L.external && L.external.length) {
    const engines = L.external.map((size, e) =>
      `<div class="ext-engine"><span class="node-label">${esc(tr("engine", { e }))}</span><div class="gpus">${
        Array.from({ length: Math.min(size, 64) }, () => `<span class="cell external"></span>`).join("")}</div></div>`).join("");
    ext = `<div class="ext-box"><div class="box-title">${esc(tr("external_box"))}</div>${engines}</div>`;
  }
  box.innerHTML = `<div class="ray-box"><div class="box-title">${esc(tr("ray_box"))}</div>${nodes}${more}</div>${ext}`;
  box.dataset.ownership = L.ownership || "";
}

// Which derived numbers the placement panel shows, in this order (a view choice; values come from the API).
const DERIVED_SHOWN = ["n_actor", "dp", "expert_dp", "engines", "idle_rollout_gpus", "total_gpus", "ray_nodes",
  "ray_gpus_per_node", "samples_per_rollout", "steps_per_rollout", "global_batch_size", "samples_dropped", "expected_staleness"];

function drawDerived(d) {
  $("#derived").innerHTML = DERIVED_SHOWN.filter((k) => d && k in d)
    .map((k) => `<div data-derived="${esc(k)}"><dt>${esc(tr("derived_" + k))}</dt><dd>${esc(fmt(d[k]))}</dd></div>`).join("");
}

function fmt(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(1);
  if (Array.isArray(v)) return v.map(fmt).join(", ");
  if (v && typeof v === "object") return JSON.stringify(v);
  return v == null ? "–" : String(v);
}

function drawMemory(m) {
  const box = $("#memory");
  if (!m) { box.innerHTML = `<p class="note">${esc(tr("memory_none"))}</p>`; return; }
  const phase = (key, p) => {
    const rows = Object.entries(p.items_gib || {})
      .map(([name, gib]) => `<tr><td>${esc(name)}</td><td class="num">${esc(fmt(gib))}</td></tr>`).join("");
    const fit = p.fits == null ? "" : ` <span class="${p.fits ? "fit-ok" : "fit-bad"}">${esc(tr(p.fits ? "memory_fits" : "memory_over"))}</span>`;
    return `<table class="mem" data-phase="${key}"><caption>${esc(tr("memory_" + key))}</caption>` +
      `<thead><tr><th>${esc(tr("memory_item"))}</th><th class="num">${esc(tr("memory_gib"))}</th></tr></thead><tbody>${rows}</tbody>` +
      `<tfoot><tr><th>${esc(tr("memory_total"))}${fit}</th><td class="num">${esc(fmt(p.total_gib))}</td></tr></tfoot></table>`;
  };
  let html = `<p class="note">${esc(tr(m.colocated ? "memory_colocated" : "memory_separate"))}</p>`;
  html += phase("training", m.training) + phase("rollout", m.rollout);
  html += `<p>${esc(tr("memory_capacity"))}: <b>${esc(fmt(m.gpu_memory_gib))} GiB</b> · ${esc(tr("memory_total"))}: <b>${esc(fmt(m.peak_gib))} GiB</b></p>`;
  if (m.host_optimizer_gib_per_gpu) html += `<p>${esc(tr("memory_host", { g: fmt(m.host_optimizer_gib_per_gpu) }))}</p>`;
  if (m.kv_tokens_per_engine) html += `<p>${esc(tr("memory_kv", { t: m.kv_tokens_per_engine.toLocaleString() }))}</p>`;
  const excl = m.exclusions || [];
  if (excl.length) html += `<p class="note"><b>${esc(tr("memory_excluded"))}:</b></p><ul class="note excl">${excl.map((x) => `<li>${esc(x)}</li>`).join("")}</ul>`;
  box.innerHTML = html;
}

function drawCommands(c) {
  if (!c) return;
  $("#cmd-prepare").textContent = `${c.prepare}\n${c.convert}`;
  $("#cmd-head").textContent = c.head;
  $("#cmd-worker-note").textContent = c.workers > 0 ? tr("cmd_worker", { n: c.workers }) : tr("cmd_worker_none");
  $("#cmd-worker").textContent = c.worker;
  $("#cmd-worker").hidden = c.workers <= 0;
  $("#cmd-external").hidden = !c.external;
  $("#cmd-run").textContent = `${c.check}\n${c.train}`;
}

function drawFiles(files) {
  for (const btn of $$("[data-download]")) btn.hidden = !(btn.dataset.download in files);
  for (const d of $$("details.preview")) {
    const name = d.dataset.file;
    d.hidden = !(name in files);
    const pre = $("pre", d);
    const text = files[name] ?? "";
    if (pre.textContent !== text) pre.textContent = text;
  }
}

function abValue(v) { return v === undefined ? "–" : fmt(v); }

function drawAB(v) {
  const hasA = !!v.workspace.a;
  $("#restore-a").disabled = !hasA;
  $("#clear-a").disabled = !hasA;
  const box = $("#ab-diff");
  if (!hasA) { box.innerHTML = `<p class="note">${esc(tr("ab_empty"))}</p>`; return; }
  const count = (fs) => ({ e: fs.filter((f) => f.level === "error").length, w: fs.filter((f) => f.level === "warning").length });
  const a = count(v.a_findings || []), b = count(v.findings || []);
  let html = `<p>${esc(tr("ab_findings", { e: a.e, w: a.w, be: b.e, bw: b.w }))}</p>`;
  const diff = v.ab_diff || [];
  if (!diff.length) html += `<p class="note">${esc(tr("ab_same"))}</p>`;
  else html += `<table class="ab"><thead><tr><th>${esc(tr("ab_field"))}</th><th>A</th><th>B</th></tr></thead><tbody>` +
    diff.map((r) => {
      const path = r.path ?? r.field;
      return `<tr data-path="${esc(path)}"><td>${esc(fieldLabel(path))} <code>${esc(path)}</code></td><td>${esc(abValue(r.a))}</td><td>${esc(abValue(r.b))}</td></tr>`;
    }).join("") + `</tbody></table>`;
  box.innerHTML = html;
}

function shareURL(link) { return link ? location.origin + location.pathname + link : ""; }
function drawShare([link, ab]) {
  $("#share-link").value = shareURL(link);
  $("#copy-share").disabled = !link;
  $("#copy-share-ab").hidden = !ab;
}

function drawRenderError(msg) {
  const el = $("#render-error");
  el.hidden = !msg;
  el.textContent = msg ? tr("render_failed", { msg }) : "";
}

// Which fields changed with the user's change (dependent changes come back with their reason).
function drawLastChange(entry) {
  const deps = entry.changes.filter((c) => c.reason);
  for (const c of entry.changes) {
    const wrap = controls.get(c.path)?.closest(".field");
    if (!wrap) continue;
    wrap.classList.remove("flash");
    void wrap.offsetWidth; // restart the animation
    wrap.classList.add("flash");
  }
  if (entry.undone) { toast(tr("undone", { label: entryLabel(entry) })); return; }
  if (deps.length) toast(tr("changed_with", { list: deps.map((c) => fieldLabel(c.path)).join(", ") }));
}

function drawRecipe(r) {
  const box = $("#recipe-notes");
  if (!r) { box.innerHTML = ""; return; }
  box.innerHTML = `<p><b>${esc(r.display_name)}</b> · ${esc(r.summary || "")}</p>` +
    (r.notes?.length ? `<ul>${r.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul>` : "");
}

function drawServing(exp, d) {
  const s = exp.serving, p = exp.placement;
  const parts = [];
  if (p.ownership === "external") parts.push(`<div class="srv ext">${esc(tr("srv_external"))}</div>`);
  if (s.pd.enabled) {
    parts.push(`<div class="srv-row"><div class="srv prefill">${esc(tr("srv_prefill", { n: s.pd.prefill_engines }))}` +
      (s.hicache.enabled ? `<div class="srv sub">${esc(tr("srv_hicache"))}</div>` : "") +
      `</div><div class="srv arrow">→ ${esc(tr("srv_kv"))} →</div><div class="srv decode">${esc(tr("srv_decode", { n: s.pd.decode_engines }))}` +
      (s.eagle.enabled ? `<div class="srv sub">${esc(tr("srv_eagle", { d: s.eagle.draft_tokens }))}</div>` : "") + `</div></div>`);
  } else {
    parts.push(`<div class="srv plain">${esc(tr("srv_plain"))} · ${esc(tr("srv_engines", { n: d.engines, e: p.engine_gpus }))}` +
      (s.hicache.enabled ? `<div class="srv sub">${esc(tr("srv_hicache"))}</div>` : "") +
      (s.eagle.enabled ? `<div class="srv sub">${esc(tr("srv_eagle", { d: s.eagle.draft_tokens }))}</div>` : "") + `</div>`);
  }
  $("#serving-diagram").innerHTML = parts.join("");
}

function drawDiag(exp, d) {
  const vals = { tp: exp.resources.tp, pp: exp.resources.pp, ep: exp.resources.ep, cp: exp.resources.cp, zero: d.dp };
  for (const el of $$("[data-diag-value]")) el.textContent = String(vals[el.dataset.diagValue]);
}

function entryLabel(e) {
  if (!e) return "";
  return state.loc?.fields?.[e.label] ? fieldLabel(e.label) : e.label;
}

function drawHistory(ws) {
  const u = $("#undo"), r = $("#redo");
  u.disabled = !ws.undo.length;
  r.disabled = !ws.redo.length;
  u.title = ws.undo.length ? tr("undo_title", { label: entryLabel(ws.undo[ws.undo.length - 1]) }) : "";
  r.title = ws.redo.length ? tr("redo_title", { label: entryLabel(ws.redo[ws.redo.length - 1]) }) : "";
}

// --- the RL walkthrough ------------------------------------------------------------------------

function drawWalk() {
  const panel = $("#walk-panel");
  if (!panel) return;
  const g = state.grpo;
  const i = state.walk.stage;
  for (const b of $$(".walk-stage")) b.setAttribute("aria-current", String(Number(b.dataset.walk) === i + 1));
  for (const li of $$(".loop li[data-stage]")) li.classList.toggle("active", Number(li.dataset.stage) === i + 1 && $("#walk").open);
  $("#walk-play").textContent = tr(state.walk.timer ? "walk_pause" : "walk_play");
  if (!g) { panel.textContent = "…"; return; }
  const r4 = (x) => (Math.round(x * 100) / 100).toFixed(2);
  const adv = Math.max(...g.advantages.map(Math.abs));
  const vars = { n: g.n, mean: g.mean, std: g.std.toFixed(4), std_expr: g.std_expr, adv: "±" + r4(adv), source: g.source };
  const chips = g.rewards.map((r, k) => {
    let s = `<span class="chip r${r}"><span>${esc(tr("walk_answer", { i: k + 1 }))}</span>`;
    if (i >= 2) s += `<span>${esc(tr("walk_reward", { r }))}</span>`;
    if (i >= 3) s += `<span class="adv">${esc(tr("walk_adv", { a: (g.advantages[k] >= 0 ? "+" : "") + r4(g.advantages[k]) }))}</span>`;
    return s + `</span>`;
  }).join("");
  panel.innerHTML = `<p>${esc(tr("walk_desc" + (i + 1), vars))}</p>` + (i >= 1 && i <= 3 ? `<div class="chips">${chips}</div>` : "");
}

async function openWalk() {
  if (!state.grpo) {
    const r = await fetch("/api/grpo-example");
    state.grpo = await r.json();
  }
  drawWalk();
}

function walkStep(delta) {
  state.walk.stage = (state.walk.stage + delta + 5) % 5;
  drawWalk();
}

function walkPlay() {
  if (state.walk.timer) {
    clearInterval(state.walk.timer);
    state.walk.timer = null;
  } else {
    state.walk.timer = setInterval(() => {
      if (state.walk.stage >= 4) { clearInterval(state.walk.timer); state.walk.timer = null; drawWalk(); return; }
      walkStep(1);
    }, 1600);
    if (state.walk.stage >= 4) state.walk.stage = 0;
  }
  drawWalk();
}

// --- events ------------------------------------------------------------------------------------

function download(name) {
  const text = state.view?.files?.[name];
  if (text == null) return;
  const type = name.endsWith(".json") ? "application/json" : "text/x-shellscript";
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = document.createElement("a");
  a.href = url;
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function goTo(id) {
  const el = document.getElementById(id);
  if (!el) return;
  el.scrollIntoView({ block: "start" });
  el.setAttribute("tabindex", "-1");
  el.focus({ preventScroll: true });
}

function isTyping(el) {
  return el && (el.tagName === "INPUT" && !["checkbox", "radio", "button", "file"].includes(el.type) || el.tagName === "TEXTAREA");
}

function bindEvents() {
  for (const el of $$("[data-field]")) {
    controls.set(el.dataset.field, el);
    el.addEventListener("input", () => { el.dataset.dirty = "1"; });
    el.addEventListener("change", () => {
      delete el.dataset.dirty;
      send({ type: "edit", path: el.dataset.field, value: controlValue(el) });
    });
    if (el.dataset.kind !== "bool" && el.tagName === "INPUT") {
      el.addEventListener("keydown", (ev) => {
        if (ev.key === "Escape") { delete el.dataset.dirty; valueToControl(el, getPath(state.ws.b, el.dataset.field)); }
      });
    }
  }
  $("#undo").addEventListener("click", () => send({ type: "undo" }));
  $("#redo").addEventListener("click", () => send({ type: "redo" }));
  $("#reset").addEventListener("click", () => send({ type: "reset" }));
  $("#lang").addEventListener("change", (ev) => setLang(ev.target.value));
  document.addEventListener("keydown", (ev) => {
    if (!(ev.ctrlKey || ev.metaKey) || ev.altKey) return;
    const k = ev.key.toLowerCase();
    if (k !== "z" && k !== "y") return;
    if (isTyping(ev.target) && ev.target.dataset.dirty) return; // native undo inside a field being edited
    ev.preventDefault();
    send({ type: k === "y" || ev.shiftKey ? "redo" : "undo" });
  });
  document.addEventListener("click", (ev) => {
    const go = ev.target.closest("[data-goto]");
    if (go) { ev.preventDefault(); goTo(go.dataset.goto); return; }
    const dl = ev.target.closest("[data-download]");
    if (dl) { download(dl.dataset.download); return; }
    const f = ev.target.closest("[data-focus]");
    if (f) {
      const el = controls.get(f.dataset.focus);
      if (el) {
        const det = el.closest("details");
        if (det) det.open = true;
        el.scrollIntoView({ block: "center" });
        el.focus();
      }
      return;
    }
    const tab = ev.target.closest("[data-tab]");
    if (tab) selectTab(tab.dataset.tab);
  });
  $(".tabs").addEventListener("keydown", (ev) => {
    const tabs = $$("[data-tab]");
    const i = tabs.indexOf(document.activeElement);
    if (i < 0 || !["ArrowLeft", "ArrowRight"].includes(ev.key)) return;
    const next = tabs[(i + (ev.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
    selectTab(next.dataset.tab);
    next.focus();
  });
  const copy = async (link) => {
    const url = shareURL(link);
    $("#share-link").value = url;
    try { await navigator.clipboard.writeText(url); } catch { $("#share-link").select(); document.execCommand?.("copy"); }
    toast(tr("copied"));
  };
  $("#copy-share").addEventListener("click", () => copy(state.view?.share_link));
  $("#copy-share-ab").addEventListener("click", () => copy(state.view?.share_link_ab));
  $("#load-json").addEventListener("change", async (ev) => {
    const file = ev.target.files[0];
    ev.target.value = "";
    if (!file) return;
    const ok = await send({ type: "load_json", text: await file.text() });
    if (ok) toast(tr("loaded_json"));
  });
  $("#save-a").addEventListener("click", () => send({ type: "save_a" }));
  $("#restore-a").addEventListener("click", () => send({ type: "restore_a" }));
  $("#clear-a").addEventListener("click", () => send({ type: "clear_a" }));
  $("#walk").addEventListener("toggle", () => { if ($("#walk").open) openWalk(); else drawWalk(); });
  $("#walk-prev").addEventListener("click", () => walkStep(-1));
  $("#walk-next").addEventListener("click", () => walkStep(1));
  $("#walk-play").addEventListener("click", walkPlay);
  for (const b of $$(".walk-stage")) b.addEventListener("click", () => { state.walk.stage = Number(b.dataset.walk) - 1; drawWalk(); });
  $("#walk-adopt").addEventListener("click", async () => { if (await send({ type: "adopt_grpo" })) toast(tr("walk_adopted")); });
  // The nav shows where you are.
  const links = new Map($$(".steps a[data-goto]").map((a) => [a.dataset.goto, a]));
  const io = new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting) {
      for (const a of links.values()) a.removeAttribute("aria-current");
      links.get(e.target.id)?.setAttribute("aria-current", "step");
    }
  }, { rootMargin: "-40% 0px -55% 0px" });
  for (const id of links.keys()) { const s = document.getElementById(id); if (s) io.observe(s); }
}

function selectTab(name) {
  for (const t of $$("[data-tab]")) t.setAttribute("aria-selected", String(t.dataset.tab === name));
  for (const p of $$(".diagram")) p.hidden = p.id !== "diag-" + name;
}

// --- start -------------------------------------------------------------------------------------

async function init() {
  // Start the locale and the first API request at once, before the DOM is parsed (the module is
  // async); draw when both are in and the DOM is ready.
  state.lang = localStorage.getItem(LANG_KEY) === "zh" ? "zh" : "en";
  const locP = loadLocale(state.lang);
  let stored = null;
  try { stored = JSON.parse(localStorage.getItem(STORE_KEY) || "null"); } catch { stored = null; }
  state.ws = stored;
  const hash = location.hash;
  let action = { type: "view" };
  if (hash.startsWith("#s=")) {
    action = { type: "open_share", link: hash };
    history.replaceState(null, "", location.pathname + location.search); // the fragment has done its job
  }
  const first = request(action, stored);
  if (document.readyState === "loading") await new Promise((r) => document.addEventListener("DOMContentLoaded", r, { once: true }));
  bindEvents();
  state.loc = await locP;
  if (state.lang !== "en") applyLocale();
  let ok = receive(await first);
  if (ok && action.type === "open_share") toast(tr("share_opened"));
  if (!ok && action.type === "open_share") {
    const msg = $("#error").textContent;
    ok = await send({ type: "view" });
    showError(msg);
  }
  if (!ok && stored) {
    state.ws = null;
    ok = await send({ type: "view" });
    if (ok) toast(tr("restored_storage"));
  }
  document.body.dataset.ready = "1";
  performance.mark("lab:ready");
}

init();
