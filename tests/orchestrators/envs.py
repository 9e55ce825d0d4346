"""An isolated virtualenv per orchestrator, with Combined's dependencies and the orchestrator.

Dagster and Airflow pin their own dependencies (Airflow strictly), and so
does dbt (dbt-core with dbt-duckdb, an outside reader: docs/readers.md), so
none joins Combined's ``.venv``: each gets a virtualenv of its own, built once
and kept while its key holds (pyproject.toml's dependencies and entry points, the
orchestrator's pin, the Python version). Combined is installed into it from
the worktree as a wheel, for its dependencies and its entry points; the tests
run it with ``src`` first on ``PYTHONPATH``, so the code under test is the
worktree's, not the copy.

``python -m tests.orchestrators.envs dagster airflow dbt`` builds them ahead
(``make orchestrators``). ``COMBINED_ORCHESTRATOR_ENVS`` moves them out of the
worktree (CI keeps them across clones); the default is ``.venv-orchestrators``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Each orchestrator and the release the examples are tested with (docs/python.md);
#: dbt and the releases its reading of a publication is tested with (docs/readers.md).
#: dbt-duckdb's ``delta`` plugin imports deltalake, which Combined's own pin brings.
PINS = {
    "dagster": ["dagster==1.13.29"],
    "airflow": ["apache-airflow==3.3.2"],
    "dbt": ["dbt-core>=1.11.16,<1.12", "dbt-duckdb>=1.11.1,<1.12"],
}


def _key(name: str) -> str:
    """What the environment holds: Combined's dependencies and entry points, the pin, Python."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = {k: pyproject["project"].get(k) for k in ("dependencies", "entry-points", "scripts")}
    held = [pyproject["build-system"], project, PINS[name]]
    digest = hashlib.sha256(json.dumps(held, sort_keys=True).encode())
    digest.update(sys.version.split()[0].encode())
    return digest.hexdigest()[:12]


def _envs_root() -> Path:
    return Path(os.environ.get("COMBINED_ORCHESTRATOR_ENVS") or ROOT / ".venv-orchestrators")


def _pip(python: Path, *args: str, log: Path) -> None:
    with log.open("a") as out:
        cmd = [str(python), "-m", "pip", "install", "-q", *args]
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        tail = log.read_text().splitlines()[-20:]
        raise RuntimeError(f"{' '.join(cmd)} failed (log {log}):\n" + "\n".join(tail))


def _build(env: Path, name: str) -> None:
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    python = env / "bin" / "python"
    log = env / "install.log"
    _pip(python, "--upgrade", "pip", log=log)
    _pip(python, str(ROOT), *PINS[name], log=log)
    # Combined's pins and the orchestrator's hold together (docs/python.md says so).
    check = subprocess.run([str(python), "-m", "pip", "check"], capture_output=True, text=True)
    if check.returncode:
        raise RuntimeError(f"{name}'s environment has broken requirements:\n{check.stdout}")


def orchestrator_python(name: str) -> Path:
    """The Python of ``name``'s environment, built first when missing or stale."""
    root = _envs_root()
    root.mkdir(parents=True, exist_ok=True)
    key = _key(name)
    env = root / f"{name}-{key}"
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; others wait, then reuse
        if not (env / ".complete").exists():
            for stale in root.glob(f"{name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            started = time.monotonic()
            _build(env, name)
            seconds = time.monotonic() - started
            (env / ".complete").write_text(f"built in {seconds:.0f}s\n")
    return env / "bin" / "python"


def orchestrator_env() -> dict[str, str]:
    """The environment for a process of an orchestrator's Python: the worktree's code first."""
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return {**os.environ, "PYTHONPATH": path}


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        started = time.monotonic()
        print(arg, orchestrator_python(arg), f"{time.monotonic() - started:.0f}s")
