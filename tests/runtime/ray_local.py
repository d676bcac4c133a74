"""Start the tests' private Ray instance on 127.0.0.1, robust to a loaded machine.

``ray.init`` waits a fixed 30 s for its raylet to register (ray/_private/node.py) and fails with
"The current node timed out during startup" when the 2 CI cores are busy (a torchrun job or
another Ray test's actors still exiting). That is load, not a broken test: shut the half-started
instance down and try again, a few times, before failing with the last error.
"""
from __future__ import annotations

import time
from typing import Any


def start_local_ray(ray: Any, pythonpath: str, attempts: int = 3, **options: Any) -> None:
    kw = dict(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
              log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    kw.update(options)
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kw)
            return
        except Exception as e:  # noqa: BLE001 - Ray raises bare Exception/TimeoutError/ConnectionError here
            ray.shutdown()  # a half-started head (GCS, raylet) must not survive into the next try
            if attempt == attempts:
                raise RuntimeError(f"ray.init failed {attempts} times; last error: {e}") from e
            print(f"[ray_local] ray.init attempt {attempt} failed ({type(e).__name__}: {e}); retrying", flush=True)
            time.sleep(5 * attempt)
