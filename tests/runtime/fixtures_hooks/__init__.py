"""Tiny hook modules for tests/runtime/test_reward_hooks.py."""
