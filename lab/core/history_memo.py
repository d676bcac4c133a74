"""The undo/redo histories the lab wrote last, so a request that sends one back is neither validated
nor written out again.

The page sends its whole history (up to MAX_HISTORY entries) with every action and gets it back one
entry longer: validating those entries and dumping them again cost more than the rest of an edit.
`HistoryMemo` keeps the histories it wrote, keyed by their exact contents in `marshal` format 0
(types and key order included: 1, 1.0 and true never stand for one another), with the entries they
were written from. A history that arrives with exactly those contents IS those entries: validating it
would build equal ones, so nothing is accepted that would be refused. Anything else (edited,
truncated, reordered, written by another server) is validated in full.

Each entry's JSON is kept beside it while a remembered history holds the entry, so writing an
answer's history dumps only its new entries, and the key of the history is put together from its
entries' keys. The last `histories` histories are kept (an LRU), so memory stays flat however many
requests come. The JSON values are shared between answers: nothing
downstream may modify them.
"""
from __future__ import annotations

import marshal
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

E = TypeVar("E")


def contents_key(value: Any) -> bytes | None:
    """The exact contents of a JSON value as bytes (None for what JSON cannot hold)."""
    try:
        return marshal.dumps(value, 0)
    except ValueError:
        return None


def _list_key(item_keys: list[bytes]) -> bytes:
    """`contents_key` of a list, from its items' keys (format 0: '[', the count, the items)."""
    return b"[" + struct.pack("<i", len(item_keys)) + b"".join(item_keys)


class HistoryMemo(Generic[E]):
    def __init__(self, dump: Callable[[E], Any], histories: int = 32) -> None:
        self._dump = dump
        self.histories = histories
        self._lists: OrderedDict[bytes, list[E]] = OrderedDict()
        # id(entry) -> (entry, its JSON, its key), for the entries of the remembered histories only
        # (counted in _uses): the entry itself is held, so its id is not reused while it is here.
        self._items: dict[int, tuple[E, Any, bytes]] = {}
        self._uses: dict[int, int] = {}
        self._lock = threading.Lock()

    def known(self, data: Any) -> list[E] | None:
        """The entries a history written here was made from, when `data` has exactly its contents."""
        if not isinstance(data, list) or not data:
            return None
        key = contents_key(data)
        with self._lock:
            hit = self._lists.get(key) if key is not None else None
            if hit is None or key is None:
                return None
            self._lists.move_to_end(key)
            return list(hit)

    def dump(self, entries: list[E]) -> list[Any]:
        """The JSON of `entries` (each entry's dump), remembered for `known`."""
        out: list[Any] = []
        keys: list[bytes] = []
        with self._lock:
            fresh: dict[int, tuple[E, Any, bytes]] = {}
            for entry in entries:
                i = id(entry)
                item = self._items.get(i) or fresh.get(i)
                if item is None or item[0] is not entry:
                    value = self._dump(entry)
                    item = fresh[i] = (entry, value, marshal.dumps(value, 0))
                out.append(item[1])
                keys.append(item[2])
            if entries:
                self._remember(_list_key(keys), list(entries), fresh)
        return out

    def _remember(self, key: bytes, entries: list[E], fresh: dict[int, tuple[E, Any, bytes]]) -> None:
        self._items.update(fresh)
        uses = self._uses
        for entry in entries:  # counted first: an entry the replaced list holds too stays
            i = id(entry)
            uses[i] = uses.get(i, 0) + 1
        if key in self._lists:  # the same contents again: the latest entries stand for them
            self._release(self._lists.pop(key))
        self._lists[key] = entries
        while len(self._lists) > self.histories:
            self._release(self._lists.popitem(last=False)[1])

    def _release(self, entries: list[E]) -> None:
        uses = self._uses
        for entry in entries:
            i = id(entry)
            uses[i] -= 1
            if not uses[i]:
                del uses[i], self._items[i]

    def clear(self) -> None:
        with self._lock:
            self._lists.clear()
            self._items.clear()
            self._uses.clear()

    def __len__(self) -> int:
        return len(self._lists)
