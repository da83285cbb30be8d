"""Test and replay instruments (not product API): the scheduler harness, the step log, the tiny model."""
