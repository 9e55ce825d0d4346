"""An Airbyte source that plays a script, for tests of exact lines and process behaviour.

Its ``--config`` names ``script``: a JSON file of ``{"catalog": {...},
"steps": {"check": [...], "discover": [...], "read": [...]}}``. A command
plays its steps (``discover`` then prints a CATALOG of ``catalog``, unless
its steps end in an exit). Each step is one of:

- ``{"msg": {...}}``: the object as one line of standard output
- ``{"out": "<text>"}``: the text as one line of standard output, as it is
- ``{"err": "<text>"}``: one line of standard error; with ``"times": N``, N of them
- ``{"sleep": seconds}``
- ``{"spawn_and_hang": path}``: start a child that sleeps, write both pids to ``path``, sleep
- ``{"exit": status}``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> int:
    command = sys.argv[1]
    with open(sys.argv[sys.argv.index("--config") + 1]) as f:
        config = json.load(f)
    with open(config["script"]) as f:
        script = json.load(f)
    steps = list(script.get("steps", {}).get(command, []))
    if command == "discover":
        steps.append({"msg": {"type": "CATALOG", "catalog": script["catalog"]}})
    out = sys.stdout
    for step in steps:
        if "msg" in step:
            out.write(json.dumps(step["msg"]) + "\n")
            out.flush()
        elif "out" in step:
            out.write(step["out"] + "\n")
            out.flush()
        elif "err" in step:
            sys.stderr.write((step["err"] + "\n") * int(step.get("times", 1)))
            sys.stderr.flush()
        elif "sleep" in step:
            time.sleep(step["sleep"])
        elif "spawn_and_hang" in step:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            with open(step["spawn_and_hang"], "w") as f:
                f.write(f"{os.getpid()} {child.pid}\n")
            time.sleep(600)
        elif "exit" in step:
            return int(step["exit"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
