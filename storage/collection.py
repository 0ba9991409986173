"""The BM25 collection of a store: the pyserini JSONL parts of the passages its id index reaches.

`dilstore precompute` writes one JSONL part per shard (pipelines/shard_sink.py),
line r of `part-s.jsonl` being row r of shard s. A store never appended to is
indexed from `STORE/passages/jsonl` as it is. An appended store has parts in
`passages/jsonl` and in each append's `appends/<generation>/passages/jsonl`,
and rows that an append with --replace superseded are still in their old parts;
`write_live_collection` gathers every part into one folder and leaves those
lines out, so BM25 never finds text the store no longer serves under that id.

The parts hold each passage's title and text as stored, but BM25 indexes them as questions are searched: with
Unicode's compatibility forms folded (`searched_form`, NFKC, as reader.text.tokenization.folded reads questions and
queries). A store whose collection holds text that folding changes is indexed from a folded copy.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path

from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import naming
from dilstore.storage.format import MANIFEST_FILE, append_dir
from dilstore.storage.manifest import ShardEntry
from dilstore.storage.passage_files import JSONL_DIR, PassageRow, jsonl_path
from dilstore.storage.reader import open_store


def collection_jsonl(rows: Sequence[PassageRow]) -> str:
    """A shard's JSONL part: pyserini JsonCollection lines `{"id", "contents"}`, contents = title, newline, text."""
    lines = (json.dumps({"id": row.id, "contents": f"{row.title}\n{row.text}"}, ensure_ascii=False) for row in rows)
    return "".join(f"{line}\n" for line in lines)


def collection_dir(store: Path) -> Path:
    """The JSONL folder a store never appended to is indexed from."""
    return store / JSONL_DIR


def is_appended(store: Path) -> bool:
    """Whether passages were appended to the finalized store (its collection is spread over several folders)."""
    if not (store / MANIFEST_FILE).is_file():
        return False
    with open_store(store) as opened:
        return bool(opened.manifest.appends)


def jsonl_part(store: Path, entry: ShardEntry) -> Path:
    """The JSONL part of a shard: in the store's folder, or in the folder of the append that wrote it."""
    folder = store if entry.generation is None else store / append_dir(entry.generation)
    return jsonl_path(folder, entry.index)


def searched_form(text: str) -> str:
    """A document's contents as BM25 indexes them: Unicode's compatibility forms folded (NFKC), as questions and
    queries are searched (reader.text.tokenization.folded; tests hold the two to one rule).

    Lucene's analyzer lowercases but folds nothing else, so an index of the text as stored missed every question
    word that a passage wrote in a decomposed form (`Zu\u0308rich`, text from macOS, Korean jamo), with a ligature
    (`ﬁnance`, text from PDFs) or in full width (`１９９８`, CJK text): the question is folded, the passage was not,
    and BM25 found nothing by those words (unicode56 F2).
    """
    return text if text.isascii() else unicodedata.normalize("NFKC", text)


def folds_anything(collection: Path) -> bool:
    """Whether `searched_form` changes the contents of some line of the JSONL parts in the folder `collection` (a
    line that is no collection document is left to the index build, which names it)."""
    for part in sorted(collection.glob("*.jsonl")):
        with part.open(encoding="utf-8", errors="replace", newline="\n") as lines:
            if any(_searched_line(line) is not line for line in lines):
                return True
    return False


def write_live_collection(store: Path, target: Path, *, searched: bool = False) -> int:
    """Write the store's JSONL parts into `target` without the lines of superseded rows; the number of parts.
    With `searched`, each document's contents are written in their `searched_form`, for a BM25 index to read."""
    target.mkdir(parents=True, exist_ok=True)
    parts = 0
    for source, kept in _live_parts(store):
        lines = [_searched_line(line) for line in kept] if searched else kept
        with naming(target / source.name):  # $TMPDIR's disk, full, was not named (full49 F4)
            (target / source.name).write_text("".join(lines), encoding="utf-8")
        parts += 1
    return parts


def _searched_line(line: str) -> str:
    """A collection line with its contents in their `searched_form`: the line itself when folding changes nothing
    (the id is the store's and stays as it is)."""
    if line.isascii() or unicodedata.is_normalized("NFKC", line):
        return line
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return line
    if not isinstance(record, dict) or not isinstance(record.get("contents"), str):
        return line
    contents = searched_form(record["contents"])
    if contents == record["contents"]:
        return line
    return json.dumps({**record, "contents": contents}, ensure_ascii=False) + "\n"


def document_digest(passage_id: str, contents: str) -> int:
    """One collection document's share of `collection_digest`: its SHA-256 as a number, of the contents in their
    `searched_form`, so that an index of the folded copy and one built before the folding both match the store."""
    text = f"{passage_id}\x00{searched_form(contents)}"
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest())


def collection_digest(store: Path) -> tuple[int, int]:
    """The live collection `dilstore index` indexes (the lines `write_live_collection` keeps), as its number of
    documents and the sum of their `document_digest`s modulo 2**256: a fingerprint of the documents whatever their
    order, which an index's own documents must give (Lucene orders them as its threads read them), in constant
    memory for any store."""
    documents, total = 0, 0
    for _, kept in _live_parts(store):
        for line in kept:
            record = json.loads(line)
            documents, total = documents + 1, (total + document_digest(record["id"], record["contents"])) % 2**256
    return documents, total


def _live_parts(store: Path) -> Iterator[tuple[Path, list[str]]]:
    """Each of the store's JSONL parts with its lines, less those of superseded rows."""
    with open_store(store) as opened:
        superseded: dict[int, set[int]] = defaultdict(set)
        found = opened.superseded()
        for shard, row in zip(found.shards.tolist(), found.rows.tolist(), strict=True):
            superseded[shard].add(row)
        entries = opened.manifest.shards
    for entry in entries:
        source = jsonl_part(store, entry)
        with source.open(encoding="utf-8", newline="\n") as part:
            lines = part.readlines()  # "\n" ends a line, not U+2028 or U+0085 inside a title (str.splitlines)
        if len(lines) != entry.passages:
            raise DilstoreError(f"{source} has {len(lines)} lines for the {entry.passages} rows of {entry.name}")
        dropped = superseded.get(entry.index, set())
        yield source, [line for row, line in enumerate(lines) if row not in dropped]
