"""The package's metadata: one version (VERSION, shared with CMake), py.typed
and the shipped block-size table next to the module; and, under
`make test-package` (RPA_TEST_INSTALLED=1), that these tests run against the
pip-installed package, not the build tree or the clone."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import rpa

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGE = os.path.dirname(os.path.abspath(rpa.__file__))


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def test_version_is_the_version_file():
  assert rpa.__version__ == _read(os.path.join(_ROOT, "VERSION")).strip()
  assert rpa.build_info["version"] == rpa.__version__


def test_package_files():
  assert os.path.isfile(os.path.join(_PACKAGE, "py.typed"))
  assert importlib.util.find_spec("rpa._rpa").origin.startswith(_PACKAGE)
  table = os.path.join(_PACKAGE, "data", "tuned_block_sizes.json")
  assert json.loads(_read(table)) == json.loads(
      _read(os.path.join(_ROOT, "data", "tuned_block_sizes.json")))
  # It is the table `rpa tune` writes, loadable as one (in a child process:
  # loading a table changes the process's block-size choices).
  code = f"import rpa, sys; sys.exit(0 if rpa.load_tuned_block_sizes({table!r}) else 1)"
  subprocess.run([sys.executable, "-c", code], check=True,
                 env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))


@pytest.mark.skipif(not os.environ.get("RPA_TEST_INSTALLED"),
                    reason="make test-package runs this against the installed package")
def test_runs_against_the_installed_package():
  import importlib.metadata

  assert _PACKAGE.startswith(os.path.realpath(sys.prefix)) or _PACKAGE.startswith(sys.prefix)
  assert "site-packages" in _PACKAGE
  # Neither python/rpa of the clone nor a build tree's python/rpa.
  assert not _PACKAGE.endswith(os.path.join("python", "rpa")), _PACKAGE
  assert importlib.metadata.version("rpa") == rpa.__version__
  assert not os.getcwd().startswith(_ROOT + os.sep)
