"""The Megatron training backend (megatron-core on GPUs): see docs/en/megatron.md.

Import the submodules directly; nothing here imports megatron-core, so ``model_args`` and
``hf_mapping`` stay usable (and tested) on machines without it.
"""
