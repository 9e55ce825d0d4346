"""A long-running scheduler's project file, read again when it changed.

A scheduler admits each Run it queues under the project as it holds it: the
source's configuration (its dsn, its secret references), the datasets and
their schedules. One that kept the file it read when it started went on
queueing captures of a source whose dsn the file no longer names, and never
scheduled a dataset added since, telling nobody. Each round it now checks
the file, and takes a changed one once it loads; one that does not load is
told and the previous one kept, as is one naming another lake or catalog
(the engine's own, which only a restart changes).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from combined.config import load_project
from combined.errors import ConfigError

if TYPE_CHECKING:
    from combined.config import Project
    from combined.engine import Engine

_log = logging.getLogger("combined.scheduler")

#: What tells a changed file: its inode (an editor's rename), size and mtime.
Stamp = tuple[int, int, int] | None


def _stamp(project: Project) -> Stamp:
    try:
        st = os.stat(project.path)
    except OSError:
        return None  # (a file removed: kept as loaded until one is back)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _restart_needed(old: Project, new: Project) -> str | None:
    if new.lake_uri() != old.lake_uri():
        return "its lake"
    if new.catalog_url() != old.catalog_url():
        return "its catalog"
    return None


class ProjectFile:
    """The file an engine's project came from; :meth:`refresh` takes it again once changed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._stamp = _stamp(engine.project)

    def changed(self) -> bool:
        """Whether the file changed since it was last looked at (a stat, no read)."""
        stamp = _stamp(self.engine.project)
        return stamp is not None and stamp != self._stamp

    def refresh(self) -> bool:
        """Load the file if it changed since it was last looked at; True if taken."""
        old = self.engine.project
        stamp = _stamp(old)
        if stamp is None or stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            new = load_project(old.path)
        except ConfigError as exc:
            _log.error(
                "%s changed but does not load, so the scheduler keeps the project it "
                "loaded before: %s%s",
                old.path,
                exc.message,
                f" (hint: {exc.hint})" if exc.hint else "",
            )
            return False
        changed = _restart_needed(old, new)
        if changed is not None:
            _log.warning(
                "%s changed %s: the scheduler keeps the project it loaded before until "
                "it is restarted",
                old.path,
                changed,
            )
            return False
        self.engine.project = new
        _log.warning("%s changed: the scheduler reloaded it", old.path)
        return True
