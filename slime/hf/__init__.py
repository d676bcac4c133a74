"""Hugging Face checkpoints: model and tokenizer loading, weight directories and buckets.

Shared by the embedded trainer (slime/backends/embedded/), the inference engine (slime/inference/)
and the weight transports (slime/sync/); it imports none of them.
"""
