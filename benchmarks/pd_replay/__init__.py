"""Prefill/decode cluster replay: routers compared on a trace, in virtual time."""
