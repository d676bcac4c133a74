"""Scoring samples: the built-in registry (--rm-type) or a custom hook (--custom-rm-path,
optionally --group-rm), both from slime/rewards. A failing hook raises HookError naming the
hook path and the sample."""

from __future__ import annotations

from typing import Any

from slime.data.sample import Sample


class RewardScorer:
    def __init__(self, rm_type: str | None, custom_rm_path: str | None, group_rm: bool,
                 reward_key: str | None, hook_args: Any = None, rm_url: str | None = None,
                 rm_timeout: float = 60.0, rm_max_retries: int = 3):
        from slime.rewards import make_reward_fn
        from slime.rewards.hooks import load_function

        self.rm_type, self.group_rm, self.reward_key, self.hook_args = rm_type, group_rm, reward_key, hook_args
        self.hook = None
        self.builtin = None
        if custom_rm_path:
            self.hook = load_function(custom_rm_path, kind="group_reward" if group_rm else "reward")
        else:
            self.builtin = make_reward_fn(rm_type, rm_url, rm_timeout, rm_max_retries)

    def score(self, samples: list[Sample], n: int) -> dict[str, float]:
        """Sets sample.reward (and reward_info); returns rollout/ reward metrics."""
        from slime.rewards import summarize_reward_results
        from slime.rewards.answer import split_after_think
        from slime.rewards.hooks import call_reward_hook

        if self.builtin is not None:
            if getattr(self.builtin, "wants_sample", False):  # remote: prompt and metadata, requests in parallel
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max(1, min(16, len(samples)))) as pool:
                    results = list(pool.map(lambda s: self.builtin(s.response, s.label, sample=s), samples))
            else:
                results = [self.builtin(s.response, s.label) for s in samples]
            for s, r in zip(samples, results):
                s.reward = float(r.score)
                s.reward_info = {"reason": r.reason, "has_think_block": r.has_think_block}
            return summarize_reward_results(results)
        if self.group_rm:
            for g in range(0, len(samples), n):
                group = samples[g:g + n]
                for s, v in zip(group, call_reward_hook(self.hook, group, reward_key=self.reward_key,
                                                        args=self.hook_args, index=g // n)):
                    s.reward = float(v)
        else:
            for s in samples:
                s.reward = float(call_reward_hook(self.hook, s, reward_key=self.reward_key, args=self.hook_args))
        no_think = sum(not split_after_think(s.response)[1] for s in samples) / max(len(samples), 1)
        return {"rollout/reward_mean": sum(s.reward for s in samples) / max(len(samples), 1),
                "rollout/no_think_block_ratio": no_think}
