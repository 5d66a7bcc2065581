"""Build the termchat_ggml operator for this machine (the bootstrap runs it).

    python -m termchat.vllm_ext.build          # build if missing or stale; one line if it fails
    python -m termchat.vllm_ext.build --force  # build again

Steps, about 45 s on 2 cores the first time:
1. ggml's source, from PyPI: the llama.cpp that llama-cpp-python SOURCE vendors
   (the same ggml as the llama.cpp termchat is measured against in
   bench.peers), downloaded by pip as a source distribution; only its
   `vendor/llama.cpp/ggml` folder is unpacked;
2. ggml's CPU backend built by its own CMake as static libraries, natively
   for this CPU (GGML_NATIVE: AVX2, AVX-512, VNNI, AMX where there are), with
   OpenMP, so its threads are those of torch's own libgomp;
   `amx_gcc12_fix.h` is forced into every file (GCC 12 miscompiles ggml's AMX
   tile configuration at -O3: see that file);
3. ggml_op.cpp compiled against the installed torch and linked with them, and
   with it attention_op.cpp (termchat_attn: a layer's attention as one call of
   vLLM's own kernels, see attention.py), which needs no ggml.

The result goes to <venv>/termchat-ggml/ with build.json (the source, the
CPU's flags): the plugin loads it only on a CPU with the same flags, since a
native build can use instructions another CPU lacks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from termchat.vllm_ext import isa

SOURCE = "llama-cpp-python==0.3.36"  # its vendor/llama.cpp/ggml: ggml 0.25.3
HERE = Path(__file__).resolve().parent
AVX2 = isa.avx2_only()  # TERMCHAT_CPU_ISA=avx2: an AVX2-only build, in a folder of its own (isa.py)
OUT = Path(sys.prefix) / ("termchat-ggml-avx2" if AVX2 else "termchat-ggml")
LIBRARY = OUT / "termchat_ggml.so"
STAMP = OUT / "build.json"


def cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return sorted(isa.visible(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return []


def fingerprint() -> dict:
    """What the built library depends on: if any of it changes, build again."""
    sources = hashlib.sha256(b"".join((HERE / n).read_bytes() for n in ("ggml_op.cpp", "attention_op.cpp", "amx_gcc12_fix.h", "build.py"))).hexdigest()[:16]
    import torch

    return {"source": SOURCE, "operator": sources, "torch": torch.__version__, "cpu_flags": hashlib.sha256(" ".join(cpu_flags()).encode()).hexdigest()[:16]}


def built() -> dict | None:
    """The stamp of a build that matches this machine and these sources, else None."""
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or not LIBRARY.is_file():
        return None
    return stamp if stamp.get("fingerprint") == fingerprint() else None


def say(message: str) -> None:
    print(f"[ggml {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as handle:
        handle.write("$ " + " ".join(map(str, cmd)) + "\n")
        handle.flush()
        code = subprocess.call(cmd, stdout=handle, stderr=subprocess.STDOUT, cwd=cwd)
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"`{Path(cmd[0]).name} {' '.join(map(str, cmd[1:3]))} ...` failed (exit {code}): {tail[0][:160]}; the log is {log}")


def ggml_source(work: Path, log: Path) -> Path:
    """Download the source distribution and unpack its ggml folder."""
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check", "-d", str(work), SOURCE], log)
    archive = next(work.glob("*.tar.gz"))
    target = work / "ggml"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/ggml/" in m.name]
        if not members:
            raise RuntimeError(f"{archive.name} holds no vendor/llama.cpp/ggml folder")
        prefix = members[0].name.split("/vendor/llama.cpp/ggml/")[0] + "/vendor/llama.cpp/ggml/"
        for member in members:
            member.name = member.name[len(prefix):]
        tar.extractall(target, members=[m for m in members if m.name], filter="data")
    pc = target / "ggml.pc.in"  # CMake configures it; the source distribution leaves it out
    if not pc.exists():
        pc.write_text("")
    return target


def build_ggml(source: Path, work: Path, log: Path) -> Path:
    cmake = shutil.which("cmake", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}") or "cmake"
    fix = HERE / "amx_gcc12_fix.h"
    out = work / "build"
    flags = f"-include {fix}"
    # natively for this CPU; an AVX2 build takes what an AVX2-only CPU (Haswell on) has
    target = ["-DGGML_NATIVE=OFF", *(f"-DGGML_{f}=ON" for f in ("SSE42", "AVX", "AVX2", "FMA", "F16C", "BMI2"))] if AVX2 else ["-DGGML_NATIVE=ON"]
    run([cmake, "-S", str(source), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", *target, "-DGGML_OPENMP=ON",
         "-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", "-DGGML_CCACHE=OFF", "-DGGML_BUILD_TESTS=OFF",
         "-DGGML_BUILD_EXAMPLES=OFF", f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"], log)
    run([cmake, "--build", str(out), "-j", str(os.cpu_count() or 2)], log)
    return out / "src"


def build_operator(include: Path, libs: Path, work: Path, log: Path) -> Path:
    from torch.utils import cpp_extension

    folder = work / "operator"
    folder.mkdir()
    archives = [str(libs / name) for name in ("libggml.a", "libggml-cpu.a", "libggml-base.a")]
    with open(log, "a") as handle:
        stdout, stderr = os.dup(1), os.dup(2)
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            cpp_extension.load(name="termchat_ggml", sources=[str(HERE / "ggml_op.cpp"), str(HERE / "attention_op.cpp")], extra_include_paths=[str(include)],
                               extra_cflags=["-O2", "-march=haswell" if AVX2 else "-march=native", "-fopenmp"], extra_ldflags=[*archives, "-fopenmp"],
                               build_directory=str(folder), is_python_module=False, verbose=True)
        finally:
            os.dup2(stdout, 1)
            os.dup2(stderr, 2)
    return folder / "termchat_ggml.so"


def build(force: bool = False) -> Path:
    if not force and built():
        say(f"up to date: {LIBRARY}")
        return LIBRARY
    started = time.monotonic()
    OUT.mkdir(parents=True, exist_ok=True)
    log = OUT / "build.log"
    log.write_text("")
    with tempfile.TemporaryDirectory(prefix="termchat-ggml-") as tmp:
        work = Path(tmp)
        say(f"building ggml ({SOURCE}'s) {'for AVX2 (' + isa.ENV + ')' if AVX2 else 'natively for this CPU'}, then the termchat_ggml operator (about a minute)")
        source = ggml_source(work, log)
        libs = build_ggml(source, work, log)
        library = build_operator(source / "include", libs, work, log)
        STAMP.unlink(missing_ok=True)
        fresh = LIBRARY.with_name(f".{LIBRARY.name}.{os.getpid()}")
        shutil.copy2(library, fresh)
        os.replace(fresh, LIBRARY)  # a new file, renamed over: an engine running the old one keeps its own
    STAMP.write_text(json.dumps({"fingerprint": fingerprint(), "built_at": time.time(), "seconds": round(time.monotonic() - started, 1)}, indent=2))
    say(f"built {LIBRARY} in {time.monotonic() - started:.0f} s")
    return LIBRARY


def main(argv: list[str]) -> int:
    try:
        build(force="--force" in argv)
    except Exception as exc:  # one line: the machine keeps the formats it has
        say(f"the ggml operator was not built ({type(exc).__name__}: {exc}); weights = \"ggml\" is unavailable, the other formats stay")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
