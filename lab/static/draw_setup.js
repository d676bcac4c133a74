// Drawing of step 2 and step 4 regions from the API's answer: the GPU layout, derived numbers,
// the memory estimate, run commands, the serving diagram and the parallelism diagrams' values.
// Pure views: every number comes from POST /api/workspace.
import { $, $$, esc, fmt, grouped, tr } from "./util.js";

export function drawLayout(L) {
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
    const moreEngines = L.hidden_engines ? `<p class="note">${esc(tr("hidden_engines", { n: L.hidden_engines }))}</p>` : "";
    ext = `<div class="ext-box"><div class="box-title">${esc(tr("external_box"))}</div>${engines}${moreEngines}</div>`;
  }
  box.innerHTML = `<div class="ray-box"><div class="box-title">${esc(tr("ray_box"))}</div>${nodes}${more}</div>${ext}`;
  box.dataset.ownership = L.ownership || "";
}

// Which derived numbers the placement panel shows, in this order (a view choice; values come from the API).
const DERIVED_SHOWN = ["n_actor", "dp", "expert_dp", "engines", "idle_rollout_gpus", "total_gpus", "ray_nodes",
  "ray_gpus_per_node", "samples_per_rollout", "steps_per_rollout", "global_batch_size", "samples_dropped", "expected_staleness"];

export function drawDerived(d) {
  $("#derived").innerHTML = DERIVED_SHOWN.filter((k) => d && d[k] != null)
    .map((k) => `<div data-derived="${esc(k)}"><dt>${esc(tr("derived_" + k))}</dt><dd>${esc(fmt(d[k]))}</dd></div>`).join("");
}


export function drawMemory(m) {
  const box = $("#memory");
  if (!m) { box.innerHTML = `<p class="note">${esc(tr("memory_none"))}</p>`; return; }
  const phase = (key, p) => {
    const rows = Object.entries(p.items_gib || {})
      // a few MiB (the cuBLAS workspace) would read as "0.0": say it is under the shown precision
      .map(([name, gib]) => `<tr><td>${esc(name)}</td><td class="num">${esc(gib > 0 && gib < 0.05 ? "< 0.1" : fmt(gib))}</td></tr>`).join("");
    const fit = p.fits == null ? "" : ` <span class="${p.fits ? "fit-ok" : "fit-bad"}">${esc(tr(p.fits ? "memory_fits" : "memory_over"))}</span>`;
    return `<table class="mem" data-phase="${key}"><caption>${esc(tr("memory_" + key))}</caption>` +
      `<thead><tr><th>${esc(tr("memory_item"))}</th><th class="num">${esc(tr("memory_gib"))}</th></tr></thead><tbody>${rows}</tbody>` +
      `<tfoot><tr><th>${esc(tr("memory_total"))}${fit}</th><td class="num">${esc(fmt(p.total_gib))}</td></tr></tfoot></table>`;
  };
  let html = `<p class="note">${esc(tr(m.colocated ? "memory_colocated" : "memory_separate"))}</p>`;
  html += phase("training", m.training) + phase("rollout", m.rollout);
  html += `<p>${esc(tr("memory_capacity"))}: <b>${esc(fmt(m.gpu_memory_gib))} GiB</b> · ${esc(tr("memory_total"))}: <b>${esc(fmt(m.peak_gib))} GiB</b></p>`;
  if (m.host_optimizer_gib_per_gpu) html += `<p>${esc(tr("memory_host", { g: fmt(m.host_optimizer_gib_per_gpu) }))}</p>`;
  if (m.kv_tokens_per_engine) html += `<p>${esc(tr("memory_kv", { t: grouped(m.kv_tokens_per_engine) }))}</p>`;
  if (m.state_pool_gib > 0) html += cachePools(m);
  const excl = m.exclusions || [];
  if (excl.length) html += `<p class="note"><b>${esc(tr("memory_excluded"))}:</b></p><ul class="note excl">${excl.map((x) => `<li>${esc(x)}</li>`).join("")}</ul>`;
  box.innerHTML = html;
}

export function drawCommands(c) {
  if (!c) return;
  $("#cmd-prepare").textContent = `${c.prepare}\n${c.convert}`;
  $("#cmd-head").textContent = c.head;
  $("#cmd-worker-note").textContent = c.workers > 0 ? tr("cmd_worker", { n: c.workers }) : tr("cmd_worker_none");
  $("#cmd-worker").textContent = c.worker;
  $("#cmd-worker").hidden = c.workers <= 0;
  $("#cmd-external").hidden = !c.external;
  $("#cmd-run").textContent = `${c.check}\n${c.train}`;
}


export function drawServing(exp, d) {
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

export function drawDiag(diagrams) {
  for (const [box, key] of Object.entries((diagrams || {}).loop || {})) {  // the loop strip of this experiment
    const li = $(`.loop [data-loop="${box}"]`);
    if (li) { li.dataset.i18n = key; li.textContent = tr(key); }
  }
  for (const [kind, g] of Object.entries(diagrams || {})) {
    if (kind === "loop") continue;
    const value = $(`[data-diag-value="${kind}"]`);
    if (value) value.textContent = String(g.size);
    const cells = $(`[data-diag-cells="${kind}"]`);
    if (cells) {
      cells.className = `diag-cells ${kind}${g.mode ? " " + g.mode : ""}`;
      cells.innerHTML = g.cells.map((c) => c.ellipsis
        ? `<div class="dcell more">${esc(tr(c.key, c.params))}</div>`
        : `<div class="dcell" data-index="${c.index}"><b>${esc(c.label)}</b><span>${esc(tr(c.key, c.params))}</span></div>`).join("");
    }
    const note = $(`[data-diag-note="${kind}"]`);
    if (note) note.textContent = tr(g.key, g.params);
  }
}


// Hybrid models: the cache budget drawn as two pools at their estimated sizes (widths ∝ GiB).
function cachePools(m) {
  const total = m.kv_pool_gib + m.state_pool_gib;
  const W = 360, kvW = total > 0 ? Math.max(2, Math.round((W * m.kv_pool_gib) / total)) : W / 2;
  const label = (x, w, key, gib) =>
    `<text x="${x + w / 2}" y="30" text-anchor="middle">${esc(tr(key))}</text>` +
    `<text x="${x + w / 2}" y="48" text-anchor="middle">${esc(fmt(gib))} GiB</text>`;
  return `<figure class="pools" data-pools="hybrid"><svg viewBox="0 0 ${W} 60" width="${W}" height="60" role="img" ` +
    `aria-label="${esc(tr("pools_title"))}"><rect class="pool-kv" x="0" y="8" width="${kvW}" height="48"></rect>` +
    `<rect class="pool-state" x="${kvW}" y="8" width="${W - kvW}" height="48"></rect>` +
    label(0, kvW, "pool_kv", m.kv_pool_gib) + label(kvW, W - kvW, "pool_state", m.state_pool_gib) + `</svg>` +
    `<figcaption>${esc(tr("pools_caption", { r: fmt(m.state_kv_ratio) }))}</figcaption></figure>`;
}
