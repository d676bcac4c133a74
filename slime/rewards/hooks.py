"""Load user hooks from a path and call reward hooks safely.

Hooks are resolved and their signatures checked *before* a run reserves GPUs (REW-4): a typo in
``--custom-rm-path`` must fail in seconds, not at the first finished sample hours later.

Paths: ``pkg.module.func``, ``pkg.module:func`` or ``path/to/file.py:func`` (relative to the
working directory).

Contracts, by ``kind`` (see ``HOOK_CONTRACTS``):

- ``reward`` (``--custom-rm-path``): ``[async] def reward(sample) -> float | dict``. Also
  accepted: slime's ``(args, sample)`` and the simple ``(response, label, metadata)``. Sync or
  async. A dict result needs ``--reward-key`` to pick the number.
- ``group_reward`` (``--custom-rm-path`` with ``--group-rm``):
  ``[async] def reward(samples: list) -> list[float | dict]`` (or ``(args, samples)``), one
  value per sample, in order.
- ``generate`` (``--custom-generate-function-path``):
  ``async def generate(args, sample, sampling_params) -> sample``; must be async (it is awaited).
- ``rollout`` (``--rollout-function-path``): ``def rollout(args, rollout_id, data_source,
  evaluation=False)``.
- ``dynamic_sampling_filter`` (``--dynamic-sampling-filter-path``):
  ``def keep(args, samples) -> bool``.

A sample is any object with ``.response``, ``.label`` and ``.metadata`` attributes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib
import importlib.util
import inspect
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence, overload

from slime.refusals import declare

_R = declare("hooks", {
    "file_missing": ("kind", "path", "file"),
    "not_python": ("kind", "path", "file"),
    "import_failed": ("kind", "path", "target", "error"),
    "module_missing": ("kind", "path", "module", "error"),
    "package_missing": ("kind", "path", "module", "error"),
    "not_a_path": ("kind", "path"),
    "no_attribute": ("kind", "path", "module", "attr", "public"),
    "not_callable": ("kind", "path", "attr", "type"),
    "signature": ("kind", "path", "attr", "signature", "forms", "returns"),
    "not_async": ("kind", "path", "attr"),
})


class HookLoadError(ValueError):
    """A hook path that cannot be resolved to a callable with the right signature."""


class HookError(RuntimeError):
    """A hook that raised or returned something unusable while running.

    ``kind`` and ``path`` name the hook; ``sample_index`` the sample (or group) it was given.
    """

    def __init__(self, message: str, *, kind: str, path: str, sample_index: Any = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.path = path
        self.sample_index = sample_index


@dataclass(frozen=True)
class HookContract:
    """What a hook of one kind must look like."""

    signatures: tuple[tuple[str, ...], ...]  # accepted positional parameter lists, preferred first
    must_be_async: bool  # awaited by the caller
    returns: str  # documentation only


HOOK_CONTRACTS: dict[str, HookContract] = {
    "reward": HookContract((("sample",), ("args", "sample"), ("response", "label", "metadata")), False, "float | dict"),
    "group_reward": HookContract((("samples",), ("args", "samples")), False, "list[float | dict]"),
    "generate": HookContract((("args", "sample", "sampling_params"),), True, "sample"),
    "rollout": HookContract((("args", "rollout_id", "data_source", "evaluation"),), False, "rollout data"),
    "dynamic_sampling_filter": HookContract((("args", "samples"),), False, "bool"),
}

_PATH_ATTR = "__slime_hook_path__"


def _contract(kind: str) -> HookContract:
    try:
        return HOOK_CONTRACTS[kind]
    except KeyError:
        raise ValueError(f"unknown hook kind {kind!r}; known: {', '.join(sorted(HOOK_CONTRACTS))}") from None


def _accepts(sig: inspect.Signature, n: int) -> bool:
    """True when the callable can be called with exactly ``n`` positional arguments."""
    positional = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    kw_required = any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in sig.parameters.values())
    return not kw_required and required <= n and (n <= len(positional) or var_positional)


def hook_arity(fn: Callable[..., Any], kind: str) -> int | None:
    """Number of positional arguments ``fn`` is called with for ``kind``; None if none fits."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: trust the first form
        return len(_contract(kind).signatures[0])
    for params in _contract(kind).signatures:
        if _accepts(sig, len(params)):
            return len(params)
    return None


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - a callable object's __call__ may be async


def _import_file(file_part: str, kind: str, path: str) -> Any:
    file_path = os.path.abspath(file_part)
    if not os.path.isfile(file_path):
        raise HookLoadError(_R("file_missing", kind=kind, path=path, file=file_path))
    # A stable, unique module name per file, registered in sys.modules so pickling and
    # dataclasses inside the hook file work.
    name = "_slime_hook_" + hashlib.sha256(file_path.encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file_path)
    if spec is None or spec.loader is None:
        raise HookLoadError(_R("not_python", kind=kind, path=path, file=file_path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise HookLoadError(_R("import_failed", kind=kind, path=path, target=file_path, error=repr(exc))) from exc
    return module


def _import_module(module_name: str, kind: str, path: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise HookLoadError(_R("module_missing", kind=kind, path=path, module=module_name, error=str(exc))) from exc
        raise HookLoadError(_R("package_missing", kind=kind, path=path, module=module_name, error=str(exc))) from exc
    except Exception as exc:
        raise HookLoadError(_R("import_failed", kind=kind, path=path, target=repr(module_name), error=repr(exc))) from exc


def load_function(dotted_path: str, *, kind: str) -> Callable[..., Any]:
    """Resolve ``dotted_path`` to a callable that fits the ``kind`` contract (module docstring).

    Raises :class:`HookLoadError` naming the hook kind and path when the module or file is
    missing, the attribute is absent or not callable, the signature fits none of the accepted
    forms, or the hook must be async and is not.
    """
    contract = _contract(kind)
    path = (dotted_path or "").strip()
    if ":" in path:
        module_part, _, attr = path.rpartition(":")
    else:
        module_part, _, attr = path.rpartition(".")
    if not module_part or not attr:
        raise HookLoadError(_R("not_a_path", kind=kind, path=dotted_path))
    if module_part.endswith(".py") or os.sep in module_part:
        module = _import_file(module_part, kind, path)
    else:
        module = _import_module(module_part, kind, path)
    if not hasattr(module, attr):
        public = sorted(
            n for n, v in vars(module).items()
            if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        raise HookLoadError(_R("no_attribute", kind=kind, path=path, module=module_part, attr=attr, public=str(public)))
    fn = getattr(module, attr)
    if not callable(fn):
        raise HookLoadError(_R("not_callable", kind=kind, path=path, attr=attr, type=type(fn).__name__))
    if hook_arity(fn, kind) is None:
        forms = " or ".join(f"({', '.join(p)})" for p in contract.signatures)
        raise HookLoadError(_R("signature", kind=kind, path=path, attr=attr, signature=str(inspect.signature(fn)),
                               forms=forms, returns=contract.returns))
    if contract.must_be_async and not _is_async(fn):
        raise HookLoadError(_R("not_async", kind=kind, path=path, attr=attr))
    try:  # remembered so later errors name the configured path, not just the function name
        setattr(fn, _PATH_ATTR, path)
    except (AttributeError, TypeError):
        pass
    return fn


def hook_path(fn: Callable[..., Any]) -> str:
    """The path a hook was loaded from (or its qualified name when not loaded by path)."""
    return getattr(fn, _PATH_ATTR, None) or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def reward_to_float(value: Any, reward_key: str | None = None) -> float:
    """The number inside a reward hook's result; ``reward_key`` picks it from a dict.

    Raises ValueError naming the key and the returned keys when the dict lacks it.
    """
    if isinstance(value, dict):
        if reward_key is None:
            raise ValueError(f"returned a dict with keys {sorted(map(str, value))}; set --reward-key to pick the reward")
        if reward_key not in value:
            raise ValueError(f"--reward-key {reward_key!r} is not in the returned dict; its keys: {sorted(map(str, value))}")
        value = value[reward_key]
    if isinstance(value, (str, bytes)) or value is None:
        raise ValueError(f"returned {value!r}; a reward must be a number (or a dict holding one)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned a {type(value).__name__}; a reward must be a number (or a dict holding one)") from None
    if not math.isfinite(number):
        raise ValueError(f"returned a non-finite reward ({number})")
    return number


def _describe(target: Any, index: Any) -> str:
    if isinstance(target, (list, tuple)):
        indices = [getattr(s, "index", getattr(s, "prompt_id", i)) for i, s in enumerate(target)]
        return f"group {index if index is not None else '?'} (sample indices {indices})"
    label = f"sample index {index}"
    describe = getattr(target, "describe", None)
    return f"{label} ({describe()})" if callable(describe) else label


def _prepare(fn: Callable[..., Any], target: Any, args: Any) -> tuple[str, Callable[[], Any]]:
    group = isinstance(target, (list, tuple))
    kind = "group_reward" if group else "reward"
    arity = hook_arity(fn, kind)
    if arity == 1:
        return kind, lambda: fn(list(target) if group else target)
    if arity == 2:
        return kind, lambda: fn(args, list(target) if group else target)
    if arity == 3 and not group:
        return kind, lambda: fn(target.response, target.label, target.metadata)
    raise HookError(
        f"[{kind} hook] {hook_path(fn)!r}: signature {inspect.signature(fn)} does not fit the {kind} contract",
        kind=kind, path=hook_path(fn),
    )


def _scores(raw: Any, target: Any, reward_key: str | None, kind: str, path: str, index: Any) -> float | list[float]:
    where = _describe(target, index)
    if isinstance(target, (list, tuple)):
        if not isinstance(raw, (list, tuple)) or len(raw) != len(target):
            got = f"{len(raw)} values" if isinstance(raw, (list, tuple)) else type(raw).__name__
            raise HookError(f"[{kind} hook] {path!r} on {where}: expected {len(target)} rewards, got {got}",
                            kind=kind, path=path, sample_index=index)
        values = list(raw)
    else:
        values = [raw]
    out: list[float] = []
    for value in values:
        try:
            out.append(reward_to_float(value, reward_key))
        except ValueError as exc:
            raise HookError(f"[{kind} hook] {path!r} on {where}: {exc}", kind=kind, path=path, sample_index=index) from exc
    return out if isinstance(target, (list, tuple)) else out[0]


def _sample_index(target: Any, index: Any) -> Any:
    if index is not None or isinstance(target, (list, tuple)):
        return index if index is not None else getattr(target[0], "group_index", None) if target else None
    return getattr(target, "index", getattr(target, "prompt_id", None))


def _wrap(exc: Exception, fn: Callable[..., Any], kind: str, target: Any, index: Any) -> HookError:
    path = hook_path(fn)
    where = _describe(target, index)
    return HookError(f"[{kind} hook] {path!r} raised on {where}: {exc!r}", kind=kind, path=path, sample_index=index)


async def acall_reward_hook(
    fn: Callable[..., Any],
    sample_or_samples: Any | Sequence[Any],
    *,
    reward_key: str | None = None,
    args: Any = None,
    index: Any = None,
) -> float | list[float]:
    """Run a sync or async reward hook from async code; a list input means a group hook.

    Returns the reward (a list for a group). Exceptions inside the hook, and unusable results,
    become :class:`HookError` naming the hook path and the sample (or group) index.
    """
    kind, call = _prepare(fn, sample_or_samples, args)
    index = _sample_index(sample_or_samples, index)
    try:
        raw = call()
        if inspect.isawaitable(raw):
            raw = await raw
    except Exception as exc:
        raise _wrap(exc, fn, kind, sample_or_samples, index) from exc
    return _scores(raw, sample_or_samples, reward_key, kind, hook_path(fn), index)


@overload
def call_reward_hook(fn: Callable[..., Any], sample_or_samples: list[Any], *, reward_key: str | None = None,
                     args: Any = None, index: Any = None) -> list[float]: ...
@overload
def call_reward_hook(fn: Callable[..., Any], sample_or_samples: Any, *, reward_key: str | None = None,
                     args: Any = None, index: Any = None) -> float: ...
def call_reward_hook(
    fn: Callable[..., Any],
    sample_or_samples: Any | Sequence[Any],
    *,
    reward_key: str | None = None,
    args: Any = None,
    index: Any = None,
) -> float | list[float]:
    """Synchronous :func:`acall_reward_hook`: sync hooks are called directly, async hooks run
    on a fresh event loop (inside a running loop, on a worker thread's loop; there
    ``await acall_reward_hook`` is cheaper).
    """
    kind, call = _prepare(fn, sample_or_samples, args)
    index = _sample_index(sample_or_samples, index)
    if _is_async(fn):
        coro = acall_reward_hook(fn, sample_or_samples, reward_key=reward_key, args=args, index=index)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        # A loop already runs in this thread (a notebook, an async framework): blocking it would
        # deadlock, so the hook gets its own loop in a worker thread.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coro).result()
    try:
        raw = call()
        if inspect.isawaitable(raw):  # a sync wrapper returning a coroutine
            raw = asyncio.run(_await(raw))
    except Exception as exc:
        raise _wrap(exc, fn, kind, sample_or_samples, index) from exc
    return _scores(raw, sample_or_samples, reward_key, kind, hook_path(fn), index)


async def _await(awaitable: Any) -> Any:
    return await awaitable
