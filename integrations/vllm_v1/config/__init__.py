"""Naming a pipeline: presets, import paths, declarative mappings."""
