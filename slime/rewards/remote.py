"""``--rm-type remote_rm``: a reward model behind HTTP (``--rm-url``).

One JSON POST per sample: ``{"prompt", "response", "label", "metadata"}``. The reply is a number,
or an object whose ``score`` (else ``reward``) is one. Each request has ``--rm-timeout`` seconds;
a connection error, a timeout or an HTTP 5xx / 429 is retried up to ``--rm-max-retries`` times with
a short backoff. A reply that is not a number (or a 4xx) is not retried: it will not get better.
The error that ends the run names the URL, the sample and the last cause.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from slime.rewards.answer import split_after_think
from slime.rewards.math_reward import RewardResult


class RemoteRewardError(RuntimeError):
    """The reward model did not score a sample."""


def _score_of(body: Any) -> float:
    if isinstance(body, bool):
        raise ValueError(f"reply {body!r} is not a number")
    if isinstance(body, (int, float)):
        return float(body)
    if isinstance(body, dict):
        for key in ("score", "reward"):
            if key in body:
                return _score_of(body[key])
    raise ValueError(f"reply {str(body)[:200]!r} is neither a number nor an object with 'score' or 'reward'")


class RemoteRewardModel:
    """Callable like the built-in rewards; ``sample`` (when given) adds prompt and metadata."""

    wants_sample = True

    def __init__(self, url: str, timeout: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5):
        self.url, self.timeout, self.max_retries, self.backoff_s = url, timeout, max_retries, backoff_s

    def __call__(self, response: str, label: object, sample: Any = None) -> RewardResult:
        payload = {"prompt": getattr(sample, "prompt", None), "response": response, "label": label,
                   "metadata": getattr(sample, "metadata", None)}
        data = json.dumps(payload, default=str).encode()
        who = sample.describe() if sample is not None and hasattr(sample, "describe") else f"response {response[:60]!r}"
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff_s * attempt)
            req = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as reply:
                    raw = reply.read()
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code} {e.reason}"
                if e.code < 500 and e.code != 429:
                    break  # the request itself is wrong: retrying cannot help
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
                continue
            try:
                return RewardResult(_score_of(json.loads(raw)), "remote", split_after_think(response)[1])
            except ValueError as e:  # includes JSON decode errors
                last = f"unusable reply: {e}"
                break
        raise RemoteRewardError(f"--rm-url {self.url}: no reward for {who} after {attempt + 1} attempt(s) "
                                f"(--rm-timeout {self.timeout:g} s, --rm-max-retries {self.max_retries}): {last}")
