"""The embedded inference engine: continuous batching, static-slot decoding, on-device sampling.

A library below its users: slime/rollout/engines/ serves it over HTTP, slime/ray/ hosts it in an actor.
It loads models through slime/hf/ and knows nothing of trainer backends, rollout or Ray.
"""
