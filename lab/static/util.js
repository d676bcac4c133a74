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

// The runtime's own reason (a RUNTIME finding's params.reason) is quoted verbatim as code: it is
// the judge's wording, naming its flags, in every language.
function messageHTML(f) {
  const reason = f.params && typeof f.params.reason === "string" ? f.params.reason : "";
  const at = reason ? f.message.indexOf(reason) : -1;
  if (at < 0) return esc(f.message);
  return esc(f.message.slice(0, at)) + `<code class="runtime-reason" lang="en">${esc(reason)}</code>` +
    esc(f.message.slice(at + reason.length));
}

export function findingHTML(f, withFields) {
  const fields = withFields
    ? " " + f.fields.map((p) => `<button type="button" class="linkish" data-focus="${esc(p)}">${esc(fieldLabel(p))}</button>`).join(" ")
    : "";
  return `<div class="finding level-${esc(f.level)}"><b>${esc(tr("level_" + f.level))} ${esc(f.id)}</b>${fields} ${messageHTML(f)}` +
    (f.fix ? ` <span class="fix"><b>${esc(tr("fix"))}</b> ${esc(f.fix)}</span>` : "") + `</div>`;
}
