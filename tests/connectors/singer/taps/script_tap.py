"""A Singer tap that plays a script, for tests of exact lines and process behaviour.

Its ``--config`` names ``script``: a JSON file of ``{"catalog": {...}, "steps": [...]}``.
Discovery plays ``discover_steps`` (if any), then prints ``catalog`` on one line.
A read plays ``steps`` in order, each one of:

- ``{"out": "<text>"}``: the text as one line of standard output, as it is
- ``{"raw": "<latin-1 text>"}``: those bytes on standard output, no newline added
- ``{"err": "<text>"}``: one line of standard error
- ``{"sleep": seconds}``
- ``{"ignore_term": true}``: ignore SIGTERM from here on
- ``{"close_stdout": true}``: close standard output (the process keeps running)
- ``{"pid_file": path}``: write the process id to ``path``
- ``{"env_file": path}``: write the process's environment to ``path`` as JSON
- ``{"state_file": path}``: write the text of the ``--state`` file to ``path``
- ``{"env_err": true}``: print the process's environment on standard error, as
  a careless tap does
- ``{"exit": status}``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--discover", action="store_true")
    parser.add_argument("--catalog")
    parser.add_argument("--state")
    args = parser.parse_args()
    with open(args.config) as f:
        config = json.load(f)
    with open(config["script"]) as f:
        script = json.load(f)
    steps = script["steps"]
    if args.discover:
        steps = [*script.get("discover_steps", []), {"out": json.dumps(script["catalog"])}]
    out = sys.stdout.buffer
    for step in steps:
        if "out" in step:
            out.write(step["out"].encode("utf-8") + b"\n")
            out.flush()
        elif "raw" in step:
            out.write(step["raw"].encode("latin-1"))
            out.flush()
        elif "err" in step:
            sys.stderr.write(step["err"] + "\n")
            sys.stderr.flush()
        elif "sleep" in step:
            time.sleep(step["sleep"])
        elif step.get("ignore_term"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif step.get("close_stdout"):
            out.flush()
            os.close(1)
        elif "pid_file" in step:
            with open(step["pid_file"], "w") as f:
                f.write(str(os.getpid()))
        elif "env_file" in step:
            with open(step["env_file"], "w") as f:
                json.dump(dict(os.environ), f)
        elif "state_file" in step:  # the --state file's text, as the tap was given it
            with open(step["state_file"], "w") as f:
                f.write(open(args.state).read() if args.state else "")
        elif step.get("env_err"):
            for name, value in os.environ.items():
                sys.stderr.write(f"{name}={value}\n")
            sys.stderr.flush()
        elif "exit" in step:
            return int(step["exit"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
