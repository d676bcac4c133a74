// The Quick Start page: a view. It sends the workspace + the user's action to POST /api/workspace
// and draws what comes back. No rule lives here: dependent changes, findings, derived numbers,
// the GPU layout, memory, files and share links are all computed by the Python side.
// Drawing is incremental: each region is redrawn only when its data changed, and controls are
// updated in place, so focus and caret survive an edit.

import { $, $$, esc, fieldLabel, findingHTML, tr, ui } from "./util.js";
import { drawCommands, drawDerived, drawDiag, drawLayout, drawMemory, drawServing } from "./draw_setup.js";
import { drawAB, drawImage, drawProvenance, drawRepairs } from "./draw_panels.js";
import { drawWalk, openWalk, walkGoTo, walkPlay, walkStep } from "./walk.js";
import { bindRunPlot, drawRunPlot } from "./runplot.js";

const STORE_KEY = "slime-lab.workspace";
const LANG_KEY = "slime-lab.lang";

const state = {
  ws: null,          // the Workspace JSON (choices + history + A)
  view: null,        // the last response
  locs: {},
  lang: "en",
  cache: {},         // region → {value, json} drawn last (skip unchanged regions)
  held: {},          // answer part → its tag, for the parts state.view holds (withParts)
  rev: 0,
  complete: false,   // steps 2-6 are in the document (they come after the first screen is drawn)
};
let chain = Promise.resolve();
const controls = new Map(); // field path → element

// --- locale ------------------------------------------------------------------------------------

// The English locale comes with the page (a JSON data block); another is fetched once.
const inlineJSON = (id) => JSON.parse(document.getElementById(id).textContent);

async function loadLocale(lang) {
  if (!state.locs[lang]) {
    if (lang === "en") state.locs.en = inlineJSON("boot-locale");
    else state.locs[lang] = await (await fetch(`/locales/${lang}.json`)).json();
  }
  return state.locs[lang];
}

// The texts of `root` (the document, or steps 2-6 as they arrive) in the current locale.
function localize(root) {
  for (const el of $$("[data-i18n]", root)) el.textContent = tr(el.dataset.i18n);
  for (const el of $$("a[data-doc]", root)) el.href = `/docs/${state.lang}/${el.dataset.doc}`; // docs in the page's language
  for (const el of $$("[data-i18n-field]", root)) {
    const f = ui.loc.fields[el.dataset.i18nField];
    if (!f) continue;
    const part = el.dataset.part;
    const text = part === "option" ? f.options?.[el.dataset.option] : f[part];
    if (text !== undefined) el.textContent = text;
  }
}

function applyLocale() {
  document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
  localize(document);
  $("#lang").value = state.lang;
  state.cache = {};
  if (state.view) draw(state.view);
  drawWalk();
  drawRunPlot();
}

async function setLang(lang) {
  state.lang = lang;
  localStorage.setItem(LANG_KEY, lang);
  ui.loc = await loadLocale(lang);
  applyLocale();
  if (state.view) await send({ type: "view" }); // findings, repairs and reasons come back in this language
}

// --- talking to the API ------------------------------------------------------------------------

function send(action, errorPrefix = "") {
  const p = chain.then(() => doSend(action, errorPrefix));
  chain = p.catch(() => false);
  return p;
}

// Only the tops of the history stacks travel: the server needs no more to undo, redo or label the
// buttons, and answers how each stack changed (lab/history_tail.py). The whole history stays here.
const TAIL_SENT = 2; // lab/history_tail.py TAIL_SENT (tests/lab/test_history_tail.py ties the two)

function requestBody(action, ws) {
  const held = state.view ? state.held : undefined; // the parts this page can keep (lab/web/answer_parts.py)
  // No workspace yet, or a stored one the server must judge whole (it answers what is wrong with it).
  if (!ws || !Array.isArray(ws.undo) || !Array.isArray(ws.redo)) return { workspace: ws, action, lang: state.lang, held };
  const sent = { b: ws.b, a: ws.a, undo: ws.undo.slice(-TAIL_SENT), redo: ws.redo.slice(-TAIL_SENT) };
  return { workspace: sent, history: { undo: ws.undo.length, redo: ws.redo.length }, action, lang: state.lang, held };
}

// The answer leaves out the parts whose tags the request held (`same`): this page's copies stand
// in for them, the very same objects, so drawing skips them at a glance (`changed`). A part of texts
// (the files) may come as line patches against this page's copy (`patch`).
function withParts(data) {
  const same = Array.isArray(data.same) && state.view ? data.same : [];
  const patch = data.patch && state.view ? data.patch : {};
  const kept = {};
  for (const k of same) kept[k] = state.held[k];
  state.held = { ...kept, ...(data.tags || {}) };
  if (!same.length && !Object.keys(patch).length) return data;
  const v = { ...data };
  for (const k of same) v[k] = state.view[k];
  for (const [k, p] of Object.entries(patch)) v[k] = patchTexts(state.view[k], p.texts);
  return v;
}

const textLines = (text) => text.match(/[^\n]*\n|[^\n]+$/g) || []; // lab/web/answer_parts.py lines

// {name: ops}: each text from the held one, lines [i, j) giving way to the lines sent (answer_parts.text_ops).
function patchTexts(held, texts) {
  const out = {};
  for (const [name, ops] of Object.entries(texts)) {
    const old = textLines(held?.[name] ?? "");
    const parts = [];
    let at = 0;
    for (const [i, j, lines] of ops) { parts.push(...old.slice(at, i), ...lines); at = j; }
    parts.push(...old.slice(at));
    out[name] = parts.join("");
  }
  return out;
}

function withHistory(ws, data) {
  const h = data.history;
  if (!h) return data.workspace; // a fresh workspace comes back whole
  const stack = (side) => ws[side].slice(h[side].start, h[side].stop).concat(h[side].push);
  return { ...data.workspace, undo: stack("undo"), redo: stack("redo") };
}

// Actions go over one WebSocket while it is open (lab/web/api_socket.py: the same body, the same
// answer): inside Chromium a fetch costs 4-6 ms of a click, a socket message under 1 ms
// (bench/bench_transport.py). The POST stays the way in before the socket opens, while it cannot
// open (a proxy without WebSockets), and for a request in flight when it closes: the server keeps
// no state, so sending the same request again is safe.
const SOCKET_PATH = "/api/workspace/socket";
const SOCKET_RETRY_MS = 5000;
const socket = { ws: null, opening: false, next: 1, pending: new Map(), retryAt: 0 };

function openSocket() {
  if (socket.ws || socket.opening || Date.now() < socket.retryAt || typeof WebSocket !== "function") return;
  let ws;
  try {
    ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${SOCKET_PATH}`);
  } catch {
    socket.retryAt = Date.now() + SOCKET_RETRY_MS;
    return;
  }
  socket.opening = true;
  ws.onopen = () => { socket.ws = ws; socket.opening = false; };
  ws.onmessage = (e) => {
    const text = String(e.data);
    const nl = text.indexOf("\n");
    let head = null;
    try { head = nl > 0 ? JSON.parse(text.slice(0, nl)) : null; } catch { head = null; }
    if (!head || typeof head.id !== "number") {
      ws.close(); // not an answer of ours: whatever waits goes again by POST (onclose)
      return;
    }
    const waiting = socket.pending.get(head.id);
    if (!waiting) return;
    socket.pending.delete(head.id);
    const ok = head.status >= 200 && head.status < 300;
    waiting({ ok, data: parseAnswer(text.slice(nl + 1), head.status) });
  };
  ws.onclose = () => {
    if (socket.ws !== ws) socket.retryAt = Date.now() + SOCKET_RETRY_MS; // never opened: try again later
    socket.ws = null;
    socket.opening = false;
    const waiting = [...socket.pending.values()];
    socket.pending.clear();
    for (const resolve of waiting) resolve(null); // each goes again by POST
  };
}

function viaSocket(body) {
  return new Promise((resolve) => {
    const id = socket.next++;
    socket.pending.set(id, resolve);
    try {
      socket.ws.send(`${JSON.stringify({ id, lang: state.lang })}\n${body}`);
    } catch {
      socket.pending.delete(id);
      resolve(null);
    }
  });
}

async function request(action, ws) {
  const body = JSON.stringify(requestBody(action, ws));
  if (socket.ws && socket.ws.readyState === WebSocket.OPEN) {
    const answer = await viaSocket(body);
    if (answer) return answer;
  } else {
    openSocket(); // for the next action; this one does not wait for it
  }
  try {
    const res = await fetch("/api/workspace", {
      method: "POST",
      headers: { "content-type": "application/json", "accept-language": state.lang },
      body,
    });
    return { ok: res.ok, data: parseAnswer(await res.text(), res.status) };
  } catch (e) {
    return { ok: false, data: { detail: [{ loc: [], msg: String(e) }] } };
  }
}

// The API answers JSON, errors included; anything else (a proxy's page, a cut connection) is shown
// as the HTTP status in words, never as a parser error.
function parseAnswer(text, status) {
  try { return JSON.parse(text); } catch { return { detail: [{ loc: [], msg: tr("error_http", { status }) }] }; }
}

function receive({ ok, data }, errorPrefix = "") {
  if (!ok) {
    showError(errorPrefix + formatDetail(data));
    setStatus("status_error");
    if (state.view) drawControls(state.view.workspace.b, true); // keep (and show) the old state
    return false;
  }
  hideError();
  const v = withParts(data);
  state.ws = withHistory(state.ws, v);
  try { localStorage.setItem(STORE_KEY, JSON.stringify(state.ws)); } catch { /* storage full: keep going */ }
  draw(v);
  setStatus("status_idle");
  return v;
}

// "Working…" shows only for an answer that keeps the user waiting: drawing it for every click would
// cost a frame of layout and paint while the answer is computed, on the same cores.
const BUSY_AFTER_MS = 150;

async function doSend(action, errorPrefix) {
  const busy = setTimeout(() => setStatus("status_busy"), BUSY_AFTER_MS);
  const answer = await request(action, state.ws);
  clearTimeout(busy);
  return receive(answer, errorPrefix);
}

function formatDetail(data) {
  const d = Array.isArray(data?.detail) ? data.detail[0] : null;
  if (!d) return tr("error_prefix") + ": " + JSON.stringify(data?.detail ?? data);
  const loc = (d.loc || []).filter((x) => !["body", "action", "workspace", "b"].includes(x));
  const path = loc.join(".");
  const where = ui.loc?.ui?.["loc_" + path]; // what a non-field location (the JSON file, the link) is called
  const name = ui.loc?.fields?.[path] ? `${fieldLabel(path)} (${path})` : where ?? path;
  return `${tr("error_prefix")}: ${name ? name + ": " : ""}${d.msg}`;
}

function showError(msg) {
  const el = $("#error");
  el.textContent = msg;
  el.hidden = false;
}
function hideError() { $("#error").hidden = true; }
function setStatus(key) {
  const el = $("#status");
  const text = tr(key);
  if (el.dataset.i18n === key && el.textContent === text) return; // an unchanged line costs no frame
  el.dataset.i18n = key;
  el.textContent = text;
}

// The import report of the last launch script loaded: every difference between its train command
// and the rendered one, with the reason the server gives (lab/import_script.py).
function drawImportReport(items) {
  const box = $("#import-report");
  box.hidden = !items;
  if (!items) return;
  box.querySelector("summary").textContent = tr("import_report", { count: items.length });
  const ul = box.querySelector("ul");
  ul.replaceChildren(...items.map((it) => {
    const li = document.createElement("li");
    li.textContent = `${it.kind} · ${tr("import_report_line", { line: it.line })} · ${it.flag ? it.flag + ": " : ""}${it.why}`;
    return li;
  }));
}

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
  const last = state.cache[region];
  if (last && last.value === value && value !== undefined) return false; // a part the answer left out
  const json = JSON.stringify(value);
  if (last && last.json === json) { last.value = value; return false; }
  state.cache[region] = { value, json };
  return true;
}

function draw(v) {
  state.view = v;
  const exp = v.workspace.b;
  drawControls(exp, false);
  if (changed("folded", v.folded)) drawFolded(v.folded || []);
  if (changed("findings", v.findings)) drawFindings(v.findings);
  if (changed("recipe", v.recipe)) drawRecipe(v.recipe);
  if (v.last_change) drawLastChange(v.last_change);
  if (state.complete) drawLater(v, exp); // steps 2-6, once they are in the document
  drawHistory(state.ws, v.history_labels);
  state.rev += 1;
  document.body.dataset.rev = String(state.rev);
  document.dispatchEvent(new CustomEvent("lab:drawn", { detail: state.rev }));
}

// The regions of steps 2-6 (their first draw happens when they are inserted: insertLater).
function drawLater(v, exp) {
  if (changed("layout", v.layout)) drawLayout(v.layout);
  if (changed("plan", v.placement_lines)) drawPlan(v.placement_lines || []);
  if (changed("derived", v.derived)) drawDerived(v.derived);
  if (changed("memory", v.memory)) drawMemory(v.memory);
  if (changed("commands", v.commands)) drawCommands(v.commands);
  if (changed("files", v.files)) drawFiles(v.files);
  if (changed("ab", [v.ab_diff, v.a_findings, !!v.workspace.a, v.findings.length])) drawAB(v);
  if (changed("share", [v.share_link, v.share_link_ab])) drawShare([v.share_link, v.share_link_ab]);
  if (changed("render_error", v.render_error)) drawRenderError(v.render_error);
  if (changed("serving", [exp.placement, exp.serving, v.derived])) drawServing(exp, v.derived);
  if (changed("diag", v.diagrams)) drawDiag(v.diagrams);
  if (changed("repairs", [v.repairs, v.derived, exp.placement])) drawRepairs(v.repairs, v);
  if (changed("image", v.image)) drawImage(v.image);
  if (changed("provenance", v.provenance)) drawProvenance(v.provenance);
}

// Controls that cannot apply to the current choices are folded away (the server decides which).
function drawFolded(paths) {
  const folded = new Set(paths);
  for (const wrap of $$("[data-field-wrap]")) wrap.hidden = folded.has(wrap.dataset.fieldWrap);
}

// The runtime's Ray placement plan: the lines `experiment.sh check` prints, from the same function.
function drawPlan(lines) {
  $("#placement-plan").textContent = lines.join("\n");
}

function valueToControl(el, v) {
  const kind = el.dataset.kind;
  if (kind === "bool") {
    if (el.checked !== !!v) el.checked = !!v;
    return;
  }
  let s = v == null ? "" : kind === "list" ? (v || []).join(", ") : String(v);
  // Every answer redraws every control; nearly all already show their value. A <select> whose value
  // is `s` has that option, so only a changed one is searched (and given the option if it lacks it).
  if (el.value === s) return;
  if (kind === "select" && s !== "" && !$$("option", el).some((o) => o.value === s)) {
    const o = document.createElement("option");
    o.value = o.textContent = s;
    el.append(o);
  }
  el.value = s;
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
  const summary = $("#summary"); // step 5: drawn again when steps 2-6 arrive
  if (summary) summary.innerHTML = `<p class="summary-head ${n.error ? "bad" : n.warning ? "warn" : "ok"}">${esc(head)}</p>` +
    sorted.map((f) => findingHTML(f, true)).join("");
  $("#nav-summary").innerHTML = (n.error ? `<span class="badge bad" title="${esc(tr("level_error"))}">✕ ${n.error}</span>` : "") +
    (n.warning ? `<span class="badge warn" title="${esc(tr("level_warning"))}">! ${n.warning}</span>` : "");
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
// The flash is a Web Animation: restarting a CSS animation needs a class removed, a forced layout
// (`offsetWidth`) and the class added again, which laid out the whole page inside every answer's
// draw, before the browser could show the new preview. An animation object restarts by itself.
const flashes = new WeakMap(); // field wrapper → its running flash
const FLASH = [{ backgroundColor: "#fff3b0" }, { backgroundColor: "transparent" }];

function flash(wrap) {
  flashes.get(wrap)?.cancel();
  if (typeof wrap.animate !== "function") return;
  const a = wrap.animate(FLASH, { duration: 1200, easing: "ease-out" });
  flashes.set(wrap, a);
  a.onfinish = a.oncancel = () => { if (flashes.get(wrap) === a) flashes.delete(wrap); };
}

function drawLastChange(entry) {
  const deps = entry.changes.filter((c) => c.reason);
  for (const c of entry.changes) {
    const wrap = controls.get(c.path)?.closest(".field");
    if (wrap) flash(wrap);
  }
  if (entry.undone) { toast(tr("undone", { label: entryLabel(entry.label) })); return; }
  if (deps.length) toast(tr("changed_with", { list: deps.map((c) => fieldLabel(c.path)).join(", ") }));
}

function drawRecipe(r) {
  const box = $("#recipe-notes");
  if (!r) { box.innerHTML = ""; return; }
  box.innerHTML = `<p><b>${esc(r.display_name)}</b> · ${esc(r.summary || "")}</p>` +
    (r.notes?.length ? `<ul>${r.notes.map((n) => `<li>${esc(n)}</li>`).join("")}</ul>` : "");
}

// A history label as the server rendered it in the page's language; a field path is named by the page.
function entryLabel(label) {
  if (!label) return "";
  return ui.loc?.fields?.[label] ? fieldLabel(label) : label;
}

function drawHistory(ws, labels) {
  const u = $("#undo"), r = $("#redo");
  u.disabled = !ws.undo.length;
  r.disabled = !ws.redo.length;
  u.title = ws.undo.length ? tr("undo_title", { label: entryLabel(labels?.undo) }) : "";
  r.title = ws.redo.length ? tr("redo_title", { label: entryLabel(labels?.redo) }) : "";
}

// --- events ------------------------------------------------------------------------------------

function download(name) {
  const text = state.view?.files?.[name];
  if (text == null) return;
  const type = name.endsWith(".json") ? "application/json" : name.endsWith(".yaml") ? "application/yaml" : "text/x-shellscript";
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
  if (!el) { if (!state.complete) state.later?.then(() => goTo(id)); return; } // a later step, still arriving
  el.scrollIntoView({ block: "start" });
  el.setAttribute("tabindex", "-1");
  el.focus({ preventScroll: true });
}

function isTyping(el) {
  return el && (el.tagName === "INPUT" && !["checkbox", "radio", "button", "file"].includes(el.type) || el.tagName === "TEXTAREA");
}

function bindControls(root) {
  for (const el of $$("[data-field]", root)) {
    if (controls.has(el.dataset.field)) continue; // bound already (steps 2-6 bind after step 1)
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
}

// The nav shows where you are (steps 2-6 are observed when they arrive).
let stepObserver = null;
const navLinks = new Map();
function observeSteps() {
  if (!stepObserver) {
    for (const a of $$(".steps a[data-goto]")) navLinks.set(a.dataset.goto, a);
    stepObserver = new IntersectionObserver((entries) => {
      for (const e of entries) if (e.isIntersecting) {
        for (const a of navLinks.values()) a.removeAttribute("aria-current");
        navLinks.get(e.target.id)?.setAttribute("aria-current", "step");
      }
    }, { rootMargin: "-40% 0px -55% 0px" });
  }
  for (const id of navLinks.keys()) {
    const s = document.getElementById(id);
    if (s && !s.dataset.observed) { s.dataset.observed = "1"; stepObserver.observe(s); }
  }
}

// The header, the intro and step 1, and the document-wide handlers.
function bindEvents() {
  bindControls(document);
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
  document.addEventListener("click", async (ev) => {
    const btn = ev.target.closest("[data-apply-repair]");
    if (!btn) return;
    const ok = await send({ type: "apply_repair", id: btn.dataset.applyRepair });
    if (ok) toast(tr("repair_applied"));
  });
  $("#walk").addEventListener("toggle", () => { if ($("#walk").open) openWalk(); else drawWalk(); });
  $("#walk-prev").addEventListener("click", () => walkStep(-1));
  $("#walk-next").addEventListener("click", () => walkStep(1));
  $("#walk-play").addEventListener("click", walkPlay);
  for (const b of $$(".walk-stage")) b.addEventListener("click", () => { walkGoTo(Number(b.dataset.walk) - 1); });
  $("#walk-adopt").addEventListener("click", async () => { if (await send({ type: "adopt_grpo" })) toast(tr("walk_adopted")); });
  observeSteps();
}

// Steps 2-6, when they are inserted.
function bindLater() {
  bindControls(document);
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
    const input = ev.target;
    const files = [...input.files];
    input.value = "";
    if (!files.length) return;
    const size = files.reduce((n, f) => n + f.size, 0);
    const max = Number(input.dataset.maxBytes || 0);
    if (max && size > max) { // refused before reading: B and its history stay as they are
      showError(tr("load_failed", { name: files[0].name }) + " " + tr("load_too_large", { size, max }));
      setStatus("status_error");
      return;
    }
    // A launch script may come with the model specs it sources (chosen together): the one that
    // runs train.py is the script, the others are sent by name for its `source` lines.
    const texts = await Promise.all(files.map((f) => f.text()));
    const main = Math.max(0, texts.findIndex((t) => /train(_async)?\.py/.test(t)));
    const file = files[main];
    const prefix = tr("load_failed", { name: file.name }) + " ";
    const type = file.name.endsWith(".sh") ? "import_script" : "load_json"; // a launch script opens as B vs its recipe as A
    const action = { type, text: texts[main] };
    if (type === "import_script" && files.length > 1) {
      action.sources = Object.fromEntries(files.map((f, i) => [f.name, texts[i]]).filter((_, i) => i !== main));
    }
    const ok = await send(action, prefix);
    if (ok) toast(tr("loaded_json"));
    drawImportReport(ok && type === "import_script" ? ok.import_report : null);
  });
  $("#save-a").addEventListener("click", () => send({ type: "save_a" }));
  $("#restore-a").addEventListener("click", () => send({ type: "restore_a" }));
  $("#clear-a").addEventListener("click", () => send({ type: "clear_a" }));
  bindRunPlot(); // step 6: plot a run's metrics.jsonl (lab/static/runplot.js)
  observeSteps();
}

function selectTab(name) {
  for (const t of $$("[data-tab]")) t.setAttribute("aria-selected", String(t.dataset.tab === name));
  for (const p of $$(".diagram")) p.hidden = p.id !== "diag-" + name;
}

// --- start -------------------------------------------------------------------------------------

async function init() {
  // Start the locale and the first API request at once, before the DOM is parsed (the module is
  // async); draw when both are in and the DOM is ready. A first visit in English needs neither:
  // the page carries the English locale and the answer for a fresh workspace (lab/page.py).
  const boot = window.slimeBoot; // requests the page's inline script already started
  state.lang = boot ? boot.lang : (localStorage.getItem(LANG_KEY) === "zh" ? "zh" : "en");
  let locP = null;
  if (state.lang !== "en") {
    locP = boot?.locale ? boot.locale.catch(() => loadLocale(state.lang)) : loadLocale(state.lang);
    locP.then((loc) => { state.locs[state.lang] = loc; }, () => {});
  }
  let stored = null;
  if (boot) stored = boot.stored;
  else { try { stored = JSON.parse(localStorage.getItem(STORE_KEY) || "null"); } catch { stored = null; } }
  state.ws = stored;
  const hash = location.hash;
  let action = { type: "view" };
  if (hash.startsWith("#s=")) {
    action = { type: "open_share", link: hash };
    history.replaceState(null, "", location.pathname + location.search); // the fragment has done its job
  }
  const inline = boot?.inline && action.type === "view";
  const first = inline ? null : boot?.first && action.type === "view" ? boot.first : request(action, stored);
  performance.mark("lab:init");
  if (document.readyState === "loading") await new Promise((r) => document.addEventListener("DOMContentLoaded", r, { once: true }));
  performance.mark("lab:dom");
  bindEvents(); // the document holds the intro and step 1; steps 2-6 come after the first draw
  state.later = new Promise((resolve) => { state.laterDone = resolve; });
  performance.mark("lab:bound");
  ui.loc = locP ? await locP : await loadLocale("en");
  if (state.lang !== "en") applyLocale();
  // The page lacks the block only when the server could not compute it: then ask, as any visit does.
  const firstAnswer = inline && $("#boot-view") ? { ok: true, data: inlineJSON("boot-view") } : await (first ?? request(action, stored));
  performance.mark("lab:data");
  let ok = receive(firstAnswer);
  performance.mark("lab:drawn");
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
  performance.mark("lab:ready"); // the first screen is drawn with its first answer
  try {
    await insertLater();
  } catch (e) {
    showError(`${tr("error_prefix")}: ${String(e?.message ?? e)}`);
    setStatus("status_error");
  }
  state.laterDone();
  openSocket(); // the clicks from now on (opening it earlier would only delay the first screen)
  document.body.dataset.ready = "1";
  performance.mark("lab:complete"); // steps 2-6 are in the document and drawn
  // A link to a later step (/#step-3) found no target while that step was still arriving.
  const target = /^#[\w-]+$/.test(location.hash) && document.getElementById(location.hash.slice(1));
  if (target) target.scrollIntoView({ block: "start" });
}

// Steps 2-6 (GET /later-steps.html, lab/page.py): the page's boot script asked for them while the
// document loaded; they are inserted once the first screen has been painted, translated, bound, and
// drawn from the last answer like the rest (every control, finding and runtime verdict).
async function laterHTML() {
  const early = await (window.slimeBoot?.later ?? null);
  if (typeof early === "string") return early;
  const res = await fetch("/later-steps.html");
  if (!res.ok) throw new Error(tr("error_http", { status: res.status }));
  return res.text();
}

const afterPaint = () => new Promise((resolve) => {
  requestAnimationFrame(() => setTimeout(resolve, 0)); // after the frame that shows the first screen
  setTimeout(resolve, 100); // a hidden tab has no frames
});

async function insertLater() {
  const [html] = await Promise.all([laterHTML(), afterPaint()]);
  const tpl = document.createElement("template");
  tpl.innerHTML = html;
  if (state.lang !== "en") localize(tpl.content);
  $("#step-1").after(tpl.content);
  bindLater();
  state.complete = true;
  // Steps 2-6 draw for the first time (their regions were never drawn); findings and folded fields
  // reach into them too. The rest of step 1 stays as drawn.
  delete state.cache.findings;
  delete state.cache.folded;
  if (state.view) draw({ ...state.view, last_change: null }); // the last change was shown already
}

init();
