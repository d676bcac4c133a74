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


# --- tilelang (Qwen3.5 on Hopper) and wheel sets split over device calls ------------------------

MIB = 2**20


def test_tilelang_pins_meet_what_tilelang_asks_for():
    from packaging.specifiers import SpecifierSet

    pins = dict(w.split("==") for w in bdw.TILELANG_WHEELS)
    assert pins["tilelang"] == "0.1.15"
    for name, spec in bdw.TILELANG_REQUIRES.items():
        if spec == "image":  # on the H200 image: carried only for another version
            assert name not in pins
            continue
        assert name in pins, name
        assert pins[name] in SpecifierSet(spec), (name, pins[name], spec)


def test_a_set_larger_than_one_call_is_split_largest_first_within_the_budget():
    # sizes as downloaded (tilelang 0.1.15, z3-solver 4.15.4.0, the trimmed Ray, ...)
    sizes = {"tilelang.whl": int(47.3 * MIB), "z3.whl": int(27.9 * MIB), "ray.whl": int(30.1 * MIB),
             "tvm_ffi.whl": int(2.6 * MIB), "dlpack.whl": int(0.9 * MIB), "megatron.whl": int(3.0 * MIB),
             "small.whl": 200_000}
    budget = int(bdw.CALL_MIB * MIB)
    calls = bdw.plan_calls(sizes, budget)
    assert sorted(n for c in calls for n in c) == sorted(sizes)
    assert all(sum(sizes[n] for n in c) <= budget for c in calls)
    assert calls[0][0] == "tilelang.whl" and len(calls) == 3  # 47.3 + the small ones | 30.1 | 27.9
    assert bdw.plan_calls({"a.whl": 10, "b.whl": 20}, 100) == [["b.whl", "a.whl"]]


def test_a_wheel_larger_than_a_call_is_refused_by_name():
    with pytest.raises(ValueError, match=r"big.whl is 70.0 MiB, more than one call carries.*--lzma"):
        bdw.plan_calls({"big.whl": 70 * MIB}, int(bdw.CALL_MIB * MIB))


def test_write_calls_moves_the_wheels_into_call_folders_and_writes_the_plan(tmp_path):
    wheels = []
    for name, size in (("a-1-py3-none-any.whl", 40), ("b-1-py3-none-any.whl", 30), ("c-1-py3-none-any.whl", 20)):
        p = tmp_path / name
        p.write_bytes(b"x" * size)
        wheels.append(p)
    calls = bdw.write_calls(tmp_path / ".whl-tl", wheels, 60)  # the plan names the folder it was written to
    assert calls == [["a-1-py3-none-any.whl", "c-1-py3-none-any.whl"], ["b-1-py3-none-any.whl"]]
    assert sorted(p.name for p in (tmp_path / ".whl-tl" / "call1").iterdir()) == ["a-1-py3-none-any.whl", "c-1-py3-none-any.whl"]
    plan = (tmp_path / ".whl-tl" / "plan.txt").read_text().splitlines()
    assert plan[0].startswith("call 1: carry .whl-tl/call1") and "install only" in plan[0]
    assert plan[1].startswith("call 2: carry .whl-tl/call2") and "run_gpu_tests.sh" in plan[1]


def test_an_lzma_recompressed_wheel_installs_with_pip(tmp_path):
    """Real pip (no index, no network) installs the recompressed wheel and the module imports."""
    import subprocess

    files = {"lzpkg/__init__.py": b"VALUE = 42\n" + b"# padding\n" * 2000}
    dist = "lzpkg-1.0.dist-info/"
    meta = {dist + "METADATA": b"Metadata-Version: 2.1\nName: lzpkg\nVersion: 1.0\n",
            dist + "WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files.update(meta)
    record = "".join(f"{n},{_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{dist}RECORD,,\n"
    src = tmp_path / "src" / "lzpkg-1.0-py3-none-any.whl"
    src.parent.mkdir()
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(dist + "RECORD", record)
    dst = tmp_path / "lzpkg-1.0-py3-none-any.whl"
    bdw.recompress_lzma(src, dst)
    with zipfile.ZipFile(dst) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_LZMA}
    bdw.verify_record(dst)
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(site), str(dst)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import lzpkg; print(lzpkg.VALUE)"], capture_output=True, text=True,
                       timeout=60, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert r.stdout.strip() == "42", r.stderr


def test_drop_leaves_out_a_pinned_wheel_and_refuses_a_typo():
    pins = bdw.WHEELS + bdw.TILELANG_WHEELS
    kept = bdw.select(pins, ["ray", "Z3-Solver"])
    assert "ray==2.60.0" not in kept and not any(p.startswith("z3-solver") for p in kept)
    assert len(kept) == len(pins) - 2
    with pytest.raises(SystemExit, match="--drop rayy: not a pinned wheel"):
        bdw.select(pins, ["rayy"])
