"""`termchat history`: the stored conversations from the command line."""

from __future__ import annotations

import sys

def cmd_history_list(args) -> int:

    from termchat.chat.store import Store, day

    from termchat.sanitize import inert

    clean = inert if sys.stdout.isatty() else (lambda text: text)
    store = Store()
    rows = store.conversations(search=args.search or "")
    if not rows:
        print("no conversations" + (f" matching '{args.search}'" if args.search else ""))
    for c in rows:
        print(f"{c.id:>5}  {day(c.updated):<16}  {c.profile:<14}  {clean(c.title)}")
    return 0


def cmd_history_show(args) -> int:
    from termchat.sanitize import inert
    from termchat.chat.store import Store

    store = Store()
    conv = store.conversation(args.id)
    clean = inert if sys.stdout.isatty() else (lambda text: text)
    print(f"# {clean(conv.title)}  (conversation {conv.id}, profile {clean(conv.profile)})\n")
    for m in store.messages(conv.id):
        flag = f" [{m.flagged}]" if m.flagged else ""
        print(f"--- {'you' if m.role == 'user' else m.profile or m.role}{flag}")
        print(clean(m.content))
        if m.role == "assistant":
            print(f"    ({m.summary()})")
        print()
    return 0


def cmd_history_export(args) -> int:
    from termchat.chat.store import Store

    from termchat.sanitize import inert
    from termchat.files import write_export

    store = Store()
    text = store.export_markdown(args.id) if args.format == "md" else store.export_json(args.id)
    if args.output:
        print(f"wrote {write_export(args.output, text, force=args.force)}", file=sys.stderr)
    else:
        print(inert(text) if sys.stdout.isatty() else text)  # a terminal shows it; a pipe gets it exactly
    return 0


def cmd_history_delete(args) -> int:
    from termchat.chat.store import Store

    from termchat.sanitize import inert

    store = Store()
    title = store.conversation(args.id).title
    store.delete(args.id)
    print(f"deleted conversation {args.id} ({inert(title) if sys.stdout.isatty() else title})")
    return 0


def register(sub) -> None:
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

