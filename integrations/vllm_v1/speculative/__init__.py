"""Speculative decoding: the suffix-automaton proposer and the per-class draft budget."""
