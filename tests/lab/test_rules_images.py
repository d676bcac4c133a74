"""docker/images.yaml: the known images, and the default one present."""
from __future__ import annotations

from lab.core.experiment import Experiment
from lab.core.images import all_images, get_image


def test_default_image_is_known():
    assert get_image(Experiment().install.image) is not None


def test_images_cover_hopper_blackwell_ampere_and_cpu():
    images = all_images()
    assert 3 <= len(images) <= 5
    families = {im.gpu_family for im in images.values()}
    assert {"hopper", "blackwell", "ampere"} <= families
    ampere = next(im for im in images.values() if im.gpu_family == "ampere")
    assert ampere.fp8 is False and ampere.gpu_memory_gib > 0


def test_unknown_image_is_none():
    assert get_image("nope:latest") is None
