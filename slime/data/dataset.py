"""Prompt data: JSONL or parquet records -> tokenized prompts, served in seeded per-epoch order.

The position (epoch, offset) is the only state; it is saved with every checkpoint so a resumed
run continues with exactly the prompt that the interrupted run would have used next.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.refusals import declare

_R = declare("data", {
    "not_found": ("flag", "path"),
    "format": ("flag", "path"),
    "bad_json": ("path", "line", "error", "column"),
    "not_object": ("path", "line", "type"),
    "empty": ("flag", "path"),
    "missing_key": ("path", "line", "key", "flag", "keys"),
    "messages_template": (),
    "tools_template": (),
    "none_fits": ("flag", "path", "max_len"),
})


class DataError(ValueError):
    """A data problem, with the flag, file and line that caused it."""


@dataclass(frozen=True)
class PromptRecord:
    prompt_id: int  # index of the record in the file
    prompt: str | list[dict[str, Any]]
    prompt_text: str  # the text that was tokenized (after the chat template)
    prompt_tokens: tuple[int, ...]
    label: Any
    metadata: dict[str, Any]


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> "DataPosition":
        return cls(epoch=int(d["epoch"]), offset=int(d["offset"]))


def read_records(path: str | Path, flag: str = "--prompt-data") -> list[dict[str, Any]]:
    """Read every record of a .jsonl or .parquet file; errors name the flag, file and line."""
    p = Path(path)
    if not p.exists():
        raise DataError(_R("not_found", flag=flag, path=str(p)))
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix not in (".jsonl", ".json"):
        raise DataError(_R("format", flag=flag, path=str(p)))
    records = []
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(_R("bad_json", path=str(p), line=lineno, error=e.msg, column=e.colno)) from None
            if not isinstance(rec, dict):
                raise DataError(_R("not_object", path=str(p), line=lineno, type=type(rec).__name__))
            records.append(rec)
    if not records:
        raise DataError(_R("empty", flag=flag, path=str(p)))
    return records


def _field(rec: dict[str, Any], key: str, path: Path, lineno: int, flag: str) -> Any:
    if key not in rec:
        raise DataError(_R("missing_key", path=str(path), line=lineno, key=key, flag=flag, keys=str(sorted(rec))))
    return rec[key]


def build_prompt_text(prompt: Any, tokenizer: Any, apply_chat_template: bool, template_kwargs: dict,
                      tools: Any = None) -> str:
    """The exact text the engine receives. With a chat template the prompt becomes a user
    message (or is used as is when it is already a message list) plus the generation prompt;
    the record's tools (``--tool-key``) go to the template, which renders them for the model."""
    if apply_chat_template:
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        extra = {"tools": tools} if tools else {}
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **extra, **template_kwargs
        )
    if not isinstance(prompt, str):
        raise DataError(_R("messages_template"))
    if tools:
        raise DataError(_R("tools_template"))
    return prompt


def load_prompts(
    path: str | Path,
    tokenizer: Any,
    input_key: str = "input",
    label_key: str | None = None,
    metadata_key: str = "metadata",
    apply_chat_template: bool = False,
    template_kwargs: dict | None = None,
    max_prompt_len: int | None = None,
    flag: str = "--prompt-data",
    tool_key: str | None = "tools",
) -> list[PromptRecord]:
    p = Path(path)
    out = []
    for i, rec in enumerate(read_records(p, flag)):
        line = i + 1
        prompt = _field(rec, input_key, p, line, "--input-key")
        label = _field(rec, label_key, p, line, "--label-key") if label_key else None
        metadata = rec.get(metadata_key) or {}
        tools = rec.get(tool_key) if tool_key else None
        try:
            text = build_prompt_text(prompt, tokenizer, apply_chat_template, template_kwargs or {}, tools)
        except DataError as e:
            raise DataError(f"{p}: record {line}: {e}") from None
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if max_prompt_len is not None and len(tokens) > max_prompt_len:
            continue  # --rollout-max-prompt-len filters long prompts, as users expect
        out.append(PromptRecord(i, prompt, text, tuple(tokens), label, dict(metadata)))
    if not out:
        raise DataError(_R("none_fits", flag=flag, path=str(p), max_len=max_prompt_len))
    return out


def check_data(path: str | Path, input_key: str, label_key: str | None, flag: str) -> int:
    """Pre-flight: the file parses and every record has the keys (no tokenizer needed)."""
    p = Path(path)
    records = read_records(p, flag)
    for i, rec in enumerate(records, start=1):
        _field(rec, input_key, p, i, "--input-key")
        if label_key:
            _field(rec, label_key, p, i, "--label-key")
    return len(records)


class PromptSource:
    """Hands out prompts batch by batch, epoch after epoch, from a saved position.

    Order within epoch e is a permutation seeded by seed + e (or file order without shuffle), so
    the order is a pure function of (seed, epoch) and a position fully restores it.
    """

    def __init__(self, records: list[PromptRecord], shuffle: bool, seed: int,
                 position: DataPosition = DataPosition()):
        self.records = records
        self.shuffle = shuffle
        self.seed = seed
        self.position = position

    def epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(self.seed + epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[tuple[int, PromptRecord]]:
        """n prompts with the epoch each came from; crosses epoch boundaries."""
        out: list[tuple[int, PromptRecord]] = []
        epoch, offset = self.position.epoch, self.position.offset
        while len(out) < n:
            order = self.epoch_order(epoch)
            take = order[offset: offset + (n - len(out))]
            out.extend((epoch, self.records[j]) for j in take)
            offset += len(take)
            if offset >= len(order):
                epoch, offset = epoch + 1, 0
        self.position = DataPosition(epoch, offset)
        return out


def rollouts_per_epoch(num_prompts: int, rollout_batch_size: int) -> int:
    return max(1, num_prompts // rollout_batch_size)


