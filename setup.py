"""The pip package's build: setuptools drives CMake to build the extension.

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation .      # or: pip wheel --no-build-isolation .

CMake builds the library and the pybind11 module `rpa._rpa` (python/CMakeLists.txt)
for the interpreter running this build, in a directory that persists across builds
(build/pip/cmake-<python>, so a rebuild only recompiles what changed); the Python
layer (python/rpa), py.typed and the shipped block-size table
(data/tuned_block_sizes.json -> rpa/data/) come along. The version is the VERSION
file, which CMake's project() reads too.

Environment:
  RPA_CMAKE_ARGS        extra CMake arguments, e.g. "-DRPA_HWY_TARGETS=AVX2;AVX3"
  RPA_CMAKE_BUILD_DIR   the CMake build directory to use
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default: every core)
"""

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))
os.makedirs(os.path.join(ROOT, "build", "pip"), exist_ok=True)  # egg_base below.


def read_version():
  with open(os.path.join(ROOT, "VERSION"), encoding="utf-8") as f:
    return f.read().strip()


class CMakeExtension(Extension):
  """An extension CMake builds: no sources for setuptools to compile."""

  def __init__(self, name):
    super().__init__(name, sources=[])


class CMakeBuild(build_ext):
  def build_extension(self, ext):
    tag = sysconfig.get_config_var("SOABI") or "py%d%d" % sys.version_info[:2]
    build_dir = os.environ.get("RPA_CMAKE_BUILD_DIR") or os.path.join(
        ROOT, "build", "pip", "cmake-" + tag)
    os.makedirs(build_dir, exist_ok=True)
    config = "Debug" if self.debug else "Release"
    args = [
        "-S", ROOT, "-B", build_dir,
        "-DCMAKE_BUILD_TYPE=" + config,
        "-DPython_EXECUTABLE=" + sys.executable,
        # The library and the module only.
        "-DRPA_BUILD_PYTHON=ON", "-DRPA_BUILD_TESTS=OFF", "-DRPA_BUILD_TOOLS=OFF",
        "-DRPA_BUILD_BENCH=OFF", "-DRPA_INSTALL=OFF", "-DBUILD_SHARED_LIBS=OFF",
        # A user's compiler may warn where the developers' does not.
        "-DRPA_WERROR=OFF",
    ] + shlex.split(os.environ.get("RPA_CMAKE_ARGS", ""))
    subprocess.check_call(["cmake"] + args)
    build = ["cmake", "--build", build_dir, "--target", "rpa_python"]
    if "CMAKE_BUILD_PARALLEL_LEVEL" not in os.environ:
      build += ["-j", str(os.cpu_count() or 1)]
    subprocess.check_call(build)

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    built = os.path.join(build_dir, "python", "rpa", "_rpa" + suffix)
    if not os.path.exists(built):
      raise RuntimeError(f"CMake did not build {built}; see its output above (is "
                         "pybind11-dev installed? `make setup` installs it).")
    target = self.get_ext_fullpath(ext.name)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(built, target)
    shutil.copymode(built, target)


class BuildPy(build_py):
  """The Python layer plus the shipped block-size table as rpa/data/."""

  def run(self):
    super().run()
    data = os.path.join(self.build_lib, "rpa", "data")
    os.makedirs(data, exist_ok=True)
    shutil.copyfile(os.path.join(ROOT, "data", "tuned_block_sizes.json"),
                    os.path.join(data, "tuned_block_sizes.json"))

  def get_outputs(self, include_bytecode=1):
    return super().get_outputs(include_bytecode) + [
        os.path.join(self.build_lib, "rpa", "data", "tuned_block_sizes.json")]


setup(
    version=read_version(),
    package_dir={"": "python"},
    packages=["rpa"],
    package_data={"rpa": ["py.typed"]},
    include_package_data=False,
    ext_modules=[CMakeExtension("rpa._rpa")],
    cmdclass={"build_ext": CMakeBuild, "build_py": BuildPy},
    # setuptools' own scratch stays inside build/ (which git ignores), apart
    # from the CMake build trees.
    options={"build": {"build_base": os.path.join("build", "pip")},
             "egg_info": {"egg_base": os.path.join("build", "pip")}},
    zip_safe=False,
)
