"""straw: the persistent rollout queue (docs/en/rollout-queue.md).

Layout of --rollout-queue-dir DIR:
    DIR/index.json            the queue state, replaced atomically (tmp + fsync + rename + fsync dir)
    DIR/segments/000001.jsonl append-only payload segments, one record per line:
                              "<seq>\t<crc32 hex>\t<payload JSON>\n", fsync'ed before put() returns
    DIR/.lock                 flock: one process owns the queue at a time

Guarantees: a put() that returned is on disk and is delivered (pending()) until it is acked; an
acked record is never delivered again; sequence numbers are unique and contiguous. Recovery on
open: records that reached the segment but not the index (a crash between the two fsyncs) are
adopted once; a torn last record (a crash mid-write) is cut off, and that put() never returned.
Bytes missing below what the index committed mean the disk lost data: refused, never papered over.
The state belongs to one run id; a directory holding another run's state is refused.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import zlib
from pathlib import Path
from typing import Any, Iterator

from slime.refusals import declare

FORMAT = "straw-v1"
INDEX = "index.json"
SEGMENTS = "segments"

_R = declare("queue", {
    "index_unreadable": ("root", "index"),
    "other_run": ("root", "owner", "run_id"),
    "no_index": ("root", "index"),
    "in_use": ("root",),
    "format": ("path", "found", "expected"),
    "segment_short": ("path", "size", "committed"),
    "corrupt_at": ("path", "offset"),
    "corrupt_record": ("path", "seq"),
    "unknown_ack": ("seq",),
})


class QueueError(RuntimeError):
    pass


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _encode(seq: int, payload: Any) -> bytes:
    data = json.dumps(payload, separators=(",", ":"), default=str)
    return f"{seq}\t{zlib.crc32(data.encode()):08x}\t{data}\n".encode()


def _decode(line: bytes) -> tuple[int, Any] | None:
    """(seq, payload) of a whole, intact record line; None if torn or corrupt."""
    if not line.endswith(b"\n"):
        return None
    try:
        seq, crc, data = line[:-1].decode().split("\t", 2)
        if int(crc, 16) != zlib.crc32(data.encode()):
            return None
        return int(seq), json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None


def check_run_id(root: str | Path, run_id: str) -> None:
    """Pre-flight (nothing is created): DIR is empty, absent, or holds this run's state."""
    root = Path(root)
    index = root / INDEX
    if index.exists():
        try:
            owner = json.loads(index.read_text()).get("run_id")
        except ValueError:
            raise QueueError(_R("index_unreadable", root=str(root), index=INDEX)) from None
        if owner != run_id:
            raise QueueError(_R("other_run", root=str(root), owner=owner, run_id=run_id))
    elif (root / SEGMENTS).is_dir() and any((root / SEGMENTS).iterdir()):
        raise QueueError(_R("no_index", root=str(root), index=INDEX))


class RolloutQueue:
    def __init__(self, root: str | Path, run_id: str, segment_bytes: int = 64 * 1024**2):
        self.root, self.run_id, self.segment_bytes = Path(root), run_id, segment_bytes
        check_run_id(self.root, run_id)
        (self.root / SEGMENTS).mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root / ".lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise QueueError(_R("in_use", root=str(self.root))) from None
        self._mutex = threading.RLock()  # the producer's generate and the consumer's ack may overlap
        self.recovered = {"adopted": 0, "torn_bytes": 0}
        if (self.root / INDEX).exists():
            self.index = json.loads((self.root / INDEX).read_text())
            if self.index.get("format") != FORMAT:
                raise QueueError(_R("format", path=str(self.root / INDEX), found=self.index.get("format"), expected=FORMAT))
            self._recover()
        else:
            self.index = {"format": FORMAT, "run_id": run_id, "next_seq": 1, "ack_floor": 0, "acked": [],
                          "segments": []}
            self._write_index()
        self._locate()

    # -- persistence -----------------------------------------------------------------------------
    def _seg_path(self, name: str) -> Path:
        return self.root / SEGMENTS / name

    def _write_index(self) -> None:
        _atomic_write(self.root / INDEX, json.dumps(self.index, indent=1))

    def _recover(self) -> None:
        segs = self.index["segments"]
        for seg in segs:
            p = self._seg_path(seg["name"])
            size = p.stat().st_size if p.exists() else -1
            if size < seg["bytes"]:
                raise QueueError(_R("segment_short", path=str(p), size=max(size, 0), committed=seg["bytes"]))
        known = {s["name"] for s in segs}
        extra = sorted(p.name for p in (self.root / SEGMENTS).glob("*.jsonl") if p.name not in known)
        # Only the last committed segment and segments created after it can hold uncommitted bytes.
        tail = ([segs[-1]] if segs else []) + [{"name": n, "bytes": 0, "first_seq": None, "last_seq": None}
                                               for n in extra]
        torn = False
        for seg in tail:
            p = self._seg_path(seg["name"])
            if torn:  # nothing valid can follow a torn record
                p.unlink()
                continue
            with p.open("rb") as f:
                f.seek(seg["bytes"])
                rest = f.read()
            off = seg["bytes"]
            for line in rest.splitlines(keepends=True):
                rec = _decode(line)
                if rec is None or rec[0] != self.index["next_seq"]:
                    torn = True
                    break
                seg["first_seq"] = seg["first_seq"] or rec[0]
                seg["last_seq"] = rec[0]
                self.index["next_seq"] += 1
                self.recovered["adopted"] += 1
                off += len(line)
            if off < p.stat().st_size:
                self.recovered["torn_bytes"] += p.stat().st_size - off
                with p.open("r+b") as f:
                    f.truncate(off)
                    os.fsync(f.fileno())
            seg["bytes"] = off
            if seg not in segs:
                if off:
                    segs.append(seg)
                else:
                    p.unlink()
        self._write_index()

    def _locate(self) -> None:
        """seq -> (segment, offset, length) of every record not acked yet."""
        self._where: dict[int, tuple[str, int, int]] = {}
        for seg in self.index["segments"]:
            with self._seg_path(seg["name"]).open("rb") as f:
                data = f.read(seg["bytes"])
            off = 0
            for line in data.splitlines(keepends=True):
                rec = _decode(line)
                if rec is None:
                    raise QueueError(_R("corrupt_at", path=str(self._seg_path(seg["name"])), offset=off))
                if not self._is_acked(rec[0]):
                    self._where[rec[0]] = (seg["name"], off, len(line))
                off += len(line)

    def _is_acked(self, seq: int) -> bool:
        return seq <= self.index["ack_floor"] or seq in self.index["acked"]

    # -- API ---------------------------------------------------------------------------------------
    def put(self, payload: Any) -> int:
        """Append a payload durably; returns its sequence number (only once it is on disk)."""
        with self._mutex:
            seq = self.index["next_seq"]
            line = _encode(seq, payload)
            segs = self.index["segments"]
            if not segs or (segs[-1]["bytes"] and segs[-1]["bytes"] + len(line) > self.segment_bytes):
                num = int(segs[-1]["name"].split(".")[0]) + 1 if segs else 1
                segs.append({"name": f"{num:06d}.jsonl", "bytes": 0, "first_seq": None, "last_seq": None})
            seg = segs[-1]
            p = self._seg_path(seg["name"])
            new = not p.exists()
            with p.open("ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if new:
                _fsync_dir(p.parent)
            self._where[seq] = (seg["name"], seg["bytes"], len(line))
            seg["bytes"] += len(line)
            seg["first_seq"] = seg["first_seq"] or seq
            seg["last_seq"] = seq
            self.index["next_seq"] = seq + 1
            self._write_index()
            return seq

    def get(self, seq: int) -> Any:
        with self._mutex:
            name, off, length = self._where[seq]
            with self._seg_path(name).open("rb") as f:
                f.seek(off)
                rec = _decode(f.read(length))
            if rec is None or rec[0] != seq:
                raise QueueError(_R("corrupt_record", path=str(self._seg_path(name)), seq=seq))
            return rec[1]

    def pending(self) -> Iterator[tuple[int, Any]]:
        """Records not acked yet, oldest first."""
        for seq in sorted(self._where):
            if seq in self._where:
                yield seq, self.get(seq)

    def ack(self, seq: int) -> None:
        """Durably mark a record consumed; segments whose records are all acked are deleted."""
        with self._mutex:
            if self._is_acked(seq):
                return
            if seq not in self._where:
                raise QueueError(_R("unknown_ack", seq=seq))
            acked = set(self.index["acked"]) | {seq}
            floor = self.index["ack_floor"]
            while floor + 1 in acked:
                floor += 1
                acked.discard(floor)
            self.index["ack_floor"], self.index["acked"] = floor, sorted(acked)
            self._where.pop(seq)
            dead = [s for s in self.index["segments"][:-1] if s["last_seq"] is not None and s["last_seq"] <= floor]
            self.index["segments"] = [s for s in self.index["segments"] if s not in dead]
            self._write_index()  # the index forgets them first, then they go
            for s in dead:
                self._seg_path(s["name"]).unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(self._where)

    def close(self) -> None:
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
