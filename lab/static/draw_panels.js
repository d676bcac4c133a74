// The trust panels of the export area and their neighbours, drawn from the API's answer:
// Compare A / B (differences and each side's own checks), repair previews (field changes, GPU
// allocation, what is still required, before anything is applied), the installation image's
// hardware context, and Source & validation scope (provenance). No rule lives here.
import { $, esc, fieldLabel, findingHTML, fmt, tr, ui } from "./util.js";

// A field's value as the user reads it: the option's label in the current language where it has one.
const abValue = (v, path) => (v === undefined ? "–" : ui.loc?.fields?.[path]?.options?.[String(v)]
  ?? (typeof v === "boolean" ? tr(v ? "value_on" : "value_off") : fmt(v)));
const serious = (fs) => (fs || []).filter((f) => f.level !== "info");

function sideFindings(label, fs) {
  const list = serious(fs);
  return `<div class="ab-side"><h4>${esc(label)}</h4>` +
    (list.length ? list.map((f) => findingHTML(f, false)).join("") : `<p class="note">${esc(tr("ab_side_ok"))}</p>`) + `</div>`;
}

export function drawAB(v) {
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
  else html += `<div class="table-wrap"><table class="ab"><thead><tr><th>${esc(tr("ab_field"))}</th><th>A</th><th>B</th></tr></thead><tbody>` +
    diff.map((r) => {
      const path = r.path ?? r.field;
      return `<tr data-path="${esc(path)}"><td>${esc(fieldLabel(path))} <code>${esc(path)}</code></td><td>${esc(abValue(r.a, path))}</td><td>${esc(abValue(r.b, path))}</td></tr>`;
    }).join("") + `</tbody></table></div>`;
  html += `<details class="ab-checks"><summary>${esc(tr("ab_checks"))}</summary><div class="ab-sides">` +
    sideFindings("A", v.a_findings) + sideFindings(tr("ab_b_export"), v.findings) + `</div></details>`;
  box.innerHTML = html;
}

// --- repair previews ---------------------------------------------------------------------------

const ALLOC = [
  ["nodes", "alloc_nodes"], ["train_gpus", "alloc_train"], ["rollout_gpus", "alloc_rollout"], ["engines", "derived_engines"],
  ["engine_gpus", "alloc_engine"], ["prefill_gpus", "alloc_prefill"], ["decode_gpus", "alloc_decode"],
  ["idle_rollout_gpus", "derived_idle_rollout_gpus"], ["total_gpus", "derived_total_gpus"],
];

function repairHTML(r, now) {
  const rows = r.changes.map((c) => `<tr data-path="${esc(c.path)}"${c.reason ? ' class="dep"' : ""}>` +
    `<td>${esc(fieldLabel(c.path))} <code>${esc(c.path)}</code>${c.reason ? `<div class="reason">${esc(tr("repair_dependent"))}: ${esc(c.reason)}</div>` : ""}</td>` +
    `<td>${esc(abValue(c.old, c.path))}</td><td>→ ${esc(abValue(c.new, c.path))}</td></tr>`).join("");
  const alloc = ALLOC.filter(([k]) => k in r.allocation && (r.allocation[k] || ["nodes", "train_gpus", "total_gpus"].includes(k)))
    .map(([k, label]) => {
      const before = now?.[k];
      const moved = before !== undefined && before !== r.allocation[k];
      return `<div data-alloc="${esc(k)}"${moved ? ' class="moved"' : ""}><dt>${esc(tr(label))}</dt><dd>${moved ? `${esc(fmt(before))} → ` : ""}${esc(fmt(r.allocation[k]))}</dd></div>`;
    }).join("");
  const req = r.requires.length
    ? `<ul class="requires">${r.requires.map((q) => `<li data-req="${esc(q.key)}">${esc(tr("req_" + q.key))}` +
        (q.field ? ` <button type="button" class="linkish" data-focus="${esc(q.field)}">${esc(fieldLabel(q.field))}</button>` : "") + `</li>`).join("")}</ul>`
    : `<p class="note">${esc(tr("repair_requires_none"))}</p>`;
  const rem = r.remaining.length
    ? r.remaining.map((f) => `<span class="badge bad">${esc(f.id)}</span>`).join(" ")
    : `<span class="note">${esc(tr("repair_remaining_none"))}</span>`;
  return `<details class="repair" data-repair-id="${esc(r.id)}"><summary><b>${esc(r.fixes)}</b> ${esc(r.title)}</summary>` +
    (r.finding ? findingHTML(r.finding, false) : "") +
    `<h4>${esc(tr("repair_changes"))}</h4><div class="table-wrap"><table class="ab repair-changes"><thead><tr><th>${esc(tr("ab_field"))}</th>` +
    `<th>${esc(tr("repair_now"))}</th><th>${esc(tr("repair_after"))}</th></tr></thead><tbody>${rows}</tbody></table></div>` +
    `<h4>${esc(tr("repair_allocation"))}</h4><dl class="derived alloc">${alloc}</dl>` +
    `<h4>${esc(tr("repair_requires"))}</h4>${req}` +
    `<p class="remaining"><b>${esc(tr("repair_remaining"))}</b> ${rem}</p>` +
    `<button type="button" class="primary" data-apply-repair="${esc(r.id)}">${esc(tr("repair_apply"))}</button></details>`;
}

export function drawRepairs(repairs, v) {
  const box = $("#repair-list");
  const list = repairs || [];
  $("#repairs-count").textContent = String(list.length);
  $("#repairs").classList.toggle("has-repairs", list.length > 0);
  const open = new Set([...box.querySelectorAll("details.repair[open]")].map((d) => d.dataset.repairId));
  const now = { ...v.derived, ...v.workspace.b.placement };
  box.innerHTML = list.length ? list.map((r) => repairHTML(r, now)).join("") : `<p class="note">${esc(tr("repairs_none"))}</p>`;
  for (const d of box.querySelectorAll("details.repair")) if (open.has(d.dataset.repairId) || list.length === 1) d.open = true;
}

// --- installation image: hardware context ------------------------------------------------------

function hwLine(im) {
  const yes = (b) => tr(b ? "hw_yes" : "hw_no");
  if (im.gpu_family === "cpu") return tr("hw_cpu");
  return tr("hw_line", {
    gpus: (im.gpus || []).join(" / ") || im.gpu_family, mem: fmt(im.gpu_memory_gib), fp8: yes(im.fp8), int4: yes(im.int4),
  });
}

export function drawImage(im) {
  const info = $("#image-info"), hw = $("#hw-context");
  if (!im || !im.known) {
    const msg = tr("image_unknown", { tag: im?.tag ?? "" });
    info.innerHTML = `<p class="finding level-warning">${esc(msg)}</p>`;
    hw.innerHTML = `${esc(msg)} <button type="button" class="linkish" data-focus="install.image">${esc(fieldLabel("install.image"))}</button>`;
    return;
  }
  const v = (x) => x ?? "–";
  info.innerHTML = `<dl class="derived image-versions">` +
    [["image_cuda", im.cuda], ["image_sglang", im.sglang], ["image_megatron", im.megatron_core], ["image_torch", im.torch],
      ["image_family", im.gpu_family]].map(([k, x]) => `<div><dt>${esc(tr(k))}</dt><dd>${esc(v(x))}</dd></div>`).join("") +
    `</dl><p>${esc(hwLine(im))}</p><p class="note">${esc(tr("image_no_cert"))}</p>`;
  hw.innerHTML = `<b>${esc(tr("hw_title"))}</b> ${esc(im.name)} · ${esc(hwLine(im))} ` +
    `<button type="button" class="linkish" data-focus="install.image">${esc(tr("hw_change"))}</button>` +
    `<br><span class="note">${esc(tr("image_no_cert"))}</span>`;
}

// --- Source & validation scope ------------------------------------------------------------------

export function drawProvenance(p) {
  const box = $("#provenance-body");
  if (!p) { box.innerHTML = ""; return; }
  const ck = p.checkout || {};
  let state;
  if (ck.repository !== "git") state = `<span class="badge warn">${esc(tr("prov_no_git"))}</span>`;
  else state = `<code title="${esc(ck.commit || "")}">${esc((ck.commit || tr("prov_no_commit")).slice(0, 12))}</code> ` +
    (ck.dirty ? `<span class="badge warn" data-dirty="1">${esc(tr("prov_dirty"))}</span>` : `<span class="badge ok" data-dirty="0">${esc(tr("prov_clean"))}</span>`);
  let html = `<p><b>${esc(tr("prov_checkout"))}</b> ${state}</p>`;
  if (ck.dirty) html += `<p class="note">${esc(tr("prov_dirty_note"))}</p>`;
  const src = Object.entries(p.sources || {}).map(([name, s]) => {
    const mod = s.missing ? tr("prov_missing") : s.modified == null ? "–" : tr(s.modified ? "prov_modified" : "prov_unchanged");
    return `<tr data-source="${esc(name)}"><td>${esc(tr("prov_src_" + name))}</td><td><code>${esc(s.path)}</code></td>` +
      `<td><code class="sha">${esc(s.sha256 || "–")}</code></td><td>${esc(mod)}</td></tr>`;
  }).join("");
  html += `<div class="table-wrap"><table class="ab prov"><thead><tr><th>${esc(tr("prov_source"))}</th><th>${esc(tr("prov_path"))}</th>` +
    `<th>sha256</th><th>${esc(tr("prov_vs_commit"))}</th></tr></thead><tbody>${src}</tbody></table></div>`;
  const sel = p.image?.tag;
  const imgs = (p.known_images || []).map((im) => `<tr${im.tag === sel ? ' class="selected"' : ""}><td>${esc(im.name)}` +
    `${im.tag === sel ? ` <b>(${esc(tr("prov_selected"))})</b>` : ""}<br><code>${esc(im.tag)}</code></td>` +
    `<td>${esc(im.cuda ?? "–")}</td><td>${esc(im.sglang ?? "–")}</td><td>${esc(im.megatron_core ?? "–")}</td><td>${esc(im.gpu_family)}</td></tr>`).join("");
  html += `<h4>${esc(tr("prov_images"))}</h4><div class="table-wrap"><table class="ab prov"><thead><tr><th>${esc(tr("prov_image"))}</th>` +
    `<th>CUDA</th><th>SGLang</th><th>Megatron</th><th>${esc(tr("image_family"))}</th></tr></thead><tbody>${imgs}</tbody></table></div>`;
  if (p.image && !p.image.known) html += `<p class="finding level-warning">${esc(tr("image_unknown", { tag: p.image.tag }))}</p>`;
  const ids = p.not_recorded_ids || [];
  html += `<h4>${esc(tr("prov_not_checked"))}</h4><ul class="not-checked">` +
    ids.map((id, i) => `<li data-not="${esc(id)}">${esc(tr("prov_not_" + id) === "prov_not_" + id ? p.not_recorded[i] : tr("prov_not_" + id))}</li>`).join("") +
    `</ul><p class="note">${esc(tr("prov_same_record"))}</p>`;
  box.innerHTML = html;
}
