"""Weight sync over Mooncake's transfer engine (TCP, P2P handshake on 127.0.0.1): buckets land in
buffers each engine registered once, the post-sync log-prob check passes, an engine killed
mid-sync is dropped from that sync and comes back re-registered at the current version, and a
transfer that keeps failing to a live engine names it after a bounded number of tries."""

from __future__ import annotations

import time

import httpx
import pytest
import torch

pytest.importorskip("mooncake.engine", exc_type=ImportError)

from slime.sync.mooncake import bucket_layout, unpack  # noqa: E402
from tests.refusal_codes import has  # noqa: E402
from tests.runtime.conftest import tiny_flags  # noqa: E402


def test_bucket_layout_round_trips_every_dtype():
    bucket = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(7, dtype=torch.int64)}
    size, meta = bucket_layout(bucket)
    assert size == 48 + 16 + 56 and all(m["offset"] % 16 == 0 for m in meta)
    buf = torch.empty(size, dtype=torch.uint8)
    for m, t in zip(meta, bucket.values()):
        buf[m["offset"]:m["offset"] + m["nbytes"]].copy_(t.contiguous().view(-1).view(torch.uint8))
    out = unpack(buf, meta)
    assert all(torch.equal(out[k], v) for k, v in bucket.items())


def test_mooncake_flags_are_checked_before_start(tiny, tmp_path):
    from slime.args import parse_args, validate

    ok = parse_args(tiny_flags(tiny, tmp_path, "--update-weight-transport", "mooncake", "--num-rollout", "1"))
    assert ok.sync.transport == "mooncake" and ok.sync.mooncake_protocol == "tcp" and not validate(ok)
    errors = validate(parse_args(tiny_flags(tiny, tmp_path, "--mooncake-protocol", "rdma")))
    assert has(errors, "args.mooncake_flags"), errors
    errors = validate(parse_args(tiny_flags(tiny, tmp_path, "--update-weight-transport", "mooncake",
                                            "--rollout-backend", "sglang")))
    assert has(errors, "args.mooncake_sglang"), errors


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_mooncake_sync_survives_an_engine_killed_mid_sync_and_names_a_failing_engine(tiny, ray_cluster, tmp_path):
    import ray

    from slime.args import parse_args
    from slime.ray.runtime import Runtime
    from slime.sync.mooncake import MooncakeError

    flags = tiny_flags(tiny, tmp_path, "--num-rollout", "3", "--update-weight-transport", "mooncake",
                       "--update-weight-buffer-size", "65536", "--use-fault-tolerance",
                       "--rollout-health-check-interval", "0.5", "--rollout-health-check-timeout", "10")
    flags[flags.index("--rollout-num-gpus") + 1] = "2"
    rt = Runtime.start(parse_args(flags))
    try:
        mc = rt.sync.mooncake
        assert rt.sync.transport == "mooncake" and mc.registrations == 2
        assert all(d <= 1e-4 for d in rt.sync.last_check.values()) and len(rt.sync.last_check) == 2
        samples, _ = rt.generate(0)
        rt.train(rt.build_records(samples))
        before = mc.transfers
        rt.sync_weights()  # buffers stay registered: no new registration, one transfer per bucket per engine
        buckets = len(ray.get(rt.trainers[0].mooncake_prepare.remote(65536, "tcp", "")))
        assert buckets > 1 and mc.registrations == 2 and mc.transfers - before == 2 * buckets
        assert {httpx.get(h.url + "/model_info").json()["weight_version"] for h in rt.engines} == {str(rt.version)}

        # An engine killed between two buckets: the sync finishes on the other engine; the monitor
        # restarts the dead one, which registers its buffers anew and catches up to the version.
        samples, _ = rt.generate(1)
        rt.train(rt.build_records(samples))
        victim = rt.engines[0]
        mc.on_bucket = lambda b: ray.kill(victim.actor) if b == 1 else None
        rt.sync_weights()
        mc.on_bucket = None
        assert rt.sync.dropped == {victim.url}
        assert rt.sync.last_check.keys() >= {rt.engines[1].url}
        deadline = time.monotonic() + 120
        while rt.monitor.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rt.monitor.restarts == 1, rt.monitor.errors
        new = rt.engines[0]
        assert new.url != victim.url and mc.registrations == 3
        assert new.client.model_info()["weight_version"] == str(rt.version)
        samples, _ = rt.generate(2)
        assert len(samples) == 16 and {s.weight_version for s in samples} == {str(rt.version)}

        # A live engine whose transfers keep failing: bounded retries, then an error naming it.
        mc.registered[new.url].session_id = "127.0.0.1:1"
        mc.backoff_s = 0.01
        failed = mc.failed_transfers
        samples, _ = rt.generate(3)  # a newly trained version to push (syncing the served version is a no-op)
        rt.train(rt.build_records(samples))
        with pytest.raises(MooncakeError, match=new.url.replace(".", r"\.")):
            rt.sync_weights()
        assert mc.failed_transfers - failed == mc.retries + 1
        assert new.client.health()  # generation was continued after the failed sync
    finally:
        rt.shutdown()
