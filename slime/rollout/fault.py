"""Engine fault handling (--use-fault-tolerance): a health monitor thread in the driver.

Every --rollout-health-check-interval seconds (after --rollout-health-check-first-wait) each
engine slime owns is probed with GET /health_generate (timeout --rollout-health-check-timeout).
An engine that fails is replaced: deregistered from the router, its actor killed, a new actor
started in the same placement bundle, brought to the current weight version, registered again.
Requests it had in flight were dropped with its connection; the router retried them on the other
engines (or on the replacement), so no sample is lost. External engines are probed but never
restarted (another deployment owns them, SGL-9): their failure is reported.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from slime.config import FaultConfig


class HealthMonitor:
    def __init__(self, cfg: FaultConfig, engines: Callable[[], list], restart: Callable[[int], None],
                 log: Callable[[str], None] = lambda m: print(m, flush=True)):
        self.cfg, self.engines, self.restart, self.log = cfg, engines, restart, log
        self.stop_event = threading.Event()
        self.restarts = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="engine-health")

    def start(self) -> "HealthMonitor":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=self.cfg.health_check_timeout + 5)

    def check_once(self) -> None:
        for i, h in enumerate(list(self.engines())):
            if self.stop_event.is_set():
                return
            if h.client.health_generate(self.cfg.health_check_timeout):
                continue
            if h.actor is None:
                msg = f"[slime] external engine {h.url} failed its health check; slime does not restart external engines"
                self.errors.append(msg)
                self.log(msg)
                continue
            self.log(f"[slime] engine {i} ({h.url}) failed its health check: restarting it")
            t0 = time.monotonic()
            try:
                self.restart(i)
                self.restarts += 1
                self.log(f"[slime] engine {i} restarted and re-synced in {time.monotonic() - t0:.1f} s")
            except Exception as e:  # noqa: BLE001 - keep monitoring; the next round tries again
                self.errors.append(f"engine {i}: restart failed: {e!r}")
                self.log(f"[slime] engine {i}: restart failed: {e!r}")

    def _run(self) -> None:
        if self.stop_event.wait(self.cfg.health_check_first_wait):
            return
        while not self.stop_event.is_set():
            self.check_once()
            self.stop_event.wait(self.cfg.health_check_interval)
