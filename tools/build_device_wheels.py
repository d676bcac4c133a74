"""Build the wheel set a GPU machine without a package registry needs to run train.py on Ray.

The H200 image already has torch, transformers, safetensors, httpx, requests, pyyaml, jinja2 and
the other common packages (/work/.library/device/KINDS.md style lists say which). What it lacks is
Ray and the HTTP stack of the engines and router, plus megatron-core:

    ray (trimmed), jsonschema + jsonschema-specifications + referencing + rpds-py (Ray's),
    fastapi + starlette + uvicorn + pydantic + pydantic-core + annotated-types + typing-inspection,
    and what Ray's dashboard imports (its job server runs `ray job submit`): aiohttp + yarl +
    multidict + propcache + aiohttp-cors, colorful, opencensus, opentelemetry (api, sdk, proto,
    semantic conventions, prometheus exporter), googleapis-common-protos (google.rpc, which
    opencensus imports) with the protobuf runtime their generated code asks for, wcwidth, jsonpointer,
    rfc3339-validator, and flash-linear-attention (fla-core + einops) for the Qwen3.5 hybrid

Ray's wheel is ~79 MB, 32 MB of it ``ray/jars/ray_dist.jar`` (the Java worker), which Python never
loads. The trimmed wheel drops it and rewrites RECORD without its line, so pip installs it without
a hash error. megatron-core is copied from --megatron-wheel when given (it is built elsewhere).

    python3 tools/build_device_wheels.py --out .whl [--megatron-wheel path/to/megatron_core-*.whl]

Then on the GPU machine (see docs/en/megatron.md "GPU machine without a registry"):

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site

Qwen3.5 on Hopper (``--with-tilelang``): fla refuses the Gated DeltaNet's backward pass with Triton
>= 3.4.0 and < 3.7.1 on Hopper (the H200 image has 3.6.0) unless tilelang is installed. tilelang
0.1.15 (abi3, 47.3 MiB) needs apache-tvm-ffi (>=0.1.11,<0.1.13), torch-c-dlpack-ext and z3-solver
(>=4.13.0,<4.15.5; 27.9 MiB); its other requirements (cloudpickle, ml-dtypes, numpy, psutil, torch,
tqdm, typing-extensions) are on the image. Together that is more than one device call carries
(64 MiB with the working tree), so the set is split into call folders ``.whl/call1``,
``.whl/call2``, ... of at most ``--call-mib`` each (largest first), and ``plan.txt`` says which
to carry in which call. The calls install into the same ``/tmp/site`` of one warm machine (it is
given back 30 s after a call: make the calls back to back); the last one runs the tests:

    call 1 (carry .whl/call1): bash tools/install_wheels.sh /tmp/site .whl/call1/*.whl
    call 2 (carry .whl/call2): bash tools/run_gpu_tests.sh --part 3   # installs .whl/call*/ it finds

(tools/install_wheels.sh, not pip's own ``--upgrade --target``: that replaces the target's ``bin/``
whole, and a second set with commands of its own would take away the first set's ``ray``.)

``--lzma`` recompresses the members of wheels over 8 MiB with LZMA (pip reads any zip method the
stdlib reads; z3-solver: 27.9 -> 19.9 MiB, installed and imported), which can save a call.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# Pinned to what the runtime is tested with (CPU CI). Python 3.12, manylinux x86_64.
WHEELS = ["ray==2.60.0", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "referencing==0.37.0",
          "rpds-py==0.30.0", "fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.55.0", "pydantic==2.13.4",
          "pydantic-core==2.46.4", "annotated-types==0.7.0", "typing-inspection==0.4.2",
          # The Ray dashboard (`ray job submit` needs its job server): ray/dashboard/optional_deps.py
          # imports these; aiohttp and its helpers at the versions Ray 2.60 asks for.
          "aiohttp==3.14.5", "yarl==1.25.1", "multidict==7.2.1", "propcache==0.5.4", "aiohttp-cors==0.8.1",
          "colorful==0.5.8", "opencensus==0.11.4", "opencensus-context==0.1.3", "opentelemetry-api==1.45.2",
          "opentelemetry-sdk==1.45.2", "opentelemetry-semantic-conventions==0.66b2",
          "opentelemetry-exporter-prometheus==0.66b2", "opentelemetry-proto==1.45.2",
          # opencensus's trace module (the dashboard agent's exporter) imports google.rpc
          "googleapis-common-protos==1.76.0", "protobuf==7.36.2", "wcwidth==0.7.0", "jsonpointer==3.1.1", "rfc3339-validator==0.1.4",
          # Qwen3.5's Gated DeltaNet layers: megatron-core refuses to build them without fla (Triton kernels)
          "fla-core==0.6.0", "einops==0.8.2"]
# Qwen3.5's Gated DeltaNet backward on Hopper (fla's guard: Triton < 3.7.1 needs tilelang), pinned in
# the ranges tilelang 0.1.15's METADATA asks for (TILELANG_REQUIRES, as read from its wheel)
TILELANG_WHEELS = ["tilelang==0.1.15", "apache-tvm-ffi==0.1.12", "torch-c-dlpack-ext==0.1.5", "z3-solver==4.15.4.0"]
TILELANG_REQUIRES = {"apache-tvm-ffi": ">=0.1.11,<0.1.13", "torch-c-dlpack-ext": "", "z3-solver": ">=4.13.0,<4.15.5",
                     # on the H200 image already (/work/.library/device/KINDS.md package list)
                     "cloudpickle": "image", "ml-dtypes": "image", "numpy": "image", "psutil": "image", "torch": "image",
                     "tqdm": "image", "typing-extensions": "image"}
CALL_MIB = 56.0  # a call carries 64 MiB with the working tree (~4 MiB): leave room for it
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
DROP = ("ray/jars/",)  # Java worker jars: never imported by Python


def download(specs: list[str], dest: Path, python: str = "3.12") -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
           "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + specs, check=True)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def trim_wheel(src: Path, dst: Path, drop: tuple[str, ...] = DROP) -> list[str]:
    """Copy wheel `src` to `dst` without the members under `drop`; RECORD loses their lines.
    Returns the dropped member names."""
    dropped: list[str] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        for info in zin.infolist():
            if info.filename.startswith(drop):
                dropped.append(info.filename)
                continue
            if info.filename == record_name:
                continue
            zout.writestr(info, zin.read(info.filename))
        rows = list(csv.reader(io.StringIO(zin.read(record_name).decode())))
        kept = [r for r in rows if r and not r[0].startswith(drop)]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(kept)
        zout.writestr(record_name, buf.getvalue())
    return dropped


def verify_record(wheel: Path, drop: tuple[str, ...] = DROP) -> None:
    """What pip checks on install: each member listed in RECORD with a hash matches it, and
    nothing dropped is still listed. (Ray's own RECORD lists some paths its wheel does not hold;
    pip ignores those, and so does this check.)"""
    with zipfile.ZipFile(wheel) as z:
        record_name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        names = set(z.namelist())
        for row in csv.reader(io.StringIO(z.read(record_name).decode())):
            if not row:
                continue
            if row[0].startswith(drop):
                raise ValueError(f"{wheel.name}: RECORD still lists the dropped {row[0]}")
            if row[0] in names and len(row) > 1 and row[1] and _record_hash(z.read(row[0])) != row[1]:
                raise ValueError(f"{wheel.name}: {row[0]} does not match its RECORD hash")


def select(pins: list[str], drop: list[str]) -> list[str]:
    """``pins`` without the names in ``drop`` (each must name a pin: a typo is refused, not ignored)."""
    names = {p.split("==")[0].lower(): p for p in pins}
    unknown = [d for d in drop if d.lower() not in names]
    if unknown:
        raise SystemExit(f"--drop {unknown[0]}: not a pinned wheel (pinned: {', '.join(sorted(names))})")
    gone = {d.lower() for d in drop}
    return [p for p in pins if p.split("==")[0].lower() not in gone]


def plan_calls(sizes: dict[str, int], budget_bytes: int) -> list[list[str]]:
    """Split wheels (name -> bytes) into the fewest device calls this greedy finds: largest first,
    each into the first call with room. A wheel larger than one call is refused, by name."""
    calls: list[list[str]] = []
    used: list[int] = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        size = sizes[name]
        if size > budget_bytes:
            raise ValueError(f"{name} is {size / 2**20:.1f} MiB, more than one call carries "
                             f"(--call-mib {budget_bytes / 2**20:.0f}); try --lzma")
        for i, u in enumerate(used):
            if u + size <= budget_bytes:
                calls[i].append(name)
                used[i] += size
                break
        else:
            calls.append([name])
            used.append(size)
    return calls


def recompress_lzma(src: Path, dst: Path) -> None:
    """The same wheel (same members, same RECORD: its hashes are of the uncompressed bytes) with
    every member LZMA-compressed."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_LZMA) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename), compress_type=zipfile.ZIP_LZMA)


def write_calls(out: Path, wheels: list[Path], budget_bytes: int) -> list[list[str]]:
    """Move ``wheels`` into ``out/call1`` ... per :func:`plan_calls` and write ``out/plan.txt``."""
    calls = plan_calls({w.name: w.stat().st_size for w in wheels}, budget_bytes)
    by_name = {w.name: w for w in wheels}
    lines = []
    carry = out.name  # the folder the device call carries, as named relative to the checkout root
    for i, names in enumerate(calls, 1):
        d = out / f"call{i}"
        d.mkdir(parents=True, exist_ok=True)
        for n in names:
            shutil.move(str(by_name[n]), d / n)
        size = sum((d / n).stat().st_size for n in names)
        last = i == len(calls)
        lines.append(f"call {i}: carry {carry}/call{i} ({size / 2**20:.1f} MiB, {len(names)} wheels)"
                     + ("; then run the tests: bash tools/run_gpu_tests.sh --part N" if last else
                        f"; install only: bash tools/install_wheels.sh /tmp/site {carry}/call{i}/*.whl"))
    (out / "plan.txt").write_text("\n".join(lines) + "\n")
    return calls


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".whl", help="folder for the wheel set (git-ignored)")
    ap.add_argument("--megatron-wheel", help="a megatron_core-*.whl to copy into the set")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    ap.add_argument("--with-tilelang", action="store_true", help="add tilelang and its needs (Qwen3.5 on Hopper)")
    ap.add_argument("--call-mib", type=float, default=CALL_MIB, help="most MiB of wheels one device call carries")
    ap.add_argument("--lzma", action="store_true", help="LZMA-recompress wheels over 8 MiB (fewer calls)")
    ap.add_argument("--drop", action="append", default=[], metavar="NAME",
                    help="leave out a pinned wheel (e.g. ray: the GPU test parts never start Ray)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "_download"
    raw.mkdir(exist_ok=True)
    download(select(WHEELS + (TILELANG_WHEELS if a.with_tilelang else []), a.drop), raw, a.python)
    for w in sorted(raw.glob("*.whl")):
        target = out / w.name
        if w.name.startswith("ray-"):
            dropped = trim_wheel(w, target)
            verify_record(target)
            print(f"{w.name}: dropped {len(dropped)} member(s) ({', '.join(dropped)}); "
                  f"{w.stat().st_size / 2**20:.1f} MiB -> {target.stat().st_size / 2**20:.1f} MiB")
        elif a.lzma and w.stat().st_size > 8 * 2**20:
            recompress_lzma(w, target)
            print(f"{w.name}: LZMA {w.stat().st_size / 2**20:.1f} MiB -> {target.stat().st_size / 2**20:.1f} MiB")
        else:
            shutil.copy(w, target)
    shutil.rmtree(raw)
    if a.megatron_wheel:
        shutil.copy(a.megatron_wheel, out / Path(a.megatron_wheel).name)
    wheels = sorted(out.glob("*.whl"))
    total = sum(p.stat().st_size for p in wheels)
    print(f"{out}: {len(wheels)} wheels, {total / 2**20:.1f} MiB")
    budget = int(a.call_mib * 2**20)
    if total > budget:
        calls = write_calls(out, wheels, budget)
        print(f"more than one call carries: {len(calls)} calls (largest first), see {out / 'plan.txt'}")
        print((out / "plan.txt").read_text(), end="")


if __name__ == "__main__":
    main()
