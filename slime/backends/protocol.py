"""The interface every trainer backend implements; the Ray trainer actor (slime/ray/actors.py)
speaks only this, so a backend is a registry entry (slime/backends/registry.py), never a special
case in the runtime.

Records are `slime.data.train_data.TrainRecord`; the loss is `slime.training.loss` for every
backend (`slime.training.loss.from_runtime` translates the runtime's flags once, for all of them).
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class TrainerBackend(Protocol):
    """One trainer rank. `build` runs inside the rank's process, after the placement is known."""

    resume_state: dict[str, Any]  # the runtime state of --load ({} when fresh), set by `build`

    @classmethod
    def build(cls, cfg: Any, rank: int, world_size: int, master: tuple[str, int]) -> "TrainerBackend":
        """Join the rank's process groups (formed from the placement: `master` is rank 0's
        address), build the model from --load / --ref-load / --hf-checkpoint, and the reference
        model when the KL term needs one. Returns the runtime state of --load ({} when fresh)."""

    def log_probs(self, records: list, use_ref: bool = False) -> list[list[float]]:
        """Response-token log-probs at the rollout temperature (policy, or reference)."""

    def train(self, records: list, num_steps: int) -> dict[str, float]:
        """num_steps optimizer steps over one rollout's records; train/* metrics."""

    def export_buckets(self, buffer_size: int, device: str = "cpu") -> Iterator[dict[str, Any]]:
        """The weights under the engines' (HF) names, in buckets of <= buffer_size bytes, on
        `device` ("cpu", or "cuda" for a hand-over without a host copy). A backend whose ranks
        hold shards sets the class attribute `collective = True`: then every rank iterates
        (collectives inside), rank 0 gets every tensor once and the others nothing; `log_probs`
        is then collective too. Without it, rank 0 alone is asked."""

    def named_weights(self) -> dict[str, Any]:
        """Every weight under the engines' (HF) names, as tensors; collective like
        `export_buckets` (ranks other than 0 of a collective backend get {})."""

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        """Checkpoint under root/iter_NNNNNNN with the runtime `state`; collective."""

    def offload(self) -> dict[str, float]:
        """Give the accelerator back while rollout runs (parameters, gradients, optimizer).
        Returns memory figures (GiB) measured around it."""

    def onload(self) -> dict[str, float]:
        """Take the accelerator again before training. Returns memory figures (GiB)."""

    def memory(self) -> dict[str, float]:
        """Allocated / peak accelerator memory of this rank (GiB); {} on CPU."""


class CriticBackend(Protocol):
    """One critic rank of --advantage-estimator ppo (a registry entry's `critic`): a value model on
    a copy of the policy's architecture. Its ranks are Ray actors placed beside the trainer ranks
    and form their own process group."""

    @classmethod
    def build(cls, cfg: Any, rank: int, world_size: int, master: tuple[str, int]) -> "CriticBackend":
        """Join the critic ranks' process group and build the value model from --critic-load (or
        <--load>_critic when resuming), else from the policy's initial weights."""

    def values(self, records: list) -> list[list[float]]:
        """Per response token, the value of the state before that token (no gradient)."""

    def train(self, records: list, num_steps: int) -> dict[str, float]:
        """num_steps optimizer steps of the clipped value loss toward `record.returns`, with
        `record.values` as the pre-update values; critic/* metrics."""

    def save(self, root: str, iteration: int, state: dict[str, Any]) -> str:
        """Checkpoint under root/iter_NNNNNNN (same layout as the trainer's); collective."""

    def offload(self) -> dict[str, float]:
        """--offload-train: give the accelerator back while rollout runs; memory figures (GiB)."""

    def onload(self) -> dict[str, float]:
        """Take the accelerator again before training."""
