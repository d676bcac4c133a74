"""Load `docker/images.yaml`: the known installation images and the hardware they target.

One home for image facts (versions, GPU family, GPU memory, FP8 / INT4 support); the rules, the
memory estimate and provenance read them through here.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

IMAGES_FILE = Path(__file__).resolve().parent.parent / "docker" / "images.yaml"


class Image(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str = Field(description="Docker image reference (install.image).")
    name: str = Field(description="What the selector shows.")
    cuda: str | None = None
    sglang: str | None = None
    megatron_core: str | None = None
    torch: str | None = None
    gpu_family: str = Field(description="hopper, blackwell, ampere or cpu.")
    compute_capability: str | None = None
    gpus: list[str] = Field(default_factory=list)
    gpu_memory_gib: float = Field(description="Memory of the smallest target GPU, GiB (0 for CPU).")
    fp8: bool = Field(description="FP8 rollout / FP8 KV cache / FP8 training hardware and kernels.")
    int4: bool = Field(description="Weight-only INT4 rollout kernels.")


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
