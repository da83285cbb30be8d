"""Cluster replay: routers in front of N replicas, each a real vLLM scheduler in virtual time."""
