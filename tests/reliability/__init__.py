"""Fault injection into real ``cotsdl train`` jobs: ``python -m tests.reliability.run`` (run.py)."""
