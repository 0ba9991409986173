"""A journal that cannot be written (a full disk, a file size limit) ends the run in one line that names it and
says what is kept (disk56 F1), and the same command goes on from what it kept."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dilstore.storage.errors import DilstoreError
from tests.fixtures.paths import ROOT

# A child process: a file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes the journal's third line a short
# write and then EFBIG, as a disk that fills up makes it one and then ENOSPC. The child prints what each add did.
_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from dilstore.runners.journal import Journal
from dilstore.storage.errors import DilstoreError
output, limit = Path(sys.argv[1]), int(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
record = {"answers": "x" * 200}
done = []
try:
    with Journal(output, {"run": 1}) as journal:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        for part in range(5):
            journal.add(part, record)
            done.append(part)
except DilstoreError as error:
    print(json.dumps({"done": done, "error": str(error), "type": type(error).__name__}))
"""


def test_a_part_the_journal_cannot_keep_is_one_error_naming_it_and_the_parts_it_kept(tmp_path: Path) -> None:
    """The add of a part on a full disk raised the bare OSError: `dilstore evaluate-qa`, `evaluate-rc` and `rerank`
    ended in "error: No space left on device", naming no file and not saying that the parts done were kept; its
    close at the block's end flushed the rest of the cut line and failed once more. Now the add raises one
    DilstoreError naming the journal and the parts kept, and a run of the same settings takes those two parts."""
    from dilstore.runners.journal import Journal, journal_path

    output = tmp_path / "predictions.json"
    child = subprocess.run([sys.executable, "-c", _CHILD, str(output), "600"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert child.returncode == 0 and child.stderr == "", child.stderr
    result = json.loads(child.stdout)
    journal = journal_path(output)
    assert result["done"] == [0, 1] and result["type"] == "DilstoreError"
    assert result["error"] == (f"cannot keep part 3 of the run in {journal}: File too large; the 2 parts done before "
                               "it are kept there: the file grew past the size this process may write (`ulimit -f`) "
                               "or its filesystem holds: raise the limit, then run the same command again to go on "
                               "from them")  # fmt: skip (left56b F4: it said "check its disk")
    assert 0 < len(journal.read_bytes()) <= 600 and not journal.read_text().endswith("\n")  # a line cut short
    with Journal(output, {"run": 1}) as again:
        assert sorted(again.parts) == [0, 1]
        again.add(2, {"answers": "y"})
    lines = journal.read_text().splitlines()
    assert [json.loads(line).get("part") for line in lines] == [None, 0, 1, 2]  # the cut line is gone


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_journal_a_full_disk_stops_before_its_first_part_says_to_free_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """The header of a new run's journal, written as its first part is kept, on a full disk: nothing is kept yet,
    and the advice is to free space (an earlier run's journal of other settings stays as it was). A full quota
    (EDQUOT) is told to free space too, not to "check its disk" (mut56b M4)."""
    from dilstore.runners import journal as journal_module
    from dilstore.runners.journal import Journal, journal_path

    output = tmp_path / "run.trec"
    journal_path(output).write_text(json.dumps({"journal": journal_module.JOURNAL_FORMAT, "settings": {"run": 0}})
                                    + "\n")  # fmt: skip

    def full(path: Path, *_: object, **__: object) -> None:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(journal_module, "atomic_write_text", full)
    with pytest.raises(DilstoreError) as raised, Journal(output, {"run": 1}) as journal:
        journal.add(0, {"queries": []})
    assert str(raised.value) == (f"cannot keep part 1 of the run in {journal_path(output)}: {os.strerror(code)}; "
                                 "nothing was kept yet: free space on its disk, then run the same command again")
    assert json.loads(journal_path(output).read_text())["settings"] == {"run": 0}


def test_a_journal_a_resumed_run_cannot_write_again_says_what_it_keeps_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(left56b F4) A resumed run writes its journal again (without a line a stop cut short) as it starts: on a disk
    still full that was the bare `No space left on device: DIR/.X.dilstore-partial`, without the words of a part
    that could not be kept (what is kept, free space, run again). The journal is as it was."""
    from dilstore.runners import journal as journal_module
    from dilstore.runners.journal import Journal, journal_path

    output = tmp_path / "predictions.json"
    with Journal(output, {"run": 1}) as journal:
        journal.add(0, {"answers": "x"})
        journal.add(1, {"answers": "y"})
    kept = journal_path(output).read_bytes()

    def full(path: Path, *_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(journal_module, "atomic_write_text", full)
    with pytest.raises(DilstoreError) as raised, Journal(output, {"run": 1}):
        pass
    assert str(raised.value) == (f"cannot write the journal {journal_path(output)} again to go on from it: No space "
                                 "left on device; the 2 parts kept there are as they were: free space on its disk, "
                                 "then run the same command again to go on from them")  # fmt: skip
    assert journal_path(output).read_bytes() == kept
    monkeypatch.undo()
    with Journal(output, {"run": 1}) as again:
        assert sorted(again.parts) == [0, 1]


def test_one_part_kept_before_a_full_disk_is_named_as_one(tmp_path: Path) -> None:
    """One part done before the journal could not keep the next: "the 1 part done before it is kept there ... to go
    on from it", not the plural's "are" and "them" (mut56b M7)."""
    from dilstore.runners.journal import journal_path

    output = tmp_path / "predictions.json"
    child = subprocess.run([sys.executable, "-c", _CHILD, str(output), "400"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert child.returncode == 0 and child.stderr == "", child.stderr
    result = json.loads(child.stdout)
    assert result["done"] == [0] and result["error"] == (
        f"cannot keep part 2 of the run in {journal_path(output)}: File too large; the 1 part done before it is kept "
        "there: the file grew past the size this process may write (`ulimit -f`) or its filesystem holds: raise the "
        "limit, then run the same command again to go on from it")  # fmt: skip
