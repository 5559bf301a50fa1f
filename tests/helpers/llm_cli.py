"""Driving llm's command line in-process, and reading what it logged."""

import sqlite3

from click.testing import CliRunner
from llm.cli import cli

QUICK = ["-o", "max_tokens", "6", "-o", "temperature", "0"]


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def last_logs(user_dir, n=1):
    """llm's last n logged responses, oldest first."""
    db = sqlite3.connect(user_dir / "logs.db")
    db.row_factory = sqlite3.Row
    return db.execute("select * from turns order by rowid desc limit ?", (n,)).fetchall()[::-1]
