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
                            --run), with fmt compiled in, so that the package
                            (a wheel: `pip wheel`, `make wheel`) needs nothing
                            where it is installed but the torch it was built
                            for. The version names that torch
                            (0.1.0+pt211cpu) and the package requires exactly
                            its release (torch==2.11.0).

  LOCKSTEP_WITH_CUDA=1      the CUDA build: the backend also takes CUDA
                            tensors (lockstep's staging through pinned host
                            memory, on the tensors' current streams). The
                            extension is compiled against the CUDA toolkit
                            PyTorch's tooling finds (CUDA_HOME, else nvcc on
                            the PATH, else /usr/local/cuda) and links
                            libtorch's CUDA libraries; liblockstep must take
                            CUDA memory (built here into
                            python/build/lockstep-cuda with that toolkit, or
                            a LOCKSTEP_BUILD_DIR whose liblockstep links the
                            CUDA runtime). Unset or 0: the CPU build, where a
                            CUDA tensor is refused with a message naming
                            this variable.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch.utils
from setuptools import setup
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def with_cuda() -> bool:
    value = os.environ.get("LOCKSTEP_WITH_CUDA", "0")
    if value not in ("0", "1"):
        sys.exit(f"lockstep_torch: LOCKSTEP_WITH_CUDA={value!r}: 1 for the CUDA build, 0 (or unset) for the CPU one")
    if value == "1" and CUDA_HOME is None:
        sys.exit("lockstep_torch: LOCKSTEP_WITH_CUDA=1 but PyTorch's tooling finds no CUDA toolkit; set CUDA_HOME "
                 "(the directory with bin/nvcc and include/cuda_runtime.h)")
    return value == "1"


def links_cuda(library: Path) -> bool:
    """Whether a liblockstep takes CUDA memory: it then links the CUDA runtime."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], check=True, capture_output=True, text=True).stdout
    return "libcudart" in dynamic


def lockstep_build_dir() -> Path:
    given = os.environ.get("LOCKSTEP_BUILD_DIR")
    if given:
        build = Path(given).resolve()
        if not (build / "src" / "liblockstep.so").exists():
            sys.exit(f"lockstep_torch: LOCKSTEP_BUILD_DIR={build} has no src/liblockstep.so; "
                     "build it first (make build) or unset LOCKSTEP_BUILD_DIR to build here")
        if WITH_CUDA and not links_cuda(build / "src" / "liblockstep.so"):
            sys.exit(f"lockstep_torch: LOCKSTEP_WITH_CUDA=1 but the liblockstep of LOCKSTEP_BUILD_DIR={build} was "
                     "built without CUDA (its configure step says 'CUDA memory disabled'); configure it with "
                     "the CUDA toolkit, or unset LOCKSTEP_BUILD_DIR to build one here")
        return build
    build = HERE / "build" / ("lockstep-cuda" if WITH_CUDA else "lockstep")
    build.mkdir(parents=True, exist_ok=True)
    cuda_flags = [f"-DCUDAToolkit_ROOT={CUDA_HOME}", f"-DCMAKE_CUDA_COMPILER={Path(CUDA_HOME) / 'bin' / 'nvcc'}",
                  "-DLOCKSTEP_WITH_CUDA=ON"] if WITH_CUDA else ["-DLOCKSTEP_WITH_CUDA=OFF"]
    # fmt compiled in: the package (a wheel, say) then needs no libfmt.so
    # where it is installed.
    subprocess.check_call([
        "cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DLOCKSTEP_BUILD_TESTS=OFF", "-DLOCKSTEP_BUILD_TOOLS=OFF", "-DLOCKSTEP_WITH_MPI=OFF",
        "-DLOCKSTEP_WITH_TORCH=OFF", "-DLOCKSTEP_FMT_HEADER_ONLY=ON", *cuda_flags,
    ])
    subprocess.check_call(["cmake", "--build", str(build), "--target", "lockstep"])
    if WITH_CUDA and not links_cuda(build / "src" / "liblockstep.so"):
        sys.exit(f"lockstep_torch: LOCKSTEP_WITH_CUDA=1 but CMake did not enable CUDA in {build} (see its "
                 "'-- lockstep: CUDA memory' line above)")
    return build


class BuildWithLibraries(BuildExtension):
    """Copies lockstep's shared libraries beside the extension, which finds
    them there ($ORIGIN in its run path)."""

    def run(self):
        super().run()
        package = Path(self.get_ext_fullpath("lockstep_torch._C")).parent
        library = (BUILD / "src" / "liblockstep.so").resolve()
        shutil.copy2(library, package / soname(library))


def dynamic_entries(library: Path, tag: str) -> list[str]:
    """The values of one dynamic-section tag (NEEDED, SONAME) of a library."""
    dynamic = subprocess.run(["readelf", "-d", str(library)], check=True, capture_output=True, text=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in dynamic.splitlines() if f"({tag})" in line]


def soname(library: Path) -> str:
    """The name the loader looks for (DT_SONAME), e.g. liblockstep.so.0.1."""
    names = dynamic_entries(library, "SONAME")
    return names[0] if names else library.name


def links_libfmt(library: Path) -> bool:
    """Whether a liblockstep links libfmt (a CMake build of the repository)
    or has fmt compiled in (LOCKSTEP_FMT_HEADER_ONLY, this file's own build):
    the extension then does the same."""
    return any(name.startswith("libfmt.") for name in dynamic_entries(library, "NEEDED"))


def torch_release() -> str:
    """The PyTorch release the extension is compiled against (2.11.0 of
    2.11.0+cu130): its C++ ABI binds the package to exactly that release."""
    return torch.__version__.split("+", 1)[0]


def package_version() -> str:
    """lockstep's version with the PyTorch it was built for as the local
    label, as compiled PyTorch extensions name theirs (0.1.0+pt211cpu)."""
    major, minor = torch_release().split(".")[:2]
    return f"{LOCKSTEP_VERSION}+pt{major}{minor}{'cu' + torch.version.cuda.replace('.', '') if WITH_CUDA else 'cpu'}"


LOCKSTEP_VERSION = "0.1.0"
OLDEST_TORCH = (2, 7)


def check_torch_version() -> None:
    """Refuses PyTorch before 2.7: its batch_isend_irecv issues CPU sends
    and receives one by one (it coalesces CUDA tensors only; 2.7 asks the
    backend), and lockstep's in-order sends and receives could then wait in
    a cycle."""
    if tuple(int(part) for part in torch_release().split(".")[:2]) < OLDEST_TORCH:
        sys.exit(f"lockstep_torch: needs PyTorch {'.'.join(map(str, OLDEST_TORCH))} or newer, found "
                 f"{torch.__version__}: older releases issue batch_isend_irecv's CPU operations one by one, and "
                 "exchanges of large messages could wait for each other; upgrade torch")


def variant() -> str:
    """What the extension's objects depend on beyond its sources: the torch
    release and the build (pt215cpu, pt215cu132). Each variant compiles in a
    directory of its own, so that a build for another torch, or the other
    build, never takes objects made for this one, and a second build of the
    same variant (`pip wheel` after `pip install`) compiles nothing."""
    return package_version().split("+", 1)[1]


def unity_source() -> str:
    """One source that includes every csrc/*.cc, compiled as one unit:
    each of them spends most of its time in the same torch and pybind11
    headers (seven units: 170 s of one core; one: 36 s). Rewritten only when
    the list of sources changes, so an unchanged tree recompiles nothing."""
    path = HERE / "build" / variant() / "lockstep_torch_C.cc"
    sources = sorted((HERE / "lockstep_torch" / "csrc").glob("*.cc"))
    text = "// Generated by python/setup.py: the extension's sources as one unit.\n" + "".join(
        f'#include "{source.name}"\n' for source in sources)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return str(path.relative_to(HERE))


def inputs() -> list[str]:
    """Every file of the repository the extension is made from: setuptools
    skips an extension whose output is newer than its sources and these, so
    a change to a header, to the frontend's sources the unity includes, or
    to liblockstep rebuilds it (ninja then recompiles only what the
    compiler's own dependency list says changed)."""
    files = [p for root in (HERE / "lockstep_torch" / "csrc", REPO / "include", REPO / "src")
             for p in root.rglob("*") if p.suffix in (".h", ".cc")]
    return [str(p) for p in sorted(files)] + [str(BUILD / "src" / "liblockstep.so")]


check_torch_version()
WITH_CUDA = with_cuda()
BUILD = lockstep_build_dir()
FMT_LINKED = links_libfmt(BUILD / "src" / "liblockstep.so")
# The CUDA build: CUDAExtension adds the toolkit's headers and libtorch's
# CUDA libraries (c10_cuda for the current stream); no .cu files, since
# lockstep's device work lives in liblockstep.
Extension = CUDAExtension if WITH_CUDA else CppExtension
# Source lines in messages relative to the repository, as in the CMake build;
# no debug information (Python's own flags ask for it: it doubled the
# compile time and made a 27 MB extension).
CXX_FLAGS = ["-std=c++20", "-O2", "-g0", f"-fmacro-prefix-map={REPO}/="]
# libstdc++ first among the extension's libraries, so that it comes before
# libtorch in the lookup scope of the extension and of liblockstep, which
# the extension loads: PyTorch's wheels export parts of libstdc++
# (std::filesystem, exception_ptr) from libtorch_cpu.so without a symbol
# version, and where nothing loaded earlier brought libstdc++ into the
# process's global scope, lockstep's calls bound to those copies (a SIGSEGV
# at world 2, where the shm backend walks /dev/shm). The C++ build does the
# same (src/CMakeLists.txt); python/tests/test_library_bindings.py checks
# where each call binds.
LIBRARIES = ["stdc++", "lockstep"] + (["fmt"] if FMT_LINKED else [])

setup(
    version=package_version(),
    # Exactly the release it was compiled against (the C++ ABI of libtorch
    # changes between releases): pip then refuses to install it beside
    # another, instead of failing at import.
    install_requires=[f"torch=={torch_release()}"],
    ext_modules=[
        Extension(
            "lockstep_torch._C",
            # csrc/frontend.cc includes the frontend's sources from src/torch.
            sources=[unity_source()],
            depends=inputs(),
            # fmt's own headers ahead of the copy inside PyTorch's include
            # directory (another version): the directory of a link to them
            # that lockstep's CMake build makes (see CMakeLists.txt).
            include_dirs=[str(BUILD / "fmt-headers"), str(REPO / "include"), str(REPO / "src"),
                          str(HERE / "lockstep_torch" / "csrc")],
            library_dirs=[str(BUILD / "src")],
            # A copy: CppExtension appends torch's own, after these.
            libraries=list(LIBRARIES),
            define_macros=[("LOCKSTEP_TORCH_WITH_CUDA", "1" if WITH_CUDA else "0")]
            + ([] if FMT_LINKED else [("FMT_HEADER_ONLY", "1")]),
            extra_compile_args=CXX_FLAGS,
            # Exports PyInit__C alone (see the map for why).
            extra_link_args=["-Wl,-rpath,$ORIGIN",
                             f"-Wl,--version-script={HERE / 'lockstep_torch' / 'csrc' / 'extension.map'}"],
        )
    ],
    cmdclass={"build_ext": BuildWithLibraries},
    options={"build": {"build_base": f"build/{variant()}"}},
)
