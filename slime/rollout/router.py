"""A minimal in-process router: spreads prompts over engine URLs, round robin by prompt.

SGLang deployments put sglang-router in front of the engines; for embedded engines on one
machine, handing each engine a contiguous share of the batch is all the balancing needed.
"""

from __future__ import annotations

from typing import Sequence, TypeVar

T = TypeVar("T")


class Router:
    def __init__(self, urls: Sequence[str]):
        if not urls:
            raise ValueError("the router needs at least one engine URL")
        self.urls = list(urls)

    def split(self, items: Sequence[T]) -> list[tuple[str, list[int]]]:
        """(url, indices of items) per engine; contiguous shares, sizes differ by at most 1."""
        n, k = len(items), len(self.urls)
        out, start = [], 0
        for i, url in enumerate(self.urls):
            size = n // k + (1 if i < n % k else 0)
            if size:
                out.append((url, list(range(start, start + size))))
            start += size
        return out
