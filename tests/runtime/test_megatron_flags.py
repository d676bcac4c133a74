"""The pinned pass-through lists (Megatron's in slime/megatron_flags.py, SGLang's in
slime/rollout/engines/sglang_flags.py) against the real upstream parsers where installed.

megatron-core is installed in CI, so its check runs there (it fails, never skips, without it).
SGLang is not installed in CI (GPU serving stack); its check runs wherever it is.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest

from slime.flags import describe
from slime.megatron_flags import (
    FORK,
    FORK_PREFIXES,
    MEGATRON_FLAGS,
    MEGATRON_PREFIXES,
    MEGATRON_VERSION,
    UPSTREAM,
    UPSTREAM_PREFIXES,
    upstream_flags,
)


@pytest.mark.slow
def test_pinned_megatron_flags_are_the_installed_megatron_cores():
    assert version("megatron-core") == MEGATRON_VERSION, "megatron-core moved: re-check the pinned list"
    real = upstream_flags()
    assert real is not None, "megatron-core is installed, its parser must build"
    assert sorted(UPSTREAM - real) == [], "pinned as Megatron's, but its parser does not have them"
    assert sorted(FORK & real) == [], "Megatron's parser has them now: move them to UPSTREAM"
    for prefix in UPSTREAM_PREFIXES:
        assert any(f.startswith(prefix) for f in real), prefix
    for prefix in FORK_PREFIXES:
        assert not any(f.startswith(prefix) for f in real), prefix


def test_the_pinned_lists_are_one_list():
    assert MEGATRON_FLAGS == UPSTREAM | FORK and not UPSTREAM & FORK
    assert set(MEGATRON_PREFIXES) == set(UPSTREAM_PREFIXES) | set(FORK_PREFIXES)
    # no flag of slime's own table is read as a Megatron pass-through (it would never reach argparse)
    own = [f.name for f in describe() if f.name in MEGATRON_FLAGS or f.name.startswith(MEGATRON_PREFIXES)]
    assert own == []


def test_pinned_sglang_flags_are_the_installed_sglangs():
    from slime.rollout.engines.sglang_flags import ALIASES, FLAGS, SGLANG_VERSION, SLIME_PATCH, upstream_kinds

    pytest.importorskip("sglang.srt.server_args", reason="SGLang is not installed here (it is on GPU nodes)")
    assert version("sglang") == SGLANG_VERSION, "SGLang moved: re-check the pinned list"
    real = upstream_kinds()
    assert real is not None
    wrong = {f: (k, real.get(f)) for f, k in FLAGS.items() if f not in SLIME_PATCH and real.get(f) != k}
    assert wrong == {}
    assert set(ALIASES.values()) <= set(FLAGS)
