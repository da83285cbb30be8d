"""Shared test helpers (tests import these, never each other's test modules)."""
