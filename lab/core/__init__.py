"""The lab's core: the experiment and its strict build, the experiment -> argv mapping, recipes,
history, share links, provenance, messages. Imports no other layer (docs/en/code-architecture.md)."""
