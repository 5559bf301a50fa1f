"""`llm` as a shell runs it: separate processes, real pipes, several at once."""

import os
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

LLM = [sys.executable, "-m", "llm"]
POEM = ["-m", "smollm2-q", "-o", "temperature", "0", "-o", "max_tokens", "80", "Write a poem about the sea"]
# The readers, in Python so that they run wherever the tests do:
HEAD_1 = "import sys; sys.stdout.write(sys.stdin.readline())"  # `head -1`: gone after the first line
NONE = "pass"  # `true`: gone before the answer (written at once with --no-stream) comes


@pytest.mark.parametrize("options, reader", [([], HEAD_1), (["--no-stream"], NONE)], ids=["head-1", "no-reader"])
def test_a_reader_that_stops_early_ends_the_answer_quietly_with_status_141(user_dir, options, reader):
    """`llm ... | head -1` said "Error: [Errno 32] Broken pipe" and exited 1."""
    writer = subprocess.Popen([*LLM, *POEM, *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=os.environ.copy())
    reading = subprocess.Popen([sys.executable, "-c", reader], stdin=writer.stdout, stdout=subprocess.PIPE)
    writer.stdout.close()  # only the reader holds the pipe's reading end now
    read, _ = reading.communicate(timeout=300)
    stderr = writer.stderr.read().decode()
    writer.wait(timeout=60)
    assert read == (b"" if reader == NONE else b"In the depths of the ocean, where shadows play,\n")
    assert stderr == ""  # no "Error: [Errno 32] Broken pipe", no "Exception ignored", no notices
    assert writer.returncode == 141  # 128 + SIGPIPE, as the shell says for `seq 1000000 | head -1`


def test_the_poem_has_more_than_one_line(user_dir):
    """So that the writer above does outlive its `head -1`."""
    whole = subprocess.run([*LLM, *POEM], capture_output=True, env=os.environ.copy(), timeout=300)
    assert whole.returncode == 0 and whole.stdout.count(b"\n") > 3


def test_six_first_runs_at_once_all_answer_and_are_all_logged(tmp_path, smollm2_gguf):
    """A new user directory and six `llm` at once: half died in llm's first migration of
    logs.db ("duplicate column name: instance_id"), and answers finishing together could
    die logging ("database is locked")."""
    home = tmp_path / "llm"
    (home / "smolq").mkdir(parents=True)
    (home / "smolq" / smollm2_gguf.name).symlink_to(smollm2_gguf)
    env = {**os.environ, "LLM_USER_PATH": str(home), "SMOLQ_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.Popen([*LLM, "-m", "smollm2-q", "-o", "max_tokens", "2", f"Say hi to {name}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            for name in ("Ann", "Bo", "Cy", "Di", "Ed", "Flo")]
    ended = [(run.communicate(timeout=600), run.returncode) for run in runs]
    for (out, err), status in ended:
        assert status == 0 and b"Traceback" not in err, err.decode()
        assert out.strip()
    db = sqlite3.connect(home / "logs.db")
    rows = db.execute("select model, thread_id from turns").fetchall()
    assert len(rows) == 6 and {model for model, _ in rows} == {"smollm2-q"} and len({t for _, t in rows}) == 6


def test_an_answer_is_logged_under_the_lock_beside_logs_db(user_dir):
    """What keeps answers finishing together from failing to log: each waits its turn."""
    import filelock

    first = subprocess.run([*LLM, "-m", "smollm2-q", "-o", "max_tokens", "2", "Hi"], capture_output=True,
                           env=os.environ.copy(), timeout=300)
    assert first.returncode == 0, first.stderr.decode()
    lock = filelock.FileLock(str(user_dir / "logs.db.lock"))
    with lock.acquire(timeout=10):
        run = subprocess.Popen([*LLM, "-m", "smollm2-q", "-o", "max_tokens", "2", "Hello"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=os.environ.copy())
        # The first bytes that reach the pipe: llm flushes the answer's text as it streams,
        # but not the newline after it, which waits in the buffer until the process ends.
        answer = []
        reading = threading.Thread(target=lambda: answer.append(os.read(run.stdout.fileno(), 4096)), daemon=True)
        reading.start()
        reading.join(timeout=300)
        assert answer and answer[0].strip()  # answered: logs.db was migrated already, so no wait before
        time.sleep(1.0)
        assert run.poll() is None  # ... and now waits to log
        assert count_turns(user_dir) == 1
    assert run.wait(timeout=60) == 0, run.stderr.read().decode()
    assert count_turns(user_dir) == 2


def count_turns(home) -> int:
    db = sqlite3.connect(home / "logs.db")
    try:
        return db.execute("select count(*) from turns").fetchone()[0]
    finally:
        db.close()
