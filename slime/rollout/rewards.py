"""Scoring samples: the built-in registry (--rm-type) or a custom hook (--custom-rm-path,
optionally --group-rm), both from slime/rewards. A failing hook raises HookError naming the
hook path and the sample."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from slime.data.sample import Sample

if TYPE_CHECKING:
    from slime.rewards import RewardResult


class RewardScorer:
    def __init__(self, rm_type: str | None, custom_rm_path: str | None, group_rm: bool,
                 reward_key: str | None, hook_args: Any = None, rm_url: str | None = None,
                 rm_timeout: float = 60.0, rm_max_retries: int = 3):
        from slime.rewards import make_reward_fn
        from slime.rewards.hooks import load_function

        self.rm_type, self.group_rm, self.reward_key, self.hook_args = rm_type, group_rm, reward_key, hook_args
        self.hook: Callable[..., Any] | None = None
        self.builtin: Callable[..., RewardResult] | None = None  # (response, label[, sample=]) -> result
        if custom_rm_path:
            self.hook = load_function(custom_rm_path, kind="group_reward" if group_rm else "reward")
        else:
            assert rm_type is not None  # validate() asks for --rm-type or --custom-rm-path
            self.builtin = make_reward_fn(rm_type, rm_url, rm_timeout, rm_max_retries)

    def score(self, samples: list[Sample], n: int) -> dict[str, float]:
        """Sets sample.reward (and reward_info); returns rollout/ reward metrics."""
        from slime.rewards import summarize_reward_results
        from slime.rewards.answer import split_after_think
        from slime.rewards.hooks import call_reward_hook

        builtin, hook = self.builtin, self.hook
        if builtin is not None:
            if getattr(builtin, "wants_sample", False):  # remote: prompt and metadata, requests in parallel
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max(1, min(16, len(samples)))) as pool:
                    results = list(pool.map(lambda s: builtin(s.response, s.label, sample=s), samples))
            else:
                results = [builtin(s.response, s.label) for s in samples]
            for s, r in zip(samples, results):
                s.reward = float(r.score)
                s.reward_info = {"reason": r.reason, "has_think_block": r.has_think_block}
            return summarize_reward_results(results)
        assert hook is not None  # no builtin: the custom hook
        if self.group_rm:
            for g in range(0, len(samples), n):
                group = samples[g:g + n]
                for s, v in zip(group, call_reward_hook(hook, group, reward_key=self.reward_key,
                                                        args=self.hook_args, index=g // n)):
                    s.reward = float(v)
        else:
            for s in samples:
                s.reward = float(call_reward_hook(hook, s, reward_key=self.reward_key, args=self.hook_args))
        no_think = sum(not split_after_think(s.response)[1] for s in samples) / max(len(samples), 1)
        return {"rollout/reward_mean": sum(s.reward or 0.0 for s in samples) / max(len(samples), 1),  # all set above
                "rollout/no_think_block_ratio": no_think}
