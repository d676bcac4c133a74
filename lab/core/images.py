"""Load `docker/images.yaml`: the installation images this repository builds and the hardware they target.

One home for image facts (pinned build versions, GPU family, GPU memory, FP8 / INT4 support); the
rules, the memory estimate, provenance, `rayjob.yaml` and `docker/build.sh` read them through here.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, computed_field

IMAGES_FILE = Path(__file__).resolve().parents[2] / "docker" / "images.yaml"


class Image(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str = Field(description="Docker image reference (install.image).")
    name: str = Field(description="What the selector shows.")
    dockerfile: str = Field(description="The Dockerfile that builds it, relative to the checkout.")
    build: dict[str, str] = Field(description="Build arguments: the versions pinned for this image.")
    cuda: str | None = None
    gpu_family: str = Field(description="hopper, blackwell, ampere or cpu.")
    compute_capability: str | None = None
    gpus: list[str] = Field(default_factory=list)
    gpu_memory_gib: float = Field(description="Memory of the smallest target GPU, GiB (0 for CPU).")
    fp8: bool = Field(description="FP8 rollout / FP8 KV cache / FP8 training hardware and kernels.")
    int4: bool = Field(description="Weight-only INT4 rollout kernels.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sglang(self) -> str | None:
        return self.build.get("SGLANG")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def megatron_core(self) -> str | None:
        return self.build.get("MEGATRON_CORE")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def torch(self) -> str | None:
        return self.build.get("TORCH")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ray(self) -> str | None:
        return self.build.get("RAY")

    def packages(self) -> dict[str, str]:
        """Python distribution name -> the version this image pins (build args that name a package)."""
        return {dist: self.build[arg] for arg, dist in BUILD_ARG_PACKAGES.items() if arg in self.build}


# Build arguments that pin a Python distribution (the rest pick base images and CUDA targets).
BUILD_ARG_PACKAGES: dict[str, str] = {
    "TORCH": "torch",
    "SGLANG": "sglang",
    "SGLANG_ROUTER": "sglang-router",
    "MEGATRON_CORE": "megatron-core",
    "TRANSFORMERS": "transformers",
    "RAY": "ray",
    "FLASH_LINEAR_ATTENTION": "flash-linear-attention",
    "MOONCAKE": "mooncake-transfer-engine",
}


class ImageError(ValueError):
    pass


@lru_cache(maxsize=1)
def all_images() -> dict[str, Image]:
    data = yaml.safe_load(IMAGES_FILE.read_text(encoding="utf-8"))
    try:
        images = [Image.model_validate(x) for x in data["images"]]
    except Exception as exc:
        raise ImageError(f"{IMAGES_FILE}: {exc}") from exc
    return {im.tag: im for im in images}


def get_image(tag: str) -> Image | None:
    """The image with this tag, or None for an image the lab does not know."""
    return all_images().get(tag)
