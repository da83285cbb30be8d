"""Tests of the speculative-decoding policies, proposer and replay benchmark."""
