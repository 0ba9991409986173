"""`dilstore train ranking-data`: SQuAD → (query, gold paragraph, BM25 negatives) triples, and reading them back.

The sampling is tested with an injected retriever (no JVM in this process);
one end-to-end run builds a real pyserini index over the tiny three-article
corpus in a subprocess, as users run it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from dilstore.pipelines.corpus_squad import paragraph_id
from dilstore.reader.data.ranking_data import (
    SUMMARY_FILE,
    build_ranking_data,
    read_squad_ranking,
    require_written_together,
    sample_negatives,
    squad_paragraph_id,
)
from dilstore.reader.data.ranking_files import (
    PARAGRAPHS_FILE,
    TRIPLES_FILE,
    Triple,
    read_paragraphs,
    read_triples,
    write_triples,
)
from dilstore.storage.errors import DilstoreError
from tests.fixtures.pipeline_fixtures import dilstore_command
from tests.fixtures.ranking_fixtures import write_squad_articles


@pytest.fixture(scope="module")
def squad_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_squad_articles(tmp_path_factory.mktemp("squad") / "train.json")


def every_paragraph_retriever(corpus: Sequence[str]):
    """A stand-in for BM25: every paragraph, in a question-dependent rotation, with descending scores."""

    def retrieve(queries: Sequence[tuple[str, str]], depth: int) -> dict[str, list[tuple[str, float]]]:
        found = {}
        for qid, query in queries:
            shift = len(query) % len(corpus)
            ranked = [*corpus[shift:], *corpus[:shift]][:depth]
            found[qid] = [(pid, float(depth - rank)) for rank, pid in enumerate(ranked)]
        return found

    return retrieve


def test_paragraph_ids_are_the_pipelines_ids(squad_file: Path) -> None:
    collection = read_squad_ranking(squad_file)
    assert list(collection.paragraphs)[:3] == ["Zürich_Tram#p0", "Zürich_Tram#p1", "Zürich_Tram#p2"]
    assert squad_paragraph_id("Marie_Curie", 1) == paragraph_id("Marie_Curie", 1)
    assert len(collection.paragraphs) == 8 and len(collection.questions) == 9
    curie = {question.qid: question.positive for question in collection.questions}
    assert curie["q-curie-physics"] == curie["q-curie-chemistry"] == "Marie_Curie#p0"


def test_negatives_are_distinct_non_gold_and_seeded(squad_file: Path) -> None:
    collection = read_squad_ranking(squad_file)
    corpus = list(collection.paragraphs)
    retrieved = every_paragraph_retriever(corpus)([(q.qid, q.query) for q in collection.questions], 30)
    triples, stats = sample_negatives(collection.questions, retrieved, collection.paragraphs, 4, seed=1)
    assert stats.filled_questions == 0 and stats.questions == 9
    for triple, question in zip(triples, collection.questions, strict=True):
        assert triple.positive == question.positive and triple.query == question.query
        assert len(triple.negatives) == len(set(triple.negatives)) == 4
        assert triple.positive not in triple.negatives
    again, _ = sample_negatives(collection.questions, retrieved, collection.paragraphs, 4, seed=1)
    other, _ = sample_negatives(collection.questions, retrieved, collection.paragraphs, 4, seed=2)
    assert again == triples and other != triples
    first_three, _ = sample_negatives(collection.questions[:3], retrieved, collection.paragraphs, 4, seed=1)
    assert first_three == triples[:3], "a question's draw does not depend on the other questions"


def test_short_bm25_lists_are_filled_and_counted(squad_file: Path) -> None:
    collection = read_squad_ranking(squad_file)
    corpus = list(collection.paragraphs)
    gold_only = {q.qid: [(q.positive, 9.0)] for q in collection.questions[:2]}
    gold_only[collection.questions[0].qid].append((corpus[-1], 1.0))  # one real BM25 negative for question 0
    triples, stats = sample_negatives(collection.questions[:3], gold_only, collection.paragraphs, 3, seed=0)
    assert (stats.filled_questions, stats.filled_negatives) == (3, 2 + 3 + 3)
    assert corpus[-1] in triples[0].negatives
    for triple in triples:
        assert len(set(triple.negatives)) == 3 and triple.positive not in triple.negatives
    with pytest.raises(DilstoreError, match="too few for 8 negatives"):
        sample_negatives(collection.questions, gold_only, collection.paragraphs, 8, seed=0)


def test_a_paragraph_with_the_gold_text_under_another_id_is_never_a_negative(squad_file: Path) -> None:
    """SQuAD-train repeats a few paragraphs under two ids; BM25 ranks the twin first, and it was drawn as a negative
    of its own text. Other questions draw exactly as before."""
    collection = read_squad_ranking(squad_file)
    question = collection.questions[0]
    twin = "Twin#p0"
    paragraphs = {**collection.paragraphs, twin: "  " + " \n".join(collection.paragraphs[question.positive].split())}
    ids = list(paragraphs)
    everything = {q.qid: [(pid, float(len(ids) - rank)) for rank, pid in enumerate(ids)] for q in collection.questions}
    negatives = len(ids) - 2  # every paragraph but the gold one and its twin
    triples, stats = sample_negatives(collection.questions, everything, paragraphs, negatives, seed=3)
    twins_of_gold = [q for q in collection.questions if q.positive == question.positive]
    assert stats.twin_questions == len(twins_of_gold) and stats.filled_questions == 0
    for triple in triples:
        if triple.positive == question.positive:
            assert set(triple.negatives) == set(ids) - {question.positive, twin}
    untouched = [q for q in collection.questions if q.positive != question.positive]
    without_twin = {q.qid: [(pid, score) for pid, score in everything[q.qid] if pid != twin] for q in untouched}
    before, _ = sample_negatives(untouched, without_twin, collection.paragraphs, 3, seed=3)
    after, _ = sample_negatives(untouched, without_twin, paragraphs, 3, seed=3)
    assert after == before
    with pytest.raises(DilstoreError, match=rf"question '{question.qid}': the corpus has too few paragraphs whose "
                                            r"text differs from its gold paragraph's for 8 negatives"):  # fmt: skip
        sample_negatives([question], {question.qid: []}, paragraphs, len(ids) - 1, seed=3)


def test_too_many_negatives_are_refused_before_any_search_or_output(squad_file: Path, tmp_path: Path) -> None:
    """It was found only after the BM25 index was built and every question searched, leaving work/ behind."""
    paragraphs = len(read_squad_ranking(squad_file).paragraphs)

    def retriever(queries: object, depth: int) -> dict:
        raise AssertionError("searched before the negatives were checked")

    with pytest.raises(DilstoreError, match=rf"the corpus has {paragraphs} paragraph\(s\): too few for 99 negatives"):
        build_ranking_data(squad_file, tmp_path / "out", negatives=99, depth=5, seed=4, retriever=retriever)
    assert not (tmp_path / "out").exists()


def test_build_writes_deterministic_gzip_files(squad_file: Path, tmp_path: Path) -> None:
    collection = read_squad_ranking(squad_file)
    retriever = every_paragraph_retriever(list(collection.paragraphs))
    first = build_ranking_data(squad_file, tmp_path / "a", negatives=3, depth=5, seed=4, retriever=retriever)
    build_ranking_data(squad_file, tmp_path / "b", negatives=3, depth=5, seed=4, retriever=retriever)
    for name in (TRIPLES_FILE, PARAGRAPHS_FILE):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert first.questions == 9 and first.index is None
    assert json.loads((tmp_path / "a" / SUMMARY_FILE).read_text())["seed"] == 4
    paragraphs = read_paragraphs(tmp_path / "a" / PARAGRAPHS_FILE)
    triples = read_triples(tmp_path / "a" / TRIPLES_FILE, paragraphs, tmp_path / "a" / PARAGRAPHS_FILE)
    assert [triple.qid for triple in triples] == [q.qid for q in collection.questions]
    assert set(paragraphs) == {pid for t in triples for pid in (t.positive, *t.negatives)}
    assert all(paragraphs[pid] == collection.paragraphs[pid] for pid in paragraphs)
    limited = build_ranking_data(squad_file, tmp_path / "c", negatives=3, depth=5, seed=4, limit=2, retriever=retriever)
    assert limited.questions == 2


def test_files_of_two_runs_in_one_folder_are_refused(squad_file: Path, tmp_path: Path) -> None:
    """A re-run into the folder of an earlier run, stopped between its writes, left its new triples beside the old
    paragraphs under the old summary (longrun45 F4): training read a mixed set."""
    retriever = every_paragraph_retriever(list(read_squad_ranking(squad_file).paragraphs))
    old, new = tmp_path / "old", tmp_path / "new"
    summary = build_ranking_data(squad_file, old, negatives=2, depth=5, seed=4, limit=6, retriever=retriever)
    build_ranking_data(squad_file, new, negatives=1, depth=5, seed=9, limit=1, retriever=retriever)
    triples, paragraphs = old / TRIPLES_FILE, old / PARAGRAPHS_FILE
    assert json.loads((old / SUMMARY_FILE).read_text())["triples_sha256"] == summary.triples_sha256
    require_written_together(triples, paragraphs)
    for name in (TRIPLES_FILE, PARAGRAPHS_FILE):
        kept = (old / name).read_bytes()
        (old / name).write_bytes((new / name).read_bytes())  # the stopped re-run's first file
        with pytest.raises(DilstoreError, match=rf"^{old / name} is not the file {old / SUMMARY_FILE} describes"):
            require_written_together(triples, paragraphs)
        (old / name).write_bytes(kept)
    require_written_together(triples, new / PARAGRAPHS_FILE)  # a --paragraphs from elsewhere is the user's choice
    (old / TRIPLES_FILE).write_bytes((new / TRIPLES_FILE).read_bytes())
    (old / SUMMARY_FILE).unlink()
    require_written_together(triples, paragraphs)  # triples made by other tools: taken as they are


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode("utf-8")))
    return path


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"qid": "q2", "query": "x", "pos": "a", "negs": ["b"]',
         ":2: not valid JSON (column 54: Expecting ',' delimiter)"),
        ('["q2"]', ":2: expected a JSON object"),
        ('{"qid": "q2", "query": "x", "pos": "zz", "negs": ["b"]}', ":2: paragraph id 'zz' is not in "),
        ('{"qid": "q2", "query": "x", "pos": "a", "negs": ["zz"]}', ":2: paragraph id 'zz' is not in "),
        ('{"qid": "q2", "query": "x", "pos": "a", "negs": "b"}', ':2: "negs" must be a list'),
        ('{"qid": "q2", "query": "x", "negs": ["b"]}', ":2: 'pos' must be a non-empty string"),
        ('{"qid": "q2", "query": "x", "pos": "a", "negs": ["a", "b"]}', ":2: the positive 'a' of 'q2' is also"),
        ('{"qid": "q2", "query": "x", "pos": "a", "negs": ["b", "b"]}', ":2: the negative 'b' of 'q2' is listed twice"),
        ('{"qid": "q2", "query": "x\\ud800", "pos": "a", "negs": ["b"]}', ":2: 'query' holds a lone surrogate U+D800"),
    ],
)
def test_bad_triples_name_file_and_line(line: str, message: str, tmp_path: Path) -> None:
    paragraphs_file = tmp_path / PARAGRAPHS_FILE
    paragraphs_file.write_bytes(gzip.compress(b'{"id": "a", "contents": "A."}\n{"id": "b", "contents": "B."}\n'))
    good = json.dumps(Triple("q1", "y", "a", ("b",)).to_dict())
    path = write_lines(tmp_path / TRIPLES_FILE, [good, line])
    with pytest.raises(DilstoreError) as caught:
        read_triples(path, read_paragraphs(paragraphs_file), paragraphs_file)
    assert str(caught.value).startswith(f"{path}:2: ")
    assert message in str(caught.value)


def test_a_paragraph_of_only_whitespace_is_refused_as_empty(tmp_path: Path) -> None:
    """A paragraph of spaces and line breaks is no text to rank: a negative that reads as nothing."""
    for blank in (" ", "\n\t ", "\u3000"):
        path = write_lines(tmp_path / "p.jsonl.gz", ['{"id": "a", "contents": "A."}',
                                                      json.dumps({"id": "b", "contents": blank})])  # fmt: skip
        with pytest.raises(DilstoreError, match=rf"^{path}:2: paragraph 'b' has empty contents$"):
            read_paragraphs(path)


def test_the_first_negatives_of_a_longer_list_are_kept(tmp_path: Path) -> None:
    """The builder writes negatives in sampled order, so the first N are a uniform draw of N; training reads those."""
    paragraphs = {pid: f"Paragraph {pid}." for pid in "abcdef"}
    path = write_lines(tmp_path / TRIPLES_FILE, [json.dumps(Triple("q1", "y", "a", tuple("fedcb")).to_dict())])
    for negatives in range(1, 6):
        kept = read_triples(path, paragraphs, tmp_path / PARAGRAPHS_FILE, negatives=negatives)[0].negatives
        assert kept == tuple("fedcb")[:negatives]
    assert read_triples(path, paragraphs, tmp_path / PARAGRAPHS_FILE)[0].negatives == tuple("fedcb")


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2028", "\x85"])
def test_a_line_of_unicode_space_is_a_bad_line_not_a_blank_one(space: str, tmp_path: Path) -> None:
    """Only the ASCII whitespace bytes.strip() removes makes a line blank; JSON reads no other space, so a line of
    another space is named like any line that is not JSON, not skipped."""
    good = json.dumps(Triple("q1", "y", "a", ("b",)).to_dict())
    path = write_lines(tmp_path / TRIPLES_FILE, [good, space, "", good])
    with pytest.raises(DilstoreError, match=rf"^{path}:2: not valid JSON"):
        read_triples(path, {"a": "A", "b": "B"}, tmp_path / PARAGRAPHS_FILE)
    paragraphs = write_lines(tmp_path / PARAGRAPHS_FILE, ['{"id": "a", "contents": "A."}', space])
    with pytest.raises(DilstoreError, match=rf"^{paragraphs}:2: not valid JSON"):
        read_paragraphs(paragraphs)


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DilstoreError, match="no such file"):
        read_paragraphs(tmp_path / "missing.jsonl.gz")
    duplicate = write_lines(tmp_path / "dup.jsonl.gz", ['{"id": "a", "contents": "A"}', '{"id": "a", "contents": "B"}'])
    with pytest.raises(DilstoreError, match=r"dup.jsonl.gz:2: paragraph id 'a' appears twice \(first on line 1\)"):
        read_paragraphs(duplicate)
    truncated = tmp_path / "cut.jsonl.gz"
    write_triples(truncated, [Triple(f"q{i}", "query words", "a", ("b",)) for i in range(500)])
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(DilstoreError, match="cut.jsonl.gz: not a complete gzip file"):
        read_triples(truncated, {"a": "A", "b": "B"}, tmp_path / "p")
    misnamed = tmp_path / "plain.jsonl.gz"
    misnamed.write_text('{"qid": "q1", "query": "y", "pos": "a", "negs": ["b"]}\n')
    with pytest.raises(DilstoreError, match=r"plain.jsonl.gz: not a gzip file \(.*\); a plain text file needs a name"):
        read_triples(misnamed, {"a": "A", "b": "B"}, tmp_path / "p")
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"qid": "q1", "query": "y", "pos": "a", "negs": ["b"]}\n')
    assert read_triples(plain, {"a": "A", "b": "B"}, tmp_path / "p", negatives=1)[0].negatives == ("b",)


@pytest.mark.slow
def test_a_work_folder_that_is_a_file_is_named_by_its_flag(squad_file: Path, tmp_path: Path, capsys) -> None:
    """It said "Not a directory: FILE/collection.sha256" and left an empty output folder (train46 F5)."""
    from dilstore.runners.cli import main

    output = tmp_path / "data"
    status = main(["train", "ranking-data", "--squad", str(squad_file), "--output", str(output),
                   "--work", str(squad_file)])  # fmt: skip
    assert status == 2
    assert capsys.readouterr().err == f"dilstore train: error: --work {squad_file}: is a file, not a folder\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == []
    under = squad_file / "work"  # review46 L4: a folder under a file
    assert main(["train", "ranking-data", "--squad", str(squad_file), "--output", str(output),
                 "--work", str(under)]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"dilstore train: error: --work {under}: {squad_file} is a file, not a folder\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == []


def test_cli_builds_triples_from_a_real_bm25_index(squad_file: Path, tmp_path: Path) -> None:
    """`train ranking-data` indexes the paragraphs with pyserini, retrieves and samples; a rerun reuses the index."""
    output = tmp_path / "data"
    arguments = ["train", "ranking-data", "--squad", str(squad_file), "--output", str(output),
                 "--negatives", "2", "--depth", "4", "--seed", "3", "--json"]  # fmt: skip
    built = dilstore_command(arguments)
    assert built.returncode == 0, built.stderr
    summary = json.loads(built.stdout.strip().splitlines()[-1])
    assert summary["questions"] == 9 and summary["corpus_paragraphs"] == 8 and summary["depth"] == 4
    assert summary["index"] == str(output / "work" / "bm25")
    paragraphs = read_paragraphs(output / PARAGRAPHS_FILE)
    triples = read_triples(output / TRIPLES_FILE, paragraphs, output / PARAGRAPHS_FILE, negatives=2)
    for triple in triples:
        assert triple.positive not in triple.negatives and len(set(triple.negatives)) == 2
    # BM25 finds the other Kilimanjaro paragraph for this question (a list shorter than 2 keeps all its hits).
    summit = next(triple for triple in triples if triple.qid == "q-kili-summit")
    assert "Kilimanjaro#p0" in summit.negatives
    segments = {path.name: path.stat().st_mtime_ns for path in (output / "work" / "bm25").glob("segments_*")}
    rerun = dilstore_command([*arguments[:-2], "4", "--json"])
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout.strip().splitlines()[-1])["seed"] == 4
    assert {path.name: path.stat().st_mtime_ns for path in (output / "work" / "bm25").glob("segments_*")} == segments


def test_a_collection_a_full_disk_cuts_short_names_its_file(tmp_path: Path) -> None:
    """`train ranking-data`'s collection for its BM25 index, written on a full disk, ended the command in "error: No
    space left on device" alone, naming no file (disk56 F6). A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) in a
    child process makes the write fail as a full disk does."""
    import subprocess
    import sys

    from tests.fixtures.paths import ROOT

    child = """
import resource, signal, sys
from pathlib import Path
from dilstore.reader.data.ranking_data import write_collection
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (300, resource.RLIM_INFINITY))
try:
    write_collection({f"p{number}": "words " * 20 for number in range(10)}, Path(sys.argv[1]))
except OSError as error:
    print(error.errno, error.filename)
"""
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "collection")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout.split() == ["27", str(tmp_path / "collection" / "paragraphs.jsonl")], done.stderr
