"""One typed record that travels through every stage: prompt -> engine -> reward -> batch.

Why one record: the rollout manager, the reward hooks, the batch builder and the metrics all read
the same fields, so a field has one name and one meaning everywhere (style.md: "one typed object").
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """How the engine finished the sample (mirrors SGLang's finish_reason.type)."""

    PENDING = "pending"
    COMPLETED = "completed"  # finish_reason "stop": EOS or a stop token
    TRUNCATED = "truncated"  # finish_reason "length": hit max_new_tokens
    ABORTED = "aborted"  # finish_reason "abort": partial output kept


FINISH_TO_STATUS = {"stop": Status.COMPLETED, "length": Status.TRUNCATED, "abort": Status.ABORTED}


@dataclass
class Sample:
    """One response to one prompt.

    `prompt_id` is the prompt's line index in the data set: it identifies the prompt across
    epochs and resumes (tests compare the sequence of prompt ids of two runs).
    `group_index` is the position of the prompt inside its rollout batch; the n samples of a
    prompt share it, and group normalization relies on it.
    """

    prompt_id: int
    group_index: int
    prompt: str | list[dict[str, Any]]
    prompt_tokens: list[int]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    # Filled by the engine.
    response: str = ""
    response_tokens: list[int] = field(default_factory=list)
    # Log-probs of the response tokens under the engine, at the sampling temperature.
    rollout_log_probs: list[float] = field(default_factory=list)
    status: Status = Status.PENDING
    weight_version: str = ""  # the engine's weight version when the last segment finished
    # Partial rollout: the weight version that generated each response token (a resumed sample
    # mixes versions), and the loss mask the manager derives from it (None: every token trains).
    token_versions: list[int] = field(default_factory=list)
    loss_mask: list[int] | None = None
    # Filled by the reward step. `reward` is the raw scalar kept for logging; advantages are
    # computed from it by slime.data.batch_builder and never stored back here.
    reward: float | None = None
    reward_info: dict[str, Any] = field(default_factory=dict)
    # "r<rollout id>/g<group index>/s<k>": unique within a run, set when the rollout's batch is drawn,
    # so the straw producers' copies of a sample can be told apart from duplicates.
    sample_id: str = ""

    @property
    def tokens(self) -> list[int]:
        return list(self.prompt_tokens) + list(self.response_tokens)

    @property
    def response_length(self) -> int:
        return len(self.response_tokens)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (partial-rollout buffer in checkpoints, straw queue payloads)."""
        from dataclasses import asdict

        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sample":
        d = dict(d)
        d["status"] = Status(d.get("status", "pending"))
        return cls(**d)

    def describe(self) -> str:
        """A short identification for error messages (which sample broke a hook)."""
        prompt = self.prompt if isinstance(self.prompt, str) else str(self.prompt)
        return f"prompt_id={self.prompt_id} group={self.group_index} prompt={prompt[:60]!r}"
