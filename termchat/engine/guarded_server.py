"""vLLM's OpenAI server, started only if its final arguments leave where and
how it listens as termchat set them.

A profile's `engine_args` become command-line flags, and vLLM's parser
accepts more than their key names show: `"host=0.0.0.0" = true` becomes
`--host=0.0.0.0`, `hos = "0.0.0.0"` an abbreviation of `--host`, and a
repeated `--port` overrides the first. So the check is vLLM's own parser on
the final argument list, in the engine process itself (which parses them
anyway: no extra start-up time): termchat passes what it set (loopback, its
port, no socket file, its random key in the environment, its model) in
TERMCHAT_ENGINE_OWNS, and any difference ends the start with one line
naming the flag to remove.
"""

from __future__ import annotations

import json
import os
import sys

OWNS_ENV = "TERMCHAT_ENGINE_OWNS"
VLLM_SERVER = "vllm.entrypoints.openai.api_server"
# where and how the server listens, and what it serves: termchat's, never a profile's
OWNED = ("host", "port", "uds", "api_key", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "root_path", "headless", "model", "served_model_name")


def parser():
    """vLLM's own server parser (its module moved between releases: the CPU
    build's 0.32 has it under launchers/, older ones under openai/)."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def owned_values(argv: list[str], parse=None) -> dict:
    """What vLLM's parser makes of `argv` for the settings termchat owns."""
    args = (parse or parser()).parse_args(argv)
    return {name: getattr(args, name, None) for name in OWNED}


def violations(argv: list[str], expected: dict, parse=None) -> list[str]:
    """The owned settings `argv` changes, in words ("" none)."""
    got = owned_values(argv, parse)
    return [f"{name} would be {got[name]!r}, not {expected.get(name)!r}" for name in OWNED if got[name] != expected.get(name)]


FORK_ENV = "TERMCHAT_FORK_ENGINE_CORE"


def fork_engine_core() -> None:
    """Start vLLM's engine core by fork instead of spawn: it inherits this
    process's vLLM and torch instead of importing them again (5 s of the
    13 s cold start on 2 cores). vLLM's CPU platform sets spawn
    unconditionally; this sets fork back right after. Safe only while this
    process has run no OpenMP work before the fork (GNU libgomp is not
    fork-safe: the child hangs in its first parallel region); the one such
    work here was termchat's own sampling self-check, which therefore runs
    in the forked child instead (vllm_plugin.defer_to_forked_children)."""
    from termchat.vllm_ext import plugin as vllm_plugin

    vllm_plugin.defer_to_forked_children()  # first: importing vLLM may run the plugin
    from vllm.platforms import cpu

    original = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        original(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)


def main() -> None:
    argv = sys.argv[1:]
    from termchat.vllm_ext import isa

    isa.emulate()  # TERMCHAT_CPU_ISA=avx2: first, before anything imports torch
    if os.environ.get(FORK_ENV) == "1":
        fork_engine_core()  # before vLLM's parser below imports vLLM (and with it the plugin)
    expected = json.loads(os.environ.get(OWNS_ENV) or "{}")
    if expected:
        wrong = violations(argv, expected)
        if wrong:
            print(f"termchat: the profile's engine_args change where or how the engine listens ({'; '.join(wrong)}); "
                  "termchat sets these itself (127.0.0.1, a free port, a random API key). Remove those engine_args; for an engine elsewhere, use `endpoint`.", file=sys.stderr, flush=True)
            sys.exit(2)
    from termchat.engine.watchdog import start_from_env

    start_from_env()  # a warm engine ends itself once unused for keep_alive
    try:
        from vllm.entrypoints.launchers.api_server.entry import main as serve
    except ImportError:  # a release without launchers/: its server module, run as a script
        import runpy

        runpy.run_module(VLLM_SERVER, run_name="__main__", alter_sys=True)
        return
    serve()


if __name__ == "__main__":
    main()
