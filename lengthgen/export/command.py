"""The `lengthgen export` command's arguments and its run: kept here so cli.py stays a list of
commands. Importing this loads no torch: the command's work is imported when it runs."""
from __future__ import annotations

import sys
from pathlib import Path


def add_export_command(sub) -> None:
    x = sub.add_parser("export", help="a finished run as a Hugging Face folder (docs/export.md)")
    x.add_argument("run", help="run folder")
    x.add_argument("--out", required=True, help="the folder to write (new, or an earlier export with --force)")
    x.add_argument("--force", action="store_true", help="replace an earlier export in --out")
    x.set_defaults(func=cmd_export)


def cmd_export(args) -> None:
    from lengthgen.export.export import export_run

    notes = export_run(Path(args.run), Path(args.out), force=args.force)
    for note in notes:  # what the Hugging Face side cannot express, one line each
        print(f"note: {note}", file=sys.stderr)
    print(f"wrote {args.out}: load it with AutoModelForCausalLM.from_pretrained({str(args.out)!r}, trust_remote_code=True)")
