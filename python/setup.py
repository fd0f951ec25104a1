"""Builds the Python package zps; its metadata is in pyproject.toml.

When the CMake build tree holds them, the wheel carries `libzps_c.so` (as zps/libzps_c.so) and
`zps-server` (as zps/bin/zps-server), copied at build time, so that an installed package needs
no build tree: zps/_native.py and zps/cluster.py look next to the package before the build tree.
Without them the package is pure Python and finds both at run time ($ZPS_NATIVE_LIB,
$ZPS_SERVER, $ZPS_BUILD_DIR, PATH).

The build tree is $ZPS_BUILD_DIR (a relative path is taken from the repository root, as
scripts/build.sh takes it), else `build/` beside this directory. setuptools' own build and
egg-info directories go to a temporary directory, so building leaves the source tree as it was.
"""

import atexit
import os
import pathlib
import shutil
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
BUILD = pathlib.Path(os.environ.get("ZPS_BUILD_DIR") or "build")
if not BUILD.is_absolute():
    BUILD = HERE.parent / BUILD
# Path inside the package -> the built file it is copied from.
NATIVE = {"libzps_c.so": BUILD / "lib" / "libzps_c.so",
          "bin/zps-server": BUILD / "bin" / "zps-server"}
BUNDLED = {dest: src for dest, src in NATIVE.items() if src.is_file()}


class BuildPy(build_py):
    """build_py, plus the native files of the build tree into the built package."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the source tree, which finds the build tree
        for dest, src in NATIVE.items():
            if dest not in BUNDLED:
                self.warn(f"{src} does not exist (build zps first: ./scripts/build.sh); the "
                          "package will look for it at run time")
                continue
            target = pathlib.Path(self.build_lib) / "zps" / dest
            self.mkpath(str(target.parent))
            self.copy_file(str(src), str(target))  # keeps the mode: zps-server stays executable


cmdclass = {"build_py": BuildPy}

# With native files inside, the wheel is for this platform (any CPython 3: the library uses no
# Python C API).
try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        _bdist_wheel = None
if _bdist_wheel is not None and BUNDLED:
    class BdistWheel(_bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    cmdclass["bdist_wheel"] = BdistWheel

_scratch = tempfile.mkdtemp(prefix="zps-python-build-")
atexit.register(shutil.rmtree, _scratch, True)

setup(cmdclass=cmdclass,
      options={"build": {"build_base": os.path.join(_scratch, "build")},
               "egg_info": {"egg_base": _scratch}})
