"""Where the package's C++ calls into the standard library land. PyTorch's
wheels export parts of libstdc++ (std::filesystem, std::exception_ptr) from
libtorch_cpu.so without a symbol version, and a versioned reference binds
to such an unversioned definition when the loader meets it first: then
lockstep's calls run PyTorch's copies, built against another libstdc++ (a
SIGSEGV in every rank that formed a group, on a GPU machine's image). The
extension lists libstdc++ before the torch libraries (python/setup.py), so
that in its lookup scope, which liblockstep shares, libstdc++ comes first.

Each check loads the extension with LD_BIND_NOW=1 (every symbol resolved at
once) and LD_DEBUG=bindings, and fails on any std:: symbol of the
extension or of liblockstep bound into a torch library: once with the
extension opened by itself (nothing else has brought libstdc++ into the
process, the case the GPU machine met), and once as users import it. For
whichever build is installed (the CPU one, or the CUDA one: make test
runs both).

The crash the GPU machine met (2026-12-04) came from elsewhere: its
compiler linked a static copy of libstdc++ into liblockstep and into the
extension, both exported, and the ranks ran a mix of those copies and
libstdc++.so.6. So the extension exports its module's init function alone,
no call of liblockstep binds into it, and liblockstep exports no
definition that libstdc++.so.6 also makes."""

import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import lockstep_torch

PACKAGE = Path(lockstep_torch.__file__).resolve().parent
EXTENSION = glob.glob(str(PACKAGE / "_C*.so"))[0]
TORCH_LIB = Path(torch.__file__).resolve().parent / "lib"
# Mangled names in namespace std: _ZSt..., _ZNSt..., _ZNKSt..., their
# typeinfo and vtables (_ZTISt, _ZTVSt, ...), and the abbreviations for
# std::allocator, basic_string, string, istream, ostream, iostream.
STD_SYMBOL = re.compile(r"`_Z(T[IVS])?(N[KVRO]*)?S[tabsiod]")
BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol (`\S+')")


def bindings(code: str) -> list[tuple[str, str, str]]:
    """Runs `code` in a fresh interpreter with every symbol bound at load,
    and returns each binding the loader reported: (the file whose reference
    it is, the file that serves it, the symbol)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_BIND_NOW="1", LD_DEBUG="bindings", LD_DEBUG_OUTPUT=f"{tmp}/bindings",
                   LD_LIBRARY_PATH=f"{TORCH_LIB}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        lines = [line for f in glob.glob(f"{tmp}/bindings.*") for line in Path(f).read_text().splitlines()]
    assert any("binding file" in line for line in lines), "LD_DEBUG reported no bindings: the check saw nothing"
    return [found.groups() for found in map(BINDING.search, lines) if found]


def std_bindings_into_torch(code: str) -> list[str]:
    """Each binding of a std:: symbol from the extension or liblockstep to
    a torch library while `code` runs."""
    wrong = []
    for source, target, symbol in bindings(code):
        ours = Path(source).name.startswith(("liblockstep", "_C")) and Path(source).parent == PACKAGE
        if ours and STD_SYMBOL.match(symbol) and re.match(r"lib(torch|c10)", Path(target).name):
            wrong.append(f"{Path(source).name} -> {Path(target).name}: {symbol}")
    return wrong


def dynamic_symbols(library: str, *which: str) -> list[list[str]]:
    """nm -D's lines for `library` (--defined-only, --undefined-only), split
    into fields; a versioned name (name@@VERSION) without its version."""
    out = subprocess.run(["nm", "-D", *which, library], capture_output=True, text=True, check=True).stdout
    return [fields[:-1] + [fields[-1].split("@")[0]] for fields in map(str.split, out.splitlines()) if fields]


def test_libstdcxx_comes_before_the_torch_libraries_in_the_extensions_needs():
    dynamic = subprocess.run(["readelf", "-d", EXTENSION], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", dynamic)
    torch_libs = [i for i, name in enumerate(needed) if re.match(r"lib(torch|c10)", name)]
    assert "libstdc++.so.6" in needed and torch_libs, needed
    assert needed.index("libstdc++.so.6") < min(torch_libs), needed


def test_the_extension_exports_its_module_init_alone():
    """Whatever else the extension defines (its instantiations of std::
    templates, say) stays inside it (lockstep_torch/csrc/extension.map):
    liblockstep, which the extension loads, would otherwise bind its
    standard-library calls to those copies, which come first in its lookup
    scope (a SIGSEGV at world 2 on a GPU machine's image)."""
    exported = [f[2] for f in dynamic_symbols(EXTENSION, "--defined-only") if len(f) == 3 and f[1].isupper()]
    assert exported == ["PyInit__C"], f"the extension exports {len(exported)} symbols: {exported[:10]}"


def libstdcxx_in_this_process() -> str:
    """The path of the libstdc++.so.6 this interpreter (with torch) loaded."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("libstdc++.so.6") or "libstdc++.so.6." in line:
            return line.split()[-1]
    pytest.skip("no libstdc++.so.6 in this process")


def strong_exports(library: str) -> set[str]:
    return {f[2] for f in dynamic_symbols(library, "--defined-only") if len(f) == 3 and f[1] == "T"}


def test_liblockstep_exports_no_copy_of_libstdcxx():
    """A toolchain that links libstdc++ statically (a GPU machine's image)
    puts copies of its definitions (codecvt<char>::do_unshift, say) into
    liblockstep; exported, they mix with the libstdc++.so.6 that torch
    loads (a SIGSEGV in every rank of a world of 2). src/CMakeLists.txt
    keeps them inside (--exclude-libs)."""
    library = glob.glob(str(PACKAGE / "liblockstep.so*"))[0]
    copies = sorted(strong_exports(library) & strong_exports(libstdcxx_in_this_process()))
    assert not copies, f"{Path(library).name} exports {len(copies)} definitions of libstdc++: {copies[:5]}"


def test_no_call_of_liblockstep_binds_into_the_extension():
    into_extension = [symbol for source, target, symbol in bindings("import torch, lockstep_torch")
                      if Path(source).name.startswith("liblockstep") and Path(target).name.startswith("_C")]
    assert not into_extension, "liblockstep binds into the extension: " + ", ".join(into_extension[:10])


def test_opened_alone_no_std_call_binds_into_torch():
    wrong = std_bindings_into_torch(f"import ctypes; ctypes.CDLL({EXTENSION!r})")
    assert not wrong, "\n".join(wrong[:20])


def test_imported_no_std_call_binds_into_torch():
    wrong = std_bindings_into_torch("import torch, lockstep_torch")
    assert not wrong, "\n".join(wrong[:20])


def test_the_check_sees_a_binding_into_torch_when_there_is_one():
    """The check can fail: with libtorch_cpu opened first into the global
    scope, liblockstep's std:: calls meet its copies before libstdc++."""
    library = glob.glob(str(PACKAGE / "liblockstep.so*"))[0]
    exports = subprocess.run(["nm", "-D", "--defined-only", str(TORCH_LIB / "libtorch_cpu.so")], capture_output=True,
                             text=True).stdout
    if "_ZNSt10filesystem" not in exports:
        pytest.skip("this torch's libtorch_cpu.so exports no std::filesystem: nothing to bind into")
    if not any(f[-1].startswith("_ZNSt10filesystem") for f in dynamic_symbols(library, "--undefined-only")):
        pytest.skip(f"{Path(library).name} calls no std::filesystem of another library (its toolchain linked "
                    "libstdc++ statically, and the copy stays inside): nothing of it can bind into torch")
    wrong = std_bindings_into_torch(f"import ctypes; ctypes.CDLL({str(TORCH_LIB / 'libtorch_cpu.so')!r}, "
                                    f"mode=ctypes.RTLD_GLOBAL); ctypes.CDLL({library!r})")
    assert any("filesystem" in w for w in wrong), "the check missed liblockstep binding into libtorch_cpu"
