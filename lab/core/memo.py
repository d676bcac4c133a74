"""A small, bounded, thread-safe LRU for pure results keyed by what they are computed from.

The lab answers every action from scratch (the server holds no session), but users go back and
forth between the same experiments (undo, redo, toggling a switch), and each answer's findings,
files and plan depend only on the experiment and the sources it is rendered from. `Memo` keeps the
last `size` of them, so memory stays bounded however many requests come, and concurrent requests
never see a half-updated table. The value is computed outside the lock: two threads asking for the
same new key may both compute it (the results are equal), neither waits for the other.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class Memo(Generic[V]):
    def __init__(self, size: int = 128) -> None:
        self.size = size
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = compute()
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def peek(self, key: Hashable) -> V | None:
        """The value kept for `key` (now the most recent), or None; nothing is computed."""
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
