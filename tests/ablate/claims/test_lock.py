"""ablate/claims/lock.py: one writer per claim folder. (The CLI's refusal of a second run, and
kill -9 freeing the lock, are tested end to end in tests/ablate/commands/test_reproduce.py.)"""
import os

import pytest

from ablate.claims.lock import CLAIM_LOCK, ClaimLock, claim_lock, claim_locks, read_holder
from ablate.core.errors import ConfigError


def test_a_held_folder_is_refused_naming_its_holder_and_freed_on_release(tmp_path):
    holder = ClaimLock(tmp_path)  # another open file description: as another process would hold it
    assert holder.acquire()
    text = (tmp_path / CLAIM_LOCK).read_text()
    assert text.startswith(f"pid {os.getpid()} on ") and ", started " in text and text.endswith(" UTC\n")
    with pytest.raises(ConfigError, match=rf"^{tmp_path} is being written by another `ablate reproduce` "
                                          rf"\(pid {os.getpid()} on .*\); valid: wait for it to end"):
        with claim_lock(tmp_path):
            pass
    assert (tmp_path / CLAIM_LOCK).read_text() == text  # the refused run wrote nothing
    holder.release()
    with claim_lock(tmp_path):
        assert not ClaimLock(tmp_path).acquire()


def test_a_folder_this_process_holds_is_not_locked_twice(tmp_path):
    # `reproduce all` takes every claim's lock first; each claim's run then finds it its own
    folders = [tmp_path / "a", tmp_path / "b"]
    with claim_locks(folders):
        with claim_lock(folders[1]):
            assert not ClaimLock(folders[0]).acquire()
        assert not ClaimLock(folders[1]).acquire()  # still held: the nested block released nothing
    after = [ClaimLock(f) for f in folders]
    assert all(lock.acquire() for lock in after)  # both released at the block's end
    for lock in after:
        lock.release()


def test_a_lock_file_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_text("keep")
    (tmp_path / CLAIM_LOCK).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        with claim_lock(tmp_path):
            pass
    assert (tmp_path / "elsewhere").read_text() == "keep"


def test_the_holder_is_one_printable_line(tmp_path):
    path = tmp_path / CLAIM_LOCK
    path.write_bytes(b"")
    assert read_holder(path) == "a run that is starting"  # it took the lock an instant ago
    path.write_bytes(b"pid 7\x1b[2J on host\nsecond line\n" + b"x" * 10_000)
    assert read_holder(path) == "pid 7[2J on host"
    assert read_holder(tmp_path / "none") == "a run that is starting"


@pytest.mark.parametrize("plant", [os.mkfifo, os.mkdir])
def test_a_lock_file_that_is_a_fifo_or_a_folder_is_refused_in_words(tmp_path, plant):
    """A FIFO was locked and the run went on; a folder was a bare 'Is a directory' OSError."""
    plant(tmp_path / CLAIM_LOCK)
    with pytest.raises(ConfigError, match="must be a plain file"):
        with claim_lock(tmp_path):
            pass
