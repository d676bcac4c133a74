"""tools/install_wheels.sh: a second wheel set installed into the same --target keeps the first
set's console scripts and packages (pip's own --upgrade --target replaced bin/ whole, and the GPU
machine lost the `ray` command when tilelang's set came second). Real pip, real wheels made here."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _wheel(folder: Path, name: str, version: str, script: str, body: str = "") -> Path:
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n{body}".encode(),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{name}-{version}.dist-info/entry_points.txt": f"[console_scripts]\n{script} = {name}:main\n".encode(),
    }
    digest = {n: "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
              for n, d in files.items()}
    record = "".join(f"{n},{digest[n]},{len(d)}\n" for n, d in files.items()) + f"{name}-{version}.dist-info/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{name}-{version}.dist-info/RECORD", record)
    return path


def _install(target: Path, *wheels: Path) -> None:
    subprocess.run(["bash", str(ROOT / "tools" / "install_wheels.sh"), str(target), *map(str, wheels)],
                   check=True, cwd=ROOT, env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})


def _import_version(target: Path, name: str) -> str:
    return subprocess.run([sys.executable, "-c", f"import {name}; print({name}.VERSION)"], check=True, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(target)}).stdout.strip()


def test_a_second_wheel_set_keeps_the_first_sets_commands_and_packages(tmp_path):
    target = tmp_path / "site"
    first, second = tmp_path / "call1", tmp_path / "call2"
    first.mkdir()
    second.mkdir()
    _install(target, _wheel(first, "rayish", "1.0", "rayish"), _wheel(first, "keepme", "1.0", "keepme"))
    _install(target, _wheel(second, "tileish", "0.1", "tileish"), _wheel(second, "keepme", "2.0", "keepme"))
    assert sorted(p.name for p in (target / "bin").iterdir()) == ["keepme", "rayish", "tileish"]
    assert _import_version(target, "rayish") == "1.0" and _import_version(target, "tileish") == "0.1"
    assert _import_version(target, "keepme") == "2.0"  # a newer wheel of a package replaces it
    assert not list(tmp_path.glob("site.new.*"))  # the staging folder is gone


def test_pips_own_upgrade_target_loses_the_first_sets_commands(tmp_path):
    """Why the script exists: the plain pip command the GPU scripts used before."""
    target = tmp_path / "site"
    for folder, name in (("call1", "rayish"), ("call2", "tileish")):
        (tmp_path / folder).mkdir()
        wheel = _wheel(tmp_path / folder, name, "1.0", name)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                        "--target", str(target), str(wheel)], check=True)
    assert sorted(p.name for p in (target / "bin").iterdir()) == ["tileish"]
