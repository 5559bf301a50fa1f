"""llm's logs.db, made safe for several `llm` started at once.

Two steps of llm's `prompt` and `chat` commands fail when processes overlap in them:

- the first migration of a new logs.db (`migrate(db)`, before anything else) is not
  atomic: six first runs at once each add the same columns and tables, and half of them
  die in it ("sqlite3.OperationalError: duplicate column name: instance_id");
- logging an answer reads, then writes, in one deferred transaction; when two processes
  do that at once SQLite refuses one of them at once rather than wait, and it dies after
  printing its answer ("sqlite3.OperationalError: database is locked").

The wrapped commands (plugin/command.py) run the migration first and log answers one
process at a time, under a file lock beside the database (logs.db -> logs.db.lock).
llm's own migrate(db) then finds nothing left to do. A database that is already migrated
costs one read and no lock before the answer.
"""

from __future__ import annotations

import functools
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click

LOCK_TIMEOUT = 120.0  # seconds: a migration or a log takes milliseconds; a lock held this long is stuck


def lock_path(database: Path) -> Path:
    """The lock file kept beside the database; never deleted, since deleting a lock file
    while another process waits on it would split the lock in two."""
    return database.with_name(database.name + ".lock")


def _lock(database: Path):
    import filelock

    return filelock.FileLock(str(lock_path(database)), timeout=LOCK_TIMEOUT)


def migrate_logs_db(database: str | Path | None) -> None:
    """Apply llm's migrations to `database` (llm's own logs.db when None), one process at a time."""
    import filelock
    import sqlite_utils
    from llm.cli import logs_db_path
    from llm.migrations import migrate

    path = Path(database) if database else logs_db_path()
    if _migrated(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _lock(path):
            db = sqlite_utils.Database(path)
            try:
                migrate(db)
            finally:
                db.close()
    except filelock.Timeout:
        raise click.ClickException(
            f"another llm has been migrating {path} for {LOCK_TIMEOUT:.0f} seconds: if none is running, "
            f"delete {lock_path(path)} and try again") from None


def _migrated(path: Path) -> bool:
    """Whether every one of llm's migrations is recorded in the database; False when in
    doubt (no file yet, a migration under way, anything unreadable)."""
    from llm.migrations import MIGRATIONS

    if not path.is_file():
        return False
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=0.1)
        try:
            done = {row[0] for row in db.execute("select name from _llm_migrations")}
        finally:
            db.close()
    except sqlite3.Error:
        return False
    return all(fn.__name__ in done for fn in MIGRATIONS)


@contextmanager
def logging_one_at_a_time() -> Iterator[None]:
    """While a command runs: llm's LogStore.log (what Response.log_to_db calls) holds the
    database's lock, so answers finishing at once are logged in turn instead of one dying."""
    try:
        from llm.logs import LogStore
    except ImportError:  # an llm from before LogStore: nothing to serialize here
        yield
        return
    original = LogStore.log
    if getattr(original, "smolq_locked", False):  # a command run inside another
        yield
        return

    @functools.wraps(original)
    def log(self, *args, **kwargs):
        import filelock

        path = _database_file(self.db)
        if path is None:
            return original(self, *args, **kwargs)
        try:
            with _lock(path):
                return original(self, *args, **kwargs)
        except filelock.Timeout:  # a stuck lock: try as llm would, rather than lose the answer
            return original(self, *args, **kwargs)

    log.smolq_locked = True
    LogStore.log = log
    try:
        yield
    finally:
        LogStore.log = original


def _database_file(db) -> Path | None:
    """The file behind a sqlite_utils Database (None: in memory, or unknown)."""
    try:
        rows = db.conn.execute("pragma database_list").fetchall()
    except (AttributeError, sqlite3.Error):
        return None
    main = next((row[2] for row in rows if row[1] == "main"), "")
    return Path(main) if main else None
