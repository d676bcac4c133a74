"""tools/build_device_wheels.py trims a wheel so pip still accepts it (real zip files, no network)."""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import build_device_wheels as bdw  # noqa: E402


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _wheel(path: Path) -> None:
    files = {"ray/__init__.py": b"x = 1\n", "ray/jars/ray_dist.jar": b"J" * 4096, "ray/core.py": b"y = 2\n"}
    record = "".join(f"{n},{_hash(d)},{len(d)}\n" for n, d in files.items())
    record += "ray-9.dist-info/RECORD,,\nother.dist-info/INSTALLER,sha256=abc,1\n"  # a path the wheel lacks
    with zipfile.ZipFile(path, "w") as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr("ray-9.dist-info/RECORD", record)


def test_trimmed_wheel_drops_the_java_jar_and_its_record_line(tmp_path):
    src, dst = tmp_path / "ray-9-py3-none-any.whl", tmp_path / "out" / "ray-9-py3-none-any.whl"
    dst.parent.mkdir()
    _wheel(src)
    assert bdw.trim_wheel(src, dst) == ["ray/jars/ray_dist.jar"]
    with zipfile.ZipFile(dst) as z:
        assert "ray/jars/ray_dist.jar" not in z.namelist()
        assert "ray_dist.jar" not in z.read("ray-9.dist-info/RECORD").decode()
        assert z.read("ray/core.py") == b"y = 2\n"
    bdw.verify_record(dst)


def test_verify_record_catches_a_changed_member(tmp_path):
    src, trimmed = tmp_path / "ray-9-py3-none-any.whl", tmp_path / "trimmed.whl"
    _wheel(src)
    bdw.trim_wheel(src, trimmed)
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(trimmed) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, b"changed" if info.filename == "ray/core.py" else zin.read(info.filename))
    with pytest.raises(ValueError, match="ray/core.py"):
        bdw.verify_record(bad)
    with pytest.raises(ValueError, match="dropped"):
        bdw.verify_record(src)  # untrimmed: the jar is still listed
