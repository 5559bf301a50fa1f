import pytest

from llm_smolq.cache.atomic_file import TEMP_PREFIX, replaced_atomically


def test_new_content_replaces_old_whole(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with replaced_atomically(target) as f:
        f.write(b"new ")
        assert target.read_bytes() == b"old"  # readers see the old file until the end
        f.write(b"content")
    assert target.read_bytes() == b"new content"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_error_keeps_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with replaced_atomically(target) as f:
            f.write(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old"
    assert not list(tmp_path.glob(TEMP_PREFIX + "*"))


def test_creates_a_file_that_did_not_exist(tmp_path):
    with replaced_atomically(str(tmp_path / "new.json")) as f:
        f.write(b"{}")
    assert (tmp_path / "new.json").read_bytes() == b"{}"
