"""Builds lockstep_torch._C with torch.utils.cpp_extension: the backend
(lockstep_torch/csrc) and the part of lockstep's libtorch frontend it stands
on (src/torch: the torch.distributed functions), compiled against the PyTorch
installed here, linked with lockstep's library (liblockstep, which knows
nothing of libtorch). Where that library comes from:

  LOCKSTEP_BUILD_DIR=<dir>  a CMake build of this repository (build/ or
                            build-torch2/, for instance); its liblockstep is
                            linked and copied into the package.
  (unset)                   it is built here first, with CMake, into
                            python/build/lockstep (two minutes on two cores;
                            the Debian packages of scripts/install-deps.sh
                            --run).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch.utils
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIBRARIES = ["lockstep", "fmt"]


def lockstep_build_dir() -> Path:
    given = os.environ.get("LOCKSTEP_BUILD_DIR")
    if given:
        build = Path(given).resolve()
        if not (build / "src" / "liblockstep.so").exists():
            sys.exit(f"lockstep_torch: LOCKSTEP_BUILD_DIR={build} has no src/liblockstep.so; "
                     "build it first (make build) or unset LOCKSTEP_BUILD_DIR to build here")
        return build
    build = HERE / "build" / "lockstep"
    build.mkdir(parents=True, exist_ok=True)
    subprocess.check_call([
        "cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DLOCKSTEP_BUILD_TESTS=OFF", "-DLOCKSTEP_BUILD_TOOLS=OFF", "-DLOCKSTEP_WITH_MPI=OFF",
        "-DLOCKSTEP_WITH_CUDA=OFF", "-DLOCKSTEP_WITH_TORCH=OFF",
    ])
    subprocess.check_call(["cmake", "--build", str(build), "--target", "lockstep"])
    return build


class BuildWithLibraries(BuildExtension):
    """Copies lockstep's shared libraries beside the extension, which finds
    them there ($ORIGIN in its run path)."""

    def run(self):
        super().run()
        package = Path(self.get_ext_fullpath("lockstep_torch._C")).parent
        library = (BUILD / "src" / "liblockstep.so").resolve()
        shutil.copy2(library, package / soname(library))


def soname(library: Path) -> str:
    """The name the loader looks for (DT_SONAME), e.g. liblockstep.so.0.1."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], check=True, capture_output=True, text=True).stdout
    for line in dynamic.splitlines():
        if "(SONAME)" in line:
            return line.split("[", 1)[1].split("]", 1)[0]
    return library.name


BUILD = lockstep_build_dir()

setup(
    ext_modules=[
        CppExtension(
            "lockstep_torch._C",
            # csrc/frontend.cc includes the frontend's sources from src/torch.
            sources=[str(p.relative_to(HERE)) for p in sorted((HERE / "lockstep_torch" / "csrc").glob("*.cc"))],
            # fmt's own headers ahead of the copy inside PyTorch's include
            # directory (another version): the directory of a link to them
            # that lockstep's CMake build makes (see CMakeLists.txt).
            include_dirs=[str(BUILD / "fmt-headers"), str(REPO / "include"), str(REPO / "src"),
                          str(HERE / "lockstep_torch" / "csrc")],
            library_dirs=[str(BUILD / "src")],
            libraries=list(LIBRARIES),  # a copy: CppExtension appends torch's own
            # Source lines in messages relative to the repository, as in the CMake build.
            extra_compile_args=["-std=c++20", "-O2", f"-fmacro-prefix-map={REPO}/="],
            extra_link_args=["-Wl,-rpath,$ORIGIN"],
        )
    ],
    cmdclass={"build_ext": BuildWithLibraries},
)
