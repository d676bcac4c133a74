"""Samples, datasets and batch building. Kept import-light: the lab imports batch_builder without torch."""
