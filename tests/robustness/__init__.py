"""Robustness tests: real clients of every protocol against a real cluster under faults, their
histories checked for linearizability (see history.py, checker/, harness.py)."""
