"""The learning-rate schedule, by Megatron's flags: ``--lr-warmup-iters`` / ``--lr-warmup-fraction``,
``--lr-decay-style``, ``--lr-decay-iters``, ``--min-lr``. Counted in optimizer steps.

- warm-up: linear from 0 to ``--lr`` over the warm-up steps (after s steps: ``lr * s / warmup``);
- then decay from ``--lr`` to ``--min-lr`` until ``--lr-decay-iters`` (default: every optimizer
  step of the run): ``constant`` (no decay), ``linear``, ``cosine`` (half a cosine), or
  ``inverse-square-root`` (``lr * sqrt(warmup) / sqrt(s)``, floored at ``--min-lr``);
  Megatron's WSD style is refused by ``validate()``;
- after the decay steps: ``--min-lr``.

Pure (no torch): the embedded trainer wraps it in a LambdaLR; tests compare it with hand values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LRSchedule:
    lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    decay_steps: int = 1
    style: str = "constant"

    def __call__(self, step: int) -> float:
        """The learning rate of optimizer step ``step``: the number of steps already taken, as
        Megatron's scheduler counts (so with warm-up the very first step has lr 0)."""
        s = step
        if self.warmup_steps > 0 and s <= self.warmup_steps:
            return self.lr * s / self.warmup_steps
        if self.style == "constant":
            return self.lr
        if s > self.decay_steps:
            return self.min_lr
        if self.style == "inverse-square-root":
            warm = max(self.warmup_steps, 1)
            return max(self.min_lr, self.lr * math.sqrt(warm) / math.sqrt(max(s, 1)))
        span = max(self.decay_steps - self.warmup_steps, 1)
        ratio = (s - self.warmup_steps) / span
        if self.style == "linear":
            coeff = 1.0 - ratio
        elif self.style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:
            raise ValueError(f"unknown --lr-decay-style {self.style!r}")
        return self.min_lr + coeff * (self.lr - self.min_lr)


def from_optim(optim) -> LRSchedule:
    """The schedule of a runtime OptimConfig (``total_steps``: the run's optimizer steps)."""
    total = optim.total_steps or 1
    decay = optim.lr_decay_iters or total
    warmup = optim.lr_warmup_iters
    if optim.lr_warmup_fraction is not None:
        warmup = int(round(optim.lr_warmup_fraction * decay))
    return LRSchedule(lr=optim.lr, min_lr=optim.min_lr, warmup_steps=warmup, decay_steps=decay,
                      style=optim.lr_decay_style)
