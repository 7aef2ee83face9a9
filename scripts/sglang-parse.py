"""Parse launch lines with SGLang's own argument parser.

Runs inside an environment that has the pinned sglang (scripts/setup.sh builds one). Reads a
JSON list of argv lists on stdin; prints a JSON list of {"ok": bool, "error": str, "args": {...}}.
"""

import argparse
import contextlib
import io
import json
import sys

from sglang.srt.server_args import ServerArgs


def parse(argv: list[str]) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            ns = parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as e:
        # Some errors (ambiguous prefixes, missing values) still go through parser.error().
        message = str(e) if isinstance(e, argparse.ArgumentError) else stderr.getvalue()
        return {"ok": False, "error": message.strip().splitlines()[-1] if message else ""}
    return {"ok": True, "error": "", "args": {k: v for k, v in vars(ns).items() if v is not None}}


if __name__ == "__main__":
    json.dump([parse(argv) for argv in json.load(sys.stdin)], sys.stdout, default=str)
