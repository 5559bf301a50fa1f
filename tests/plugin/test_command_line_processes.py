"""`llm` as a shell runs it: separate processes, real pipes, several at once."""

import os
import subprocess
import sys

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
