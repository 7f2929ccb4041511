"""The test suites.  A package so that the reliability suite (``python -m tests.reliability.run``)
imports the shared helpers of tests/testkit.py without editing ``sys.path``; pytest puts
``tests/`` on its own path (setup.cfg), where the suites ``import testkit``."""
