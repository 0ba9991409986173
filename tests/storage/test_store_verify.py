"""`dilstore verify` catches damage, `dilstore info` describes a store; both through the command line."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from dilstore.runners.cli import main
from dilstore.storage import encodings
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import MANIFEST_FILE, TOKENS_PER_CHUNK
from dilstore.storage.secrets import remember_secrets
from dilstore.storage.verify import VerifyReport, verify_store
from dilstore.storage.writer import write_shard
from tests.fixtures.limits import address_space_limit
from tests.fixtures.store_fixtures import build_store, passage, random_shards
from tests.storage.test_store_append import resigned

INFO_KEYS = {"passages", "tokens", "shards", "bytes_on_disk", "bytes_per_token", "encoding", "fingerprint"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A small sound int8 store (int8: the encoding with the most arrays)."""
    shards = random_shards([4, 3], state_shape=(5,), seed=7, max_words=12)
    return build_store(tmp_path_factory.mktemp("pristine") / "store", shards, encoding="int8")


@pytest.fixture
def store(pristine, tmp_path) -> Path:
    """A private copy of the sound store, free to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "store"))


def test_a_sound_store_verifies_and_later_files_are_listed_not_failed(store, capsys) -> None:
    """Files added after finalize (notes of one's own) are listed as not checked; a BM25 index is checked by
    Lucene's checksums instead (tests/reader/serving/test_odqa_retrieval.py)."""
    (store / "notes").mkdir()
    (store / "notes" / "README.txt").write_text("built for the demo\n")
    assert main(["verify", str(store)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("OK") and "notes/README.txt" in out
    report = verify_store(store)
    assert report.ok and report.untracked == ["notes/README.txt"]
    assert report.files_checked == len(json.loads((store / MANIFEST_FILE).read_text())["files"])


def test_the_report_counts_one_shard_and_one_passage_in_the_singular(tmp_path: Path, capsys) -> None:
    """A one-passage store (an append's shard, say) was "1 shards, 1 passages" (docs54 L)."""
    one = build_store(tmp_path / "one", [[passage("p0", 3, (5,), np.random.default_rng(0))]], encoding="int8")
    assert main(["verify", str(one)]) == 0
    checked = capsys.readouterr().out.splitlines()[1]
    assert checked.startswith("checked  ") and checked.endswith(", 1 shard, 1 passage, 4 tokens"), checked


def test_every_single_flipped_byte_is_caught(store) -> None:
    """One byte flipped in each file in turn (the manifest too), at a seeded random position."""
    rng = np.random.default_rng(0)
    files = sorted(json.loads((store / MANIFEST_FILE).read_text())["files"]) + [MANIFEST_FILE]
    assert len(files) > 50
    for relative in files:
        path = store / relative
        original = path.read_bytes()
        damaged = bytearray(original)
        position = int(rng.integers(len(damaged)))
        damaged[position] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(damaged))
        report = verify_store(store)
        path.write_bytes(original)
        assert not report.ok, f"a flipped bit at byte {position} of {relative} went unnoticed"
        named = MANIFEST_FILE if relative == MANIFEST_FILE else relative
        assert any(named in problem for problem in report.problems), (relative, report.problems)
    assert verify_store(store).ok


@pytest.mark.parametrize(("scale", "problem"), [
    (3e38, "states/scales holds a scale (3e+38) that overflows float32 when decoded: times the largest "
           "channel_scales"),
    (0.0, "states/scales are all zero, so every state of the shard decodes to zeros"),
])  # fmt: skip
def test_int8_scales_that_decode_to_infinity_or_to_zeros_are_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scale: float, problem: str
) -> None:
    """Each array passed its own check (finite, >= 0), so verify said OK, and `ask` then found no finite score in
    the store, or answered from states that were all zeros (hostile47 F9): the arrays are checked together too."""
    int8 = encodings.get_encoding("int8")

    def encode(states: np.ndarray, codebook: object = None) -> dict[str, np.ndarray]:
        arrays = int8.encode(states, None)
        return {**arrays, "scales": np.full_like(arrays["scales"], scale)}

    # The writer refuses such arrays too (codes51 F6): this store is one a writer without that check made.
    monkeypatch.setitem(encodings.ENCODINGS, "int8", dataclasses.replace(int8, encode=encode, shard_problems=None))
    store = build_store(tmp_path / "store", random_shards([3, 4], seed=1), encoding="int8")
    monkeypatch.undo()
    problems = verify_store(store).problems
    assert len(problems) == 2, problems
    assert all(found.startswith(f"shards/shard-0000{shard}: {problem}") for shard, found in enumerate(problems))


def test_a_truncated_file_is_caught(store, capsys) -> None:
    values = store / "shards/shard-00001/states/codes/c/0/0"
    values.write_bytes(values.read_bytes()[:-10])
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "shards/shard-00001/states/codes/c/0/0" in out and "truncated" in out


@pytest.mark.parametrize("change", [-1, 1], ids=["shorter", "longer"])
def test_the_size_look_serve_takes_names_a_file_shorter_or_longer_than_recorded(store, change: int) -> None:
    """`dilstore serve` checks sizes only, before it takes a request (mut57b: a check of `shorter than recorded`
    passed every test, so a file overwritten by a longer one went unnamed there)."""
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest
    from dilstore.storage.verify import size_problems

    relative = "shards/shard-00001/states/codes/c/0/0"
    values = store / relative
    recorded = values.stat().st_size
    values.write_bytes(values.read_bytes()[:change] if change < 0 else values.read_bytes() + b"\0")
    location = StoreLocation.parse(store)
    assert size_problems(location, read_manifest(location)) == [
        f"{relative}: {recorded + change} bytes, the manifest recorded {recorded} (truncated or overwritten)"]


@pytest.mark.parametrize("damage", ["cut", "deleted shard"])
def test_a_damaged_shard_is_named_once_not_again_as_zarr_s_read_errors(store, damage: str) -> None:
    """A cut chunk was reported by its file, then again as "shard shard-00001: cannot be read: ValueError: Stored
    and computed checksum do not match. Stored: b'...'"; a deleted shard as two GroupNotFoundError lines
    (storage43 L5)."""
    if damage == "cut":
        values = store / "shards/shard-00001/states/codes/c/0/0"
        values.write_bytes(values.read_bytes()[:-10])
    else:
        shutil.rmtree(store / "shards" / "shard-00001")
    problems = verify_store(store).problems
    first = "missing shard directory shards/shard-00001" if damage != "cut" else "shards/shard-00001/states/codes/c/0/0"
    assert len(problems) == 2 and problems[0].startswith(first), problems
    assert problems[1] == "shard shards/shard-00001: not read, as a file of it is damaged (above)"


def test_a_file_replaced_by_a_directory_is_named_as_such(store) -> None:
    values = store / "shards/shard-00001/states/codes/c/0/0"
    values.unlink()
    values.mkdir()
    (values / "inside").write_bytes(b"x")
    problems = verify_store(store).problems
    assert "shards/shard-00001/states/codes/c/0/0: a directory where the manifest lists a file" in problems
    assert not any(problem.startswith("missing file") for problem in problems), problems


def verified_within(store: Path, seconds: float) -> list[str]:
    """verify_store's problems, failing the test (not hanging the suite) if it does not return in time."""
    outcome: list[list[str]] = []
    worker = threading.Thread(target=lambda: outcome.append(verify_store(store).problems), daemon=True)
    worker.start()
    worker.join(seconds)
    assert outcome, f"verify did not return within {seconds} s: it is blocked reading a pipe"
    return outcome[0]


@pytest.mark.parametrize(
    "path", ["shards/shard-00001/states/codes/c/0/0", "shards/shard-00001/zarr.json", MANIFEST_FILE]
)
def test_a_pipe_standing_for_a_store_file_is_named_and_never_opened(store, path: str) -> None:
    """verify blocked forever opening a FIFO where the manifest lists a file (its shard and codebook checks read
    the shard after the size check had caught it; the manifest was read as it was)."""
    (store / path).unlink()
    os.mkfifo(store / path)
    problems = verified_within(store, 60)
    if path == MANIFEST_FILE:
        assert problems == [f"{store / path} is not a regular file (a pipe, socket or device)"]
    else:
        assert problems == [f"{path}: not a regular file (a pipe, socket or device) where the manifest lists a file",
                            "shard shard-00001: not read, as a file of it is not a regular file"]  # fmt: skip


def test_a_missing_shard_is_caught(store, capsys) -> None:
    shutil.rmtree(store / "shards" / "shard-00000")
    assert main(["verify", str(store), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"]
    assert "missing shard directory shards/shard-00000" in report["problems"]


def test_a_missing_manifest_is_caught(store, capsys) -> None:
    (store / MANIFEST_FILE).unlink()
    assert main(["verify", str(store)]) == 1
    out = capsys.readouterr().out
    assert "never finalized" in out and "the same command again goes on from the shards it finished" in out


def test_a_file_slipped_into_a_shard_is_caught(store) -> None:
    (store / "shards" / "shard-00001" / "extra.bin").write_bytes(b"x")
    report = verify_store(store)
    assert report.problems == ["shards/shard-00001/extra.bin: inside the store's data but not in the manifest"]


class Recorded:
    """A VerifyProgress that keeps each phase with its total and the sum of its steps."""

    def __init__(self) -> None:
        self.phases: list[list] = []

    def phase(self, name: str, total: int, unit: str) -> None:
        self.phases.append([name, total, unit, 0])

    def advance(self, amount: int) -> None:
        self.phases[-1][3] += amount


def test_verify_reports_its_progress_and_the_command_shows_it(store, capsys) -> None:
    """verify read every byte of a store (hours at terabytes) and said nothing until the end."""
    progress = Recorded()
    report = verify_store(store, progress=progress)
    assert report.ok and progress.phases == [
        ["checksums", report.bytes_checked, "B", report.bytes_checked], ["shards", 2, "shard", 2]
    ]
    assert main(["verify", str(store)]) == 0
    err = capsys.readouterr().err
    assert "verify checksums: 100%" in err and "verify shards: 100%" in err and "2/2" in err
    assert main(["verify", str(store), "--json"]) == 0 and capsys.readouterr().err == ""


def test_info_json_has_the_interface_keys(store, capsys) -> None:
    assert main(["info", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert INFO_KEYS <= set(info)
    assert (info["passages"], info["shards"], info["encoding"]) == (7, 2, "int8")
    assert info["fingerprint"]["encoding"] == "int8"
    # int8 at d=5: 5 code bytes + a 4-byte scale per token, plus per shard the last chunk's padding,
    # the shard indexes and the channel scales
    state_bytes = info["bytes_by_part"]["states"]
    assert 9 * info["tokens"] <= state_bytes <= 9 * info["tokens"] + 2 * (TOKENS_PER_CHUNK * 9 + 200)
    assert info["bytes_per_token"]["dilbert"] == round(state_bytes / info["tokens"], 3)
    assert info["state_bytes_per_token_marginal"] == 9
    assert info["state_bytes"] == {"per_token": 9 * info["tokens"], "fixed": state_bytes - 9 * info["tokens"]}
    assert info["bytes_on_disk"] == sum(path.stat().st_size for path in store.rglob("*") if path.is_file())
    assert main(["info", str(store)]) == 0
    assert "bytes/token  dilbert" in capsys.readouterr().out


@pytest.mark.parametrize("compressor", ["zstd", "blosc"])
def test_info_of_a_compressed_store_does_not_split_its_state_bytes(tmp_path: Path, compressor: str, capsys) -> None:
    """The per-token + fixed split assumes uncompressed arrays: a blosc store showed a negative "fixed"."""
    store = build_store(tmp_path / "s", random_shards([40, 40], state_shape=(128,), seed=2), compressor=compressor)
    assert main(["info", str(store), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["state_bytes"] == {"compressed": info["bytes_by_part"]["states"]}
    assert info["state_bytes_per_token_marginal"] is None
    assert main(["info", str(store)]) == 0
    assert " fixed " not in capsys.readouterr().out


def test_the_command_runs_as_a_program_and_reports_errors_without_a_traceback(store, tmp_path, capsys) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dilstore.runners.cli", "info", str(store), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert INFO_KEYS <= set(json.loads(done.stdout))
    assert main(["info", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.startswith("dilstore info: error: no store at")
    assert main(["verify", str(tmp_path / "nowhere")]) == 1
    assert "no store at" in capsys.readouterr().out


def test_info_into_a_closed_pipe_stops_quietly(store) -> None:
    """`dilstore info STORE | head -0`: the reader is gone before we write; no traceback, exit 141 like Unix tools."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        finished = subprocess.run(
            [sys.executable, "-m", "dilstore.runners.cli", "info", str(store)],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
        )
    finally:
        os.close(write_end)
    assert finished.returncode == 141
    assert "Traceback" not in finished.stderr and "BrokenPipeError" not in finished.stderr


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
def test_an_output_on_a_full_disk_is_one_line_naming_the_standard_output(store) -> None:
    """`dilstore info STORE > FILE` on a full disk said "No space left on device", naming nothing, then Python's
    "Exception ignored in: <_io.TextIOWrapper name='<stdout>'...>" and the error again at exit, and exited 120
    (disk56 F2). The output is buffered, as it is unless PYTHONUNBUFFERED is set."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    with open("/dev/full", "w") as full:
        finished = subprocess.run([sys.executable, "-m", "dilstore.runners.cli", "info", str(store)], stdout=full,
                                  stderr=subprocess.PIPE, text=True, timeout=120, env=environment)  # fmt: skip
    assert (finished.returncode, finished.stderr) == (2, "dilstore info: error: cannot write the output (standard "
                                                         "output): No space left on device\n")


def test_a_token_of_no_characters_inside_its_text_verifies(tmp_path: Path) -> None:
    """A span may be empty (start = end) where it lies inside the text: such a store is sound, and verify says so."""
    shards = random_shards([2], state_shape=(5,), seed=3, max_words=12)
    first = shards[0][0]
    spans = first.char_spans.copy()
    spans[0] = (0, 0)
    spans[1] = (len(first.text), len(first.text))
    shards[0][0] = dataclasses.replace(first, char_spans=spans)
    report = verify_store(build_store(tmp_path / "store", shards))
    assert report.ok, report.problems


def test_a_passage_id_stored_in_two_shards_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose writer let one id into two shards (finalize refuses that; here its check is bypassed, as an
    older or foreign writer would) verifies with the duplicate named."""
    from dilstore.storage import id_index

    shards = random_shards([2, 2], state_shape=(5,), seed=4, max_words=12)
    shards[1][1] = dataclasses.replace(shards[1][1], id=shards[0][0].id)
    shards[1] = sorted(shards[1], key=lambda record: record.id)
    monkeypatch.setattr(id_index, "_reject_duplicates", lambda *arguments: None)
    store = build_store(tmp_path / "store", shards)
    monkeypatch.undo()
    report = verify_store(store)
    assert report.problems == ["index: 1 passage ids occur more than once"]


def test_an_index_entry_one_row_past_its_shard_is_named_as_outside_it(store) -> None:
    """An index whose entry points at row n of an n-row shard (signed again, as anyone can) is named as such."""
    manifest = json.loads((store / MANIFEST_FILE).read_text(encoding="utf-8"))
    sizes = {entry["index"]: entry["passages"] for entry in manifest["shards"]}

    def past_the_last_row(hashes: np.ndarray, shards: np.ndarray, rows: np.ndarray) -> None:
        shard = int(shards[0])
        rows[int(np.flatnonzero((shards == shard) & (rows == sizes[shard] - 1))[0])] += 1

    _index_signed_again(store, past_the_last_row)
    assert verify_store(store).problems == ["index: 1 entries point outside their shard"]


def _index_signed_again(store: Path, change_arrays) -> None:
    """Rewrite the store's id index with `change_arrays(hashes, shards, rows)` applied and sign the manifest again."""
    from dilstore.storage.id_index import IdIndex, write_index

    group = zarr.open_group(store / "index", mode="r")
    arrays = [np.asarray(group[name][...]).copy() for name in ("hashes", "shards", "rows")]
    change_arrays(*arrays)
    write_index(store, IdIndex(*arrays))

    def change(data: dict) -> None:
        data["files"] = {path: entry for path, entry in data["files"].items() if not path.startswith("index/")}
        for path in (store / "index").rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                data["files"][path.relative_to(store).as_posix()] = {
                    "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, change)


def _swap_entries(hashes: np.ndarray, shards: np.ndarray, rows: np.ndarray) -> None:
    for values in (hashes, shards, rows):
        values[[0, 1]] = values[[1, 0]]


def _swap_rows_of_one_shard(hashes: np.ndarray, shards: np.ndarray, rows: np.ndarray) -> None:
    first, second = np.flatnonzero(shards == shards[0])[:2]
    rows[[first, second]] = rows[[second, first]]


def _one_row_twice(hashes: np.ndarray, shards: np.ndarray, rows: np.ndarray) -> None:
    first, second = np.flatnonzero(shards == shards[0])[:2]
    rows[second] = rows[first]


@pytest.mark.parametrize(("damage", "problem"), [
    (_swap_entries, "index: hashes are not sorted, so binary search would miss ids"),
    (_swap_rows_of_one_shard, "index: 2 hashes do not match their ids (first: "),
    (_one_row_twice, "index: some (shard, row) pairs are listed twice, so others are missing"),
])  # fmt: skip
def test_an_index_out_of_order_or_pointing_at_other_rows_is_named(store, damage, problem: str) -> None:
    """Index damage a writer could make and the manifest signs (mut57b: none of these checks had a test; each
    could be dropped, or count one entry of two, and verify still passed the store): named, one problem each."""
    _index_signed_again(store, damage)
    problems = verify_store(store).problems
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_char_span_that_ends_before_it_starts_is_named(store) -> None:
    """A span (2, 1) lies inside its text by both ends but is no span (mut57b: the start <= end part of the check
    could be dropped and verify passed the store, signed again as anyone can)."""
    spans = np.asarray(zarr.open_array(store / "shards/shard-00000/tokens/char_spans", mode="r")[...])
    token = int(np.flatnonzero(spans[:, 0] >= 0)[0])
    _array_signed_again(store, "shards/shard-00000/tokens/char_spans", lambda values: values.__setitem__(token, (2, 1)))
    assert verify_store(store).problems == [
        f"shards/shard-00000: 1 char spans lie outside their passage text (first at token {token})"]


def _array_signed_again(store: Path, relative: str, change) -> None:
    """Rewrite the array at `relative` with `change(values)` applied in place, and sign the manifest again."""
    array = zarr.open_array(store / relative, mode="r+")
    values = np.asarray(array[...]).copy()
    change(values)
    array[...] = values

    def files(data: dict) -> None:
        for path in (store / relative).rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                data["files"][path.relative_to(store).as_posix()] = {
                    "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, files)


def test_a_shard_of_another_build_is_named(store) -> None:
    """A shard whose attributes name another build than the manifest (its zarr.json signed again) is named (mut57b:
    readers refuse it, but verify's own check had no test and could be dropped)."""
    group = zarr.open_group(store / "shards/shard-00001", mode="r+")
    attributes = group.attrs.asdict()["dilstore"]
    built = attributes.get("generation")
    group.attrs["dilstore"] = {**attributes, "generation": "b" * 16}

    def change(data: dict) -> None:
        content = (store / "shards/shard-00001/zarr.json").read_bytes()
        data["files"]["shards/shard-00001/zarr.json"] = {
            "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, change)
    assert verify_store(store).problems == [
        f"shards/shard-00001: belongs to build {'b' * 16!r}, the manifest to {built!r}"]


def _attributes_signed_again(store: Path, shard: str, changes: dict) -> None:
    """Change the dilstore attributes of the shard folder `shard` and sign the manifest again."""
    group = zarr.open_group(store / shard, mode="r+")
    group.attrs["dilstore"] = {**group.attrs.asdict()["dilstore"], **changes}

    def change(data: dict) -> None:
        content = (store / shard / "zarr.json").read_bytes()
        data["files"][f"{shard}/zarr.json"] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, change)


@pytest.mark.parametrize("changes", [{"shard": 7}, {"encoding": "fp16"}], ids=["number", "encoding"])
def test_a_shard_whose_attributes_differ_from_the_manifest_is_named_once_and_read_no_further(
    store, changes: dict
) -> None:
    """(mut61 M6) A shard's number was compared by no test, and that a mismatch stops the shard's checks (they read
    its arrays by its attributes) by none either: a copy of another shard passed, or one line became many."""
    _attributes_signed_again(store, "shards/shard-00001", changes)
    problems = verify_store(store).problems
    assert len(problems) == 1 and problems[0].startswith("shards/shard-00001: attributes (")
    assert "differ from the manifest's (1, 'dilbert', 'int8', " in problems[0]


def test_a_shard_of_another_model_has_its_other_checks_too(store) -> None:
    """(mut61 M6) A shard made by another model than the manifest's is named, and its other checks still run: a
    damaged char span in it went unnamed where that mismatch stopped them."""
    _attributes_signed_again(store, "shards/shard-00000", {"fingerprint_sha256": "0" * 64})
    spans = np.asarray(zarr.open_array(store / "shards/shard-00000/tokens/char_spans", mode="r")[...])
    token = int(np.flatnonzero(spans[:, 0] >= 0)[0])
    _array_signed_again(store, "shards/shard-00000/tokens/char_spans", lambda values: values.__setitem__(token, (2, 1)))
    assert verify_store(store).problems == [
        "shards/shard-00000: was made by another model than the manifest's fingerprint says (edited fingerprint?)",
        f"shards/shard-00000: 1 char spans lie outside their passage text (first at token {token})"]


def test_a_token_id_chunk_that_cannot_be_decoded_is_named_though_its_checksum_was_signed_again(store) -> None:
    """(mut61 M7) verify decodes every chunk of the token ids, which nothing else it does reads: no test had a chunk
    only that decoding fails on, and a store whose token ids cannot be read could verify as sound."""
    relative = "shards/shard-00000/tokens/ids/c/0"
    chunk = store / relative
    chunk.write_bytes(chunk.read_bytes()[:-4] + b"\0\0\0\0")  # its crc32c, zeroed

    def change(data: dict) -> None:
        content = chunk.read_bytes()
        data["files"][relative] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, change)
    problems = verify_store(store).problems
    assert len(problems) == 1 and problems[0].startswith("shard shard-00000: cannot be read: ValueError: Stored and "
                                                         "computed checksum do not match")  # fmt: skip


def test_int8_codes_of_minus_128_are_named_once_for_the_array(store, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 codes stop at -127 (symmetric): -128 is damage, named once however many blocks hold it (mut57b: neither
    the code check nor the one problem per array had a test; blocks are 2**18 rows, here 4)."""
    from dilstore.storage import verify

    def below(values: np.ndarray) -> None:
        values[:9, 0] = -128  # rows 0..8: three blocks of 4

    _array_signed_again(store, "shards/shard-00000/states/codes", below)
    monkeypatch.setattr(verify, "_CHECK_ROWS", 4)
    assert verify_store(store).problems == ["shards/shard-00000: states/codes holds codes below -127 (rows 0..3)"]


def test_a_passage_vector_of_nan_is_named(tmp_path: Path) -> None:
    """mut57b: verify's check of passage vectors had no test; it could be dropped and verify passed the store."""
    shards = random_shards([2], state_shape=(5,), seed=6, max_words=12)
    shards[0] = [dataclasses.replace(record, vector=np.ones(3, np.float32)) for record in shards[0]]
    store = build_store(tmp_path / "store", shards)
    _array_signed_again(store, "shards/shard-00000/passages/vectors", lambda values: values.__setitem__((1, 2), np.nan))
    assert verify_store(store).problems == ["shards/shard-00000: passages/vectors holds NaN or infinite values"]


@pytest.mark.parametrize(("total", "problem"), [
    ("passages", "manifest: shard passage counts less the superseded do not add up to its passage total"),
    ("tokens", "manifest: shard token counts less the superseded do not add up to its token total"),
])  # fmt: skip
def test_manifest_totals_that_are_not_the_shards_sum_are_named(store, total: str, problem: str) -> None:
    """mut57b: neither total check had a test; either could be dropped and verify passed the store."""
    resigned(store, lambda data: data.update({total: data[total] + 1}))
    assert problem in verify_store(store).problems


def _appended_with_one_row_replaced(tmp_path: Path):
    """A sound store of one shard and an append (with replace) whose shard supersedes one of its rows."""
    from dilstore.storage.append import commit_append
    from dilstore.storage.format import append_dir
    from tests.fixtures.store_fixtures import fingerprint_for

    shards = random_shards([3, 2], state_shape=(5,), seed=5, max_words=12)
    store = build_store(tmp_path / "store", [shards[0]])
    generation = "a" * 16
    (store / append_dir(generation)).mkdir(parents=True)
    replacing = [dataclasses.replace(shards[1][0], id=shards[0][1].id), shards[1][1]]
    write_shard(store / append_dir(generation), 1, sorted(replacing, key=lambda record: record.id),
                kind="dilbert", encoding="fp32", durable=False, generation=generation)
    manifest = commit_append(store, generation, fingerprint_for("dilbert", "fp32"), replace=True)
    assert manifest.superseded_passages == 1 and verify_store(store).ok
    return store, manifest


def test_superseded_tokens_other_than_the_superseded_rows_hold_are_named(tmp_path: Path) -> None:
    """A manifest whose superseded token count is one off (its token total too, so that the totals add up) is named
    (mut57b: the check had no test; it could be dropped and verify passed the store)."""
    store, manifest = _appended_with_one_row_replaced(tmp_path)
    held = manifest.superseded_tokens

    def change(data: dict) -> None:
        data["superseded"]["tokens"] += 1
        data["tokens"] -= 1

    resigned(store, change)
    assert verify_store(store).problems == [
        f"{manifest.index}: superseded rows hold {held} tokens, the manifest says {held + 1}"]


def test_superseded_rows_listed_twice_are_named_as_such(tmp_path: Path) -> None:
    """An appended store's index whose superseded rows repeat one row (signed again, as anyone can) is named for
    that, not only for the counts that then fail to add up."""
    from dilstore.storage.id_index import IdIndex, Superseded, write_index

    store, manifest = _appended_with_one_row_replaced(tmp_path)
    group = zarr.open_group(store / manifest.index, mode="r")
    index = IdIndex(*(np.asarray(group[name][...]) for name in ("hashes", "shards", "rows")))
    once = (np.asarray(group["superseded_shards"][...]), np.asarray(group["superseded_rows"][...]))
    write_index(store, index, directory=manifest.index,
                superseded=Superseded(*(np.repeat(values, 2) for values in once)))

    def change(data: dict) -> None:
        data["superseded"]["passages"] = 2
        folder = f"{manifest.index}/"
        data["files"] = {path: entry for path, entry in data["files"].items() if not path.startswith(folder)}
        for path in (store / manifest.index).rglob("*"):
            if path.is_file():
                content = path.read_bytes()
                data["files"][path.relative_to(store).as_posix()] = {
                    "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    resigned(store, change)
    assert f"{manifest.index}: superseded rows are not sorted by (shard, row) or repeat" in verify_store(store).problems


def test_the_json_report_hides_a_store_password_in_a_problem_whichever_check_worded_it() -> None:
    """`verify --json` prints VerifyReport.to_dict: a problem that quotes the store's URL with its password (as an
    error of a library can) is printed with the password hidden; the report's own
    list keeps what the check wrote."""
    url = "http://reader:S3CRET@127.0.0.1:9/store"
    remember_secrets(url)
    report = VerifyReport("http://reader:***@127.0.0.1:9/store", problems=[f"shards/shard-00000: {url}/c/0 failed"])
    problems = report.to_dict()["problems"]
    assert problems == ["shards/shard-00000: http://reader:***@127.0.0.1:9/store/c/0 failed"]
    assert report.problems == [f"shards/shard-00000: {url}/c/0 failed"]


def test_a_link_to_nothing_in_a_local_store_is_left_out_of_its_files(tmp_path: Path) -> None:
    """A link whose target is gone is no file of the store (verify then names a listed one missing), not a
    FileNotFoundError out of the listing (mut59 M9: the listing's guard could go and no test noticed)."""
    from dilstore.storage.location import StoreLocation

    (tmp_path / "kept").write_bytes(b"12345")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    assert StoreLocation.parse(tmp_path).files() == {"kept": 5}


def test_reading_a_manifest_takes_memory_for_its_bytes_not_for_the_most_it_may_hold(pristine) -> None:
    """A read of a 20 KB manifest asked the file for MAX_MANIFEST_BYTES + 1 at once, and a file's read(n) allocates
    n bytes first: 256 MiB of address space each time, so under `ulimit -v 500000` `verify` reported a sound
    store FAILED, its manifest "needed more memory than this process has" (limits59 F4)."""
    import tracemalloc

    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest

    location = StoreLocation.parse(str(pristine))
    tracemalloc.start()
    try:
        manifest = read_manifest(location)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert manifest.passages > 0
    assert peak < 16 << 20


def test_a_manifest_read_short_of_open_files_stops_verify_not_fails_the_store(pristine, monkeypatch) -> None:
    """(mut59b M12) Only a later file's read was made short of open files or memory in limits59 F5's test: the
    manifest's own could be reported as the store's problem (FAILED) again, and no test noticed."""
    from dilstore.storage import verify
    from dilstore.storage.format import StoreReadError

    def short(location: object) -> None:
        raise StoreReadError("reading manifest.json failed") from OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(verify, "read_manifest", short)
    with pytest.raises(DilstoreError, match="stopped before it could judge the store: this process holds as many"):
        verify_store(pristine)


def test_a_bounded_read_of_a_local_file_gives_at_most_one_byte_more_than_asked(tmp_path: Path) -> None:
    """(mut59b M9) Reading in blocks of at most _READ_BLOCK (limits59 F4) could read a whole block past the bound,
    which the caller measures a file as too long by, and no test noticed."""
    from dilstore.storage.location import StoreLocation

    (tmp_path / "f").write_bytes(bytes(range(100)))
    location = StoreLocation.parse(str(tmp_path))
    assert location.read_bytes("f", at_most=10) == bytes(range(11))
    assert location.read_bytes("f", at_most=500) == bytes(range(100))


@pytest.mark.parametrize(
    ("error", "address_space", "stops"),
    [
        (MemoryError(), 600 << 20, "this process ran out of memory under its address-space limit (ulimit -v) of 600"),
        (OSError(errno.EMFILE, "Too many open files"), None, "this process holds as many open files as it may"),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), None, "this process ran out of memory; raise the limit"),
        (RuntimeError("can't start new thread"), None, "no thread could be started"),
        (MemoryError(), None, None),  # no limit: a forged size asking for terabytes, damage as before
    ],
)
def test_a_verify_the_process_cannot_finish_stops_in_one_line_not_a_sound_store_failed(
    pristine, monkeypatch, error: BaseException, address_space: int | None, stops: str | None
) -> None:
    """Under `ulimit -v 600000` verify reported a sound store FAILED with 123 problems, every file "cannot be read:
    MemoryError"; too many open files or no thread to start would read the same (limits59 F5)."""

    from dilstore.storage.location import StoreLocation

    address_space_limit(monkeypatch, address_space)

    def failing(location: StoreLocation, relative: str) -> str:
        raise error

    monkeypatch.setattr(StoreLocation, "sha256", failing)
    if stops is None:
        problems = verify_store(pristine).problems
        assert problems and problems[0].endswith(": cannot be read: MemoryError")
        return
    with pytest.raises(DilstoreError, match=r"^verify of .* stopped before it could judge the store: ") as raised:
        verify_store(pristine)
    assert stops in str(raised.value) and str(raised.value).endswith("; raise the limit and run it again")


@pytest.mark.parametrize("error", [OSError(errno.EMFILE, "Too many open files"),
                                   RuntimeError("can't start new thread")])  # fmt: skip
def test_a_verify_short_of_files_or_threads_in_its_codebook_check_stops_not_a_sound_store_failed(
    pristine, monkeypatch, error: BaseException
) -> None:
    """The codebook check (store_codebook_problems) made a problem line of every failed read of a shard's
    attributes or codebook copy, a shortage of the process included: a sound store was FAILED ("shard-00000: cannot
    read its attributes: OSError: [Errno 24] Too many open files"), where limits59 F5 stops verify in one line
    naming the limit for the same shortage anywhere else (read59b F3)."""
    from dilstore.storage import verify
    from dilstore.storage.location import StoreLocation

    real = verify.store_codebook_problems

    def short_meanwhile(location: StoreLocation, *rest: object) -> list[str]:
        def refused(self: StoreLocation, relative: str = "") -> object:
            raise error

        monkeypatch.setattr(StoreLocation, "open_group", refused)  # the shards were read: the shortage comes now
        return real(location, *rest)

    monkeypatch.setattr(verify, "store_codebook_problems", short_meanwhile)
    with pytest.raises(DilstoreError, match=r"^verify of .* stopped before it could judge the store: "):
        verify_store(pristine)


def test_a_verify_short_of_open_files_listing_a_folder_stops_not_a_sound_store_with_missing_files(
    pristine, monkeypatch
) -> None:
    """The store's files were listed with os.walk, which skips a folder it cannot open: short of open files
    (EMFILE), verify called a sound store FAILED, each file of that folder "missing file ...", where limits59 F5
    stops it in one line naming the limit (read59b F4)."""
    real = os.scandir

    def short_of_files(path: object = ".") -> object:
        if os.fspath(path).endswith("shard-00001"):
            raise OSError(errno.EMFILE, "Too many open files", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", short_of_files)
    with pytest.raises(DilstoreError, match=r"^verify of .* stopped before it could judge the store: this process "
                                            r"holds as many open files as it may"):  # fmt: skip
        verify_store(pristine)
