"""Placement groups for the training and rollout pools.

GPU bundles ({"GPU": 1, "CPU": c}) where the cluster has GPUs; CPU bundles ({"CPU": c}) otherwise,
with c = --cpus-per-bundle (fractions let 2 trainer ranks and an engine share a 2-core machine).
Colocated: one pool; each bundle hosts a trainer rank and an engine, which take turns (the
engine releases its memory while the trainer works, the trainer offloads while engines sample).
Disaggregated: two pools, each actor owns its bundle. An engine of E GPUs gets one bundle of E
GPUs (so its GPUs are whole on one node); an engine wider than a node gets ceil(E / per-node)
bundles of --num-gpus-per-node GPUs, one actor per node rank (engine_bundles()).
External engines (--rollout-external-engine-addrs): no rollout pool at all.

plan_pools() is pure (tested without Ray); create_pools() asks Ray and fails with the arithmetic
instead of hanging when the cluster is too small (RES-2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slime.config import ClusterConfig
from slime.parallel_sizes import data_parallel_size, expert_data_parallel_size
from slime.refusals import declare

_R = declare("placement", {
    "pools_do_not_fit": ("detail",),
    "not_ready": ("name", "bundles", "seconds"),
})

COLOCATED_SHARE = 0.5  # each side's share of a bundle when colocated


@dataclass(frozen=True)
class PoolPlan:
    name: str
    bundles: list[dict[str, float]]
    actor_resources: dict[str, float]  # what one actor asks of its bundle (num_cpus / num_gpus)


@dataclass
class Pool:
    plan: PoolPlan
    pg: Any  # a ray.util.placement_group.PlacementGroup; None: a pool without bundles

    def options(self, index: int, share: float = 1.0) -> dict:
        """Ray .options(...) that place an actor on bundle `index` of this pool. `share` < 1 splits
        an actor's part of the bundle (ppo: a trainer rank and its critic rank share one)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        res = self.plan.actor_resources
        return {"num_cpus": res.get("CPU", 0) * share, "num_gpus": res.get("GPU", 0) * share,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=index % len(self.plan.bundles))}


def _bundle(cpus: float, use_gpu: bool) -> dict[str, float]:
    return {"CPU": cpus, "GPU": 1.0} if use_gpu else {"CPU": cpus}


def plan_pools(c: ClusterConfig) -> tuple[PoolPlan, PoolPlan]:
    """(training plan, rollout plan); colocated plans share one bundle list."""
    cpus = c.cpus_per_bundle
    if c.colocate:
        n = max(c.num_trainer_ranks, c.num_rollout_units)
        bundles = [_bundle(cpus, c.use_gpu) for _ in range(n)]
        share = {k: v * COLOCATED_SHARE for k, v in bundles[0].items()}
        return PoolPlan("colocated", bundles, share), PoolPlan("colocated", bundles, share)
    train = PoolPlan("train", [_bundle(cpus, c.use_gpu) for _ in range(c.num_trainer_ranks)],
                     _bundle(cpus, c.use_gpu))
    if c.external:
        return train, PoolPlan("rollout", [], {})
    e = c.rollout_num_gpus_per_engine
    per_bundle = min(e, c.num_gpus_per_node) if c.use_gpu else 1
    nodes = -(-e // per_bundle) if c.use_gpu else 1
    bundle = {"CPU": cpus, "GPU": float(per_bundle)} if c.use_gpu else {"CPU": cpus}
    rollout = PoolPlan("rollout", [dict(bundle) for _ in range(c.num_engines * nodes)], dict(bundle))
    return train, rollout


def engine_bundles(c: ClusterConfig, engine: int) -> list[int]:
    """Bundle indices (one per node rank) of engine `engine` in the disaggregated rollout pool."""
    if not c.use_gpu or c.colocate:
        return [engine]
    nodes = -(-c.rollout_num_gpus_per_engine // min(c.rollout_num_gpus_per_engine, c.num_gpus_per_node))
    return list(range(engine * nodes, (engine + 1) * nodes))


def producer_actor_options(c: ClusterConfig, pool: "Pool | None", n: int, engines: int) -> list[dict]:
    """Ray options of n straw producers: each in the bundle of an engine group, spread evenly, asking
    no CPU or GPU of its own (placement_plan lists the same); external engines: Ray picks the nodes."""
    from slime.rollout.producers import producer_engine

    if pool is None or pool.pg is None:
        return [{} for _ in range(n)]
    return [{**pool.options(engine_bundles(c, producer_engine(k, n, engines))[0]), "num_cpus": 0, "num_gpus": 0}
            for k in range(n)]


def total_request(plans: tuple[PoolPlan, PoolPlan]) -> dict[str, float]:
    train, rollout = plans
    seen = [train] if train.bundles is rollout.bundles else [train, rollout]
    total: dict[str, float] = {}
    for p in seen:
        for b in p.bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
    return total


def create_pools(c: ClusterConfig, timeout_s: float = 60.0) -> tuple[Pool, Pool]:
    import ray
    from ray.util.placement_group import placement_group

    plans = plan_pools(c)
    need = total_request(plans)
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) + 1e-9 < v}
    if short:
        detail = ", ".join(f"{k}: need {v:g}, cluster has {h:g}" for k, (v, h) in short.items())
        raise RuntimeError(_R("pools_do_not_fit", detail=detail))
    train_plan, rollout_plan = plans
    train_pg = placement_group(train_plan.bundles, strategy="PACK", name=f"slime-{train_plan.name}")
    pools = [Pool(train_plan, train_pg)]
    if rollout_plan.bundles is train_plan.bundles:
        pools.append(Pool(rollout_plan, train_pg))
    elif not rollout_plan.bundles:
        pools.append(Pool(rollout_plan, None))
    else:
        pools.append(Pool(rollout_plan, placement_group(rollout_plan.bundles, strategy="PACK",
                                                        name="slime-rollout")))
    for p in {id(p.pg): p for p in pools if p.pg is not None}.values():
        ready, _ = ray.wait([p.pg.ready()], timeout=timeout_s)
        if not ready:
            raise RuntimeError(_R("not_ready", name=p.plan.name, bundles=str(p.plan.bundles), seconds=timeout_s))
    return pools[0], pools[1]


# -- the placement plan: who sits on which node and GPU, before anything is reserved ---------------

@dataclass(frozen=True)
class Slot:
    """One actor of the run and where the pools put it."""

    role: str  # trainer | engine | prefill | decode | router | external | producer
    index: int
    node: int | None  # None: outside Ray's GPUs (external engines) or any node (CPU-only router)
    gpus: tuple[int, ...]  # GPU indices on `node` (a wide engine: on its first node)
    nodes: tuple[int, ...] = ()  # every node an engine wider than one node spans
    address: str = ""  # external engines: host:port
    beside: int | None = None  # straw producers: the engine whose bundle (and node) it shares

    def where(self) -> str:
        if self.role == "external":
            return f"outside Ray, {self.address}"
        if self.role == "producer" and self.beside is not None:
            node = "Ray picks the node" if self.node is None else f"node {self.node}"
            return f"{node}, beside engine {self.beside} (no GPU, no CPU reserved)"
        if self.node is None:
            return "CPU actor, no GPU (Ray picks the node)"
        if not self.gpus:
            return f"node {self.node}, CPU bundle"
        if len(self.nodes) > 1:  # a wide engine takes whole nodes (RES-4 refuses a part of one)
            return f"nodes {self.nodes[0]}-{self.nodes[-1]}, GPU {_gpu_list(self.gpus)} of each"
        return f"node {self.node} GPU {_gpu_list(self.gpus)}"


def _gpu_list(gpus: tuple[int, ...]) -> str:
    """`0-7` for a contiguous run of three or more, else `0,1` / `2,5`."""
    if len(gpus) > 2 and list(gpus) == list(range(gpus[0], gpus[0] + len(gpus))):
        return f"{gpus[0]}-{gpus[-1]}"
    return ",".join(str(g) for g in gpus)


def placement_plan(c: ClusterConfig, use_gpu: bool = True, engine_roles: list[str] | None = None,
                   producers: int = 1) -> list[Slot]:
    """Where each trainer rank, rollout engine, the router, external engines and the straw
    producers go (listed when there are 2 or more: one alone is the rollout manager).

    Models how create_pools() asks Ray: the training pool's bundles (one GPU each) are packed onto
    the nodes first, then the rollout pool's (one bundle of E GPUs per engine, whole on one node;
    an engine wider than a node takes whole nodes); colocated engines share the trainers' GPUs.
    `engine_roles` names each engine's group (prefill / decode under PD); default "engine".
    """
    gpn = max(c.num_gpus_per_node, 1)
    slots: list[Slot] = []
    n_train = c.num_trainer_ranks
    for rank in range(n_train):
        node, gpu = divmod(rank, gpn)
        slots.append(Slot("trainer", rank, node if use_gpu else 0, (gpu,) if use_gpu else ()))
    if c.external:
        for i, addr in enumerate(c.external_engine_addrs or []):
            slots.append(Slot("external", i, None, (), (), addr))
    else:
        e = c.rollout_num_gpus_per_engine
        roles = list(engine_roles or [])
        cursor = 0 if c.colocate else n_train  # the next free GPU, counted across nodes
        for i in range(c.num_engines):
            role = roles[i] if i < len(roles) else "engine"
            if not use_gpu:
                slots.append(Slot(role, i, 0, ()))
                continue
            if e <= gpn:
                node, first = divmod(cursor, gpn)
                if first + e > gpn:  # a bundle is whole on one node: skip to the next
                    node, first = node + 1, 0
                slots.append(Slot(role, i, node, tuple(range(first, first + e)), (node,)))
                cursor = node * gpn + first + e
            else:
                node = -(-cursor // gpn)  # wide engines take whole nodes
                span = -(-e // gpn)
                slots.append(Slot(role, i, node, tuple(range(gpn)), tuple(range(node, node + span))))
                cursor = (node + span) * gpn
    slots.append(Slot("router", 0, None, ()))
    if producers >= 2:  # each producer sits in an engine group's bundle (Runtime.producer_options)
        from slime.rollout.producers import producer_engine

        engines = [s for s in slots if s.role in ("engine", "prefill", "decode", "external")]
        for k in range(producers):
            j = producer_engine(k, producers, len(engines))
            beside = engines[j] if j < len(engines) else None
            near = None if beside is None or beside.role == "external" else beside.node
            slots.append(Slot("producer", k, near, (), (), "", j))
    return slots


_NAMES = {"trainer": ("trainer rank", "trainer ranks"), "engine": ("rollout engine", "rollout engines"),
          "prefill": ("prefill engine", "prefill engines"), "decode": ("decode engine", "decode engines"),
          "router": ("router", "router"), "external": ("external engine", "external engines"),
          "producer": ("straw producer", "straw producers")}


def _continues(run: list[Slot], s: Slot) -> bool:
    """`s` extends `run`: same role, next index, same node, the next GPUs, the same width."""
    last = run[-1]
    return (s.role == last.role and s.role in ("trainer", "engine", "prefill", "decode")
            and s.index == last.index + 1 and s.node is not None and s.node == last.node
            and len(s.nodes) <= 1 and len(last.nodes) <= 1 and len(s.gpus) == len(last.gpus)
            and (not s.gpus or s.gpus[0] == last.gpus[-1] + 1))  # no GPUs: CPU bundles on one node


def format_plan(slots: list[Slot]) -> list[str]:
    """One line per actor (`trainer rank 3   node 0 GPU 3`), consecutive actors of one role on one
    node folded into one line (`trainer ranks 0-7   node 0 GPU 0-7`): a 16-node plan stays readable,
    in `check` and on the page alike."""
    runs: list[list[Slot]] = []
    for s in slots:
        if runs and _continues(runs[-1], s):
            runs[-1].append(s)
        else:
            runs.append([s])
    lines = []
    for run in runs:
        first, last = run[0], run[-1]
        one, many = _NAMES[first.role]
        if first.role == "router":
            head, where = one, first.where()
        elif len(run) == 1:
            head, where = f"{one} {first.index}", first.where()
        else:
            width = len(first.gpus)
            each = f" ({width} GPUs each)" if width > 1 else ""
            head = f"{many} {first.index}-{last.index}"
            where = (f"node {first.node} GPU {first.gpus[0]}-{last.gpus[-1]}{each}" if width
                     else f"node {first.node}, a CPU bundle each")
        lines.append(f"{head:<22} {where}")
    return lines


# --- the parallel layout of the trainer ranks ---------------------------------------------------

ORDER = "tp-cp-ep-dp-pp"  # megatron-core's default (initialize_model_parallel), fastest-varying first


@dataclass(frozen=True)
class RankLayout:
    """Where one global trainer rank sits in each parallel dimension (Megatron backend)."""

    rank: int
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int  # expert-parallel rank (expert layers; carved out of DP x CP)
    edp: int  # expert-data-parallel rank: ranks holding the same experts


def parallel_layout(megatron: dict, n_ranks: int) -> list[RankLayout]:
    """Each trainer rank's TP / CP / DP / PP / EP coordinates, as megatron-core forms its process
    groups from the global ranks (the Ray placement gives trainer actor i global rank i, packed
    node by node). Dense layers: rank = tp + TP·(cp + CP·(dp + DP·pp)); expert layers:
    rank = etp + ETP·(ep + EP·(edp + EDP·pp)), ETP = TP unless --expert-tensor-parallel-size.
    Raises ValueError when the sizes do not divide the ranks (validate() refuses that first)."""
    from slime.backends.megatron.model_args import parallel_kwargs

    par = parallel_kwargs(megatron)
    tp, pp = par["tensor_model_parallel_size"], par["pipeline_model_parallel_size"]
    cp, ep = par["context_parallel_size"], par["expert_model_parallel_size"]
    etp = par.get("expert_tensor_parallel_size") or tp
    dp = data_parallel_size(n_ranks, tp, pp, cp)
    edp = expert_data_parallel_size(n_ranks, etp, ep, pp)
    if not dp or not edp:
        raise ValueError(f"{n_ranks} trainer ranks do not divide into TP {tp} x CP {cp} x PP {pp} "
                         f"(experts: ETP {etp} x EP {ep} x PP {pp})")
    out = []
    for r in range(n_ranks):
        t, rest = r % tp, r // tp
        c, rest = rest % cp, rest // cp
        d, p = rest % dp, rest // dp
        e_rest = r // etp
        e, e_rest = e_rest % ep, e_rest // ep
        out.append(RankLayout(r, t, c, d, p, e, e_rest % edp))
    return out


def format_layout(layout: list[RankLayout], limit: int = 32) -> list[str]:
    """One line per trainer rank (the first `limit`, then how many more)."""
    if not layout:
        return []
    dims = {k: 1 + max(getattr(x, k) for x in layout) for k in ("tp", "cp", "dp", "pp", "ep")}
    lines = [f"TP {dims['tp']} x CP {dims['cp']} x PP {dims['pp']} x DP {dims['dp']}"
             + (f"; experts EP {dims['ep']}" if dims["ep"] > 1 else "") + f" (megatron-core order {ORDER})"]
    for x in layout[:limit]:
        exp = f"  EP {x.ep}" if dims["ep"] > 1 else ""
        lines.append(f"trainer rank {x.rank:<4} TP {x.tp}  CP {x.cp}  PP {x.pp}  DP {x.dp}{exp}")
    if len(layout) > limit:
        lines.append(f"... and {len(layout) - limit} more ranks in the same order")
    return lines
