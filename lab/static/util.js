// Shared helpers of the page's modules: DOM lookup, escaping, number formatting and the current
// locale (set by app.js). No rule lives here.

export const $ = (s, r = document) => r.querySelector(s);
export const $$ = (s, r = document) => Array.from(r.querySelectorAll(s));

export const ui = { loc: null }; // the current locale file (app.js sets it)

export function tr(key, vars) {
  let s = ui.loc?.ui?.[key];
  if (s === undefined) s = key;
  // {n|one|other}: the word that agrees with the number n (English "1 engine", "2 engines"); Chinese has none
  if (vars) s = s.replace(/\{(\w+)\|([^|}]*)\|([^}]*)\}/g, (m, k, one, other) => (k in vars ? (Number(vars[k]) === 1 ? one : other) : m));
  if (vars) s = s.replace(/\{(\w+)\}/g, (m, k) => (k in vars ? String(vars[k]) : m));
  return s;
}

export const fieldLabel = (path) => ui.loc?.fields?.[path]?.label ?? path;

export function esc(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
}

// 1234567 → "1,234,567" (both locales group by thousands). Not toLocaleString: its first call loads
// the ICU number data, which cost the first draw tens of milliseconds.
export const grouped = (n) => String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ",");

export function fmt(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(1);
  if (Array.isArray(v)) return v.map(fmt).join(", ");
  if (v && typeof v === "object") return JSON.stringify(v);
  return v == null ? "–" : String(v);
}

// `backticks` in a finding's text mark flags, values and paths: shown as code, in every language.
// An odd count means the backticks are the user's own text, shown as they are.
export function codeSpans(s) {
  const parts = String(s).split("`");
  if (parts.length % 2 === 0) return esc(s);
  return parts.map((p, i) => (i % 2 ? `<code>${esc(p)}</code>` : esc(p))).join("");
}

// A RUNTIME finding shows the runtime's refusal worded in the page's language from its code
// (lab/locales, runtime.<code>). A refusal the catalogue does not word keeps the runtime's own
// English (params.text, a string then), quoted verbatim as code.
function messageHTML(f) {
  const verbatim = f.params && typeof f.params.text === "string" ? f.params.text : "";
  const at = verbatim ? f.message.indexOf(verbatim) : -1;
  if (at < 0) return codeSpans(f.message);
  return esc(f.message.slice(0, at)) + `<code class="runtime-reason" lang="en">${esc(verbatim)}</code>` +
    esc(f.message.slice(at + verbatim.length));
}

export function findingHTML(f, withFields) {
  const fields = withFields
    ? " " + f.fields.map((p) => `<button type="button" class="linkish" data-focus="${esc(p)}">${esc(fieldLabel(p))}</button>`).join(" ")
    : "";
  return `<div class="finding level-${esc(f.level)}"><b>${esc(tr("level_" + f.level))} ${esc(f.id)}</b>${fields} ${messageHTML(f)}` +
    (f.fix ? ` <span class="fix"><b>${esc(tr("fix"))}</b> ${codeSpans(f.fix)}</span>` : "") + `</div>`;
}
