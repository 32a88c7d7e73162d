"""pytest set-up: find the built package when PYTHONPATH does not name it."""

import os
import sys

import numpy as np
import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
  import rpa  # noqa: F401
except ImportError:
  # `make test` sets PYTHONPATH=build/python; a bare `pytest tests/python`
  # from the repository root finds the default build tree here.
  sys.path.insert(0, os.path.join(_ROOT, "build", "python"))


@pytest.fixture
def rng(request):
  # One stream per test, reproducible from its name.
  seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % 2**32
  return np.random.default_rng(seed)
