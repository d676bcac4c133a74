// The "Understand an RL run" walkthrough: five stages over the GRPO example that
// GET /api/grpo-example computes with the runtime's own normalization. Its temporary example never
// touches the saved experiment; adopting it is one undoable change (app.js sends adopt_grpo).
import { $, $$, esc, tr } from "./util.js";

const walk = { stage: 0, timer: null, grpo: null };

export function drawWalk() {
  const panel = $("#walk-panel");
  if (!panel) return;
  const g = walk.grpo;
  const i = walk.stage;
  for (const b of $$(".walk-stage")) b.setAttribute("aria-current", String(Number(b.dataset.walk) === i + 1));
  for (const li of $$(".loop li[data-stage]")) li.classList.toggle("active", Number(li.dataset.stage) === i + 1 && $("#walk").open);
  $("#walk-play").textContent = tr(walk.timer ? "walk_pause" : "walk_play");
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

export async function openWalk() {
  if (!walk.grpo) {
    const r = await fetch("/api/grpo-example");
    walk.grpo = await r.json();
  }
  drawWalk();
}

export function walkStep(delta) {
  walk.stage = (walk.stage + delta + 5) % 5;
  drawWalk();
}

export function walkPlay() {
  if (walk.timer) {
    clearInterval(walk.timer);
    walk.timer = null;
  } else {
    walk.timer = setInterval(() => {
      if (walk.stage >= 4) { clearInterval(walk.timer); walk.timer = null; drawWalk(); return; }
      walkStep(1);
    }, 1600);
    if (walk.stage >= 4) walk.stage = 0;
  }
  drawWalk();
}


export function walkGoTo(i) { walk.stage = i; drawWalk(); }
