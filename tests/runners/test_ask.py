"""`dilstore ask`: the interactive session survives bad questions (a real subprocess fed through stdin).

The index is built and the command run in child processes, so this module
never starts the JVM itself.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.retrieval import Hit
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader
from dilstore.runners.cmd_ask import highlight, interactive, print_answer, printable
from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError
from dilstore.storage.reader import open_store
from tests.fixtures.odqa_fixtures import collection_documents, write_collection, write_reader_and_store
from tests.fixtures.paths import ROOT
from tests.fixtures.pipeline_fixtures import dilstore_commands

GOOD = "When did the Zürich tram network open?"
SESSION = ["\ufeff" + GOOD, "", "   ", "word " * 10_000, "Xylophone mallets?", "How high is Mount Kilimanjaro?"]


@pytest.fixture(scope="module")
def store_and_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ask")
    model_dir, store_dir, _ = write_reader_and_store(root)
    return store_dir, model_dir


@pytest.fixture(scope="module")
def index(store_and_model: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One BM25 index, built in a child (the JVM stays out of this process), over four stored passages and a ghost
    the store lacks; the ghost shares no word with GOOD, so only a question about xylophones reaches it."""
    store_dir, _ = store_and_model
    root = tmp_path_factory.mktemp("ask-index")
    documents = collection_documents(store_dir, ["tram#0", "curie#0", "kili#0", "cafe#0"])
    write_collection(root / "collection" / "passages.jsonl", [*documents, ("ghost#0", "Xylophone mallets.")])
    build = (
        "import sys; from pathlib import Path; from dilstore.reader.retrieval import build_bm25_index as build; "
        "build(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    subprocess.run([sys.executable, "-c", build, str(root / "collection"), str(root / "bm25")], check=True, cwd=ROOT,
                   capture_output=True, timeout=300)  # fmt: skip
    return root / "bm25"


def test_interactive_session_in_a_subprocess(store_and_model: tuple[Path, Path], index: Path, tmp_path: Path) -> None:
    """Bad questions are reported and the session goes on; a store rebuilt under it ends it (odqa43 M1: once its
    shards were open, the session answered from the deleted build, exit 0)."""
    store_dir = tmp_path / "store"
    shutil.copytree(store_and_model[0], store_dir)
    command = [sys.executable, "-m", "dilstore.runners.cli", "ask", str(store_dir), "--model", str(store_and_model[1]),
               "--index", str(index), "--threads", "1"]  # fmt: skip
    with (tmp_path / "stderr").open("w+") as stderr:
        session = subprocess.Popen([*command, "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                   text=True, cwd=ROOT)  # fmt: skip
        session.stdin.write("\n".join(SESSION) + "\n")
        session.stdin.flush()
        watchdog = threading.Timer(300, session.kill)  # a line never written fails the test instead of hanging it
        watchdog.start()
        try:
            answers = [json.loads(session.stdout.readline() or "null") for _ in range(4)]
        finally:
            watchdog.cancel()
        assert None not in answers, "the session wrote fewer lines than its input's non-blank lines"
        shutil.move(store_dir, tmp_path / "old")  # what --overwrite does: the new build takes the old one's place
        shutil.copytree(store_and_model[0], store_dir)
        out, _ = session.communicate(f"{GOOD}\n", timeout=300)
        stderr.seek(0)
        lines = stderr.read().splitlines()
    assert session.returncode == 2, lines  # it was 0 after two refused questions (docs39 M1); the session goes on
    # The opening byte-order mark is no part of the question; blank lines are passed over, not errors. Each other
    # line gives one object, numbered, an answer or an error (ask50 F2).
    assert [answer.get("question") for answer in answers] == [GOOD, None, None, "How high is Mount Kilimanjaro?"]
    assert [answer["line"] for answer in answers] == [1, 4, 5, 6]
    assert "ghost#0" in answers[2]["error"] and "line" not in answers[2]["error"]
    assert [json.loads(line) for line in out.splitlines()] == [{"line": 7, "error": json.loads(out)["error"]}]
    errors = [line for line in lines if line.startswith("dilstore ask: error:")]
    assert len(errors) == 3
    assert "longer than 64 tokens" in errors[0] or "characters long" in errors[0]
    assert "ghost#0" in errors[1] and "not in store" in errors[1]
    assert "replaced by another file after the store was opened" in errors[2], errors[2]
    assert errors[2].endswith("the session ends: start `dilstore ask` again to read the store as it is now")
    command = [sys.executable, "-m", "dilstore.runners.cli", "ask", str(store_dir), "--model", "no-model"]
    closed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300,
                            preexec_fn=lambda: os.close(0))  # fmt: skip  # `ask STORE <&-`: sys.stdin is None
    assert closed.returncode == 2 and "Traceback" not in closed.stderr, closed.stderr
    assert closed.stderr.strip().endswith("no question given and standard input is closed: give a QUESTION or "
                                          "questions on stdin")  # fmt: skip


class OneHitSearcher:
    def search(self, query: str, k: int) -> list[Hit]:
        return [Hit("tram#0", 7.5)]


def test_interactive_loop_prints_text_answers_and_errors(store_and_model: tuple[Path, Path]) -> None:
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher(),
                            OdqaSettings(mu=0.5))  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    assert interactive(odqa, io.StringIO(f"\n \n{GOOD}\n"), out, err, as_json=False) == 0
    assert err.getvalue() == ""  # blank lines are passed over
    text = out.getvalue()
    assert text.count("answer: ") == 1 and "passage: tram#0 (Zürich trams)" in text and "[[" in text
    assert "0.5 * reader" in text and "0.5 * bm25 7.5000" in text and "timings: retrieval" in text
    assert f"\nread from: {odqa.store.fingerprint.encoding} store\ntimings: " in text


def test_an_answer_names_the_store_s_encoding_and_the_online_layers_it_was_read_with(
    store_and_model: tuple[Path, Path], monkeypatch
) -> None:
    """Neither the text nor the JSON said which encoding, or which online layers, gave the answer (lowbit39 L1)."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher())
    monkeypatch.setattr(odqa.model, "online_variant", "online-2bit.safetensors")
    text, document = io.StringIO(), io.StringIO()
    interactive(odqa, io.StringIO(f"{GOOD}\n"), text, io.StringIO(), as_json=False)
    interactive(odqa, io.StringIO(f"{GOOD}\n"), document, io.StringIO(), as_json=True)
    encoding = odqa.store.fingerprint.encoding
    assert f"\nread from: {encoding} store, online layers online-2bit.safetensors\n" in text.getvalue()
    answer = json.loads(document.getvalue())
    assert (answer["encoding"], answer["online_variant"]) == (encoding, "online-2bit.safetensors")


class NoHitSearcher:
    def search(self, query: str, k: int) -> list[Hit]:
        return []


def test_a_question_bm25_finds_nothing_for_says_so(store_and_model: tuple[Path, Path]) -> None:
    """It said "no retrieved passage gave a valid span", of no passage at all."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), NoHitSearcher())
    out = io.StringIO()
    print_answer(odqa.answer("qwertyzxcv blorf"), False, out, odqa.read_with)
    assert "answer: (none: BM25 retrieved no passage for it)\n" in out.getvalue()


def test_highlight_wraps_the_span() -> None:
    assert highlight("opened in 1882 by", 10, 14) == "opened in [[1882]] by"


def test_printable_escapes_control_characters() -> None:
    assert printable("plain text, ümlauts and 中文") == "plain text, ümlauts and 中文"
    assert printable("red \x1b[31malert\x07\r\n") == "red \\x1b[31malert\\x07\\r\\n"


def test_text_answers_escape_control_characters(store_and_model: tuple[Path, Path]) -> None:
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher(),
                            OdqaSettings(mu=0.5))  # fmt: skip
    out = io.StringIO()
    interactive(odqa, io.StringIO("When did the \x1b[2J tram open?\n"), out, io.StringIO(), as_json=False)
    assert "\x1b" not in out.getvalue() and "question: When did the \\x1b[2J tram open?" in out.getvalue()


def test_a_line_that_is_not_utf8_is_reported_and_the_session_goes_on(store_and_model: tuple[Path, Path]) -> None:
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher(),
                            OdqaSettings(mu=0.5))  # fmt: skip
    raw = io.TextIOWrapper(io.BytesIO(b"Tram \xff\xfe open?\n\n" + GOOD.encode() + b"\n\xe2\x80\x8b\n"),
                           errors="surrogateescape")  # fmt: skip
    out, err = io.StringIO(), io.StringIO()
    assert interactive(odqa, raw, out, err, as_json=True) == 2  # was 0: a script could not tell a question was lost
    assert err.getvalue().splitlines() == [  # each names its input line, a blank one counted (qa48 L3)
        "dilstore ask: error: line 1: the question is not UTF-8 text (byte at character 6); skipped",
        "dilstore ask: error: line 4: the question '\\u200b' has no word pieces after tokenization"]
    assert [json.loads(line) for line in out.getvalue().splitlines()][::2] == [
        {"line": 1, "error": "the question is not UTF-8 text (byte at character 6); skipped"},
        {"line": 4, "error": "the question '\\u200b' has no word pieces after tokenization"}]  # fmt: skip
    assert json.loads(out.getvalue().splitlines()[1])["question"] == GOOD


class TerminalBytes(io.TextIOWrapper):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("at_a_terminal", [False, True], ids=["piped", "terminal"])
def test_piped_questions_are_read_as_utf8_whatever_the_locale(at_a_terminal: bool) -> None:
    """(left57 F5) stdin was read in the locale's encoding: under a Latin-1 locale a piped UTF-8 question file read
    `Zürich` as `ZÃ¼rich` and was answered without a word. Piped or from a file, questions are UTF-8 as every other
    input file is; typed at a terminal they are in the locale's encoding, which the terminal sends. A byte the
    encoding cannot read is still a lone surrogate for the session to report, not a decode error that ends it."""
    from dilstore.runners.cmd_ask import question_input

    kind = TerminalBytes if at_a_terminal else io.TextIOWrapper
    stdin = kind(io.BytesIO("Zürich?\n".encode() + b"Tram \xff?\n"), encoding="latin-1")
    lines = question_input(stdin).readlines()
    assert lines == (["ZÃ¼rich?\n", "Tram ÿ?\n"] if at_a_terminal else ["Zürich?\n", "Tram \udcff?\n"])


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_questions_piped_in_are_refused_as_utf16(encoding: str) -> None:
    """(left57 F8) A UTF-16 question file piped in was "line 1: the question is not UTF-8 text (byte at character
    1)", then questions with a NUL between their letters, answered with nothing found: it is refused at its first
    line as the question files of the other commands are, before anything is answered."""
    from dilstore.runners.cmd_ask import question_input

    stdin = question_input(io.TextIOWrapper(io.BytesIO("Who?\nWhen?\n".encode(encoding)), encoding="latin-1"))
    out = io.StringIO()
    with pytest.raises(DilstoreError, match=r"^standard input: it looks like UTF-16 text; questions from a file or "
                                            r"pipe are read as UTF-8: convert it \(e\.g\. `iconv -f UTF-16"):
        interactive(None, stdin, out, io.StringIO(), as_json=True)  # type: ignore[arg-type]  # no question is read
    assert out.getvalue() == ""
    from dilstore.runners.cmd_ask import _refuse_utf16

    _refuse_utf16("\ud800a\x00b\x00")  # a lone surrogate no stream gives, from a library caller: looked past (mut57c)


def test_a_store_rebuilt_under_the_session_ends_it(store_and_model: tuple[Path, Path], monkeypatch) -> None:
    """After an --overwrite under a stdin session, some questions were answered from the old store and others failed
    with "reopen the store", to the end of the input (conc39 L4): the session ends at the first such error."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher(),
                            OdqaSettings(mu=0.5))  # fmt: skip

    def rebuilt(question: str) -> None:
        raise StoreChangedError("store S was rebuilt after it was opened; reopen the store")

    monkeypatch.setattr(odqa, "answer", rebuilt)
    out, err = io.StringIO(), io.StringIO()
    assert interactive(odqa, io.StringIO(f"{GOOD}\n{GOOD}\n"), out, err, as_json=True) == 2
    assert err.getvalue().splitlines() == ["dilstore ask: error: line 1: store S was rebuilt after it was opened; "
                                           "reopen the store; the session ends: start `dilstore ask` again to read "
                                           "the store as it is now"]  # fmt: skip
    assert json.loads(out.getvalue())["line"] == 1 and len(out.getvalue().splitlines()) == 1


def test_a_question_argument_that_is_not_utf8_is_refused_before_the_store_opens(tmp_path: Path, capsys) -> None:
    """Python decodes argv's bad bytes to U+DC80..U+DCFF; the error names the byte, not the tokenizer's TypeError."""
    from dilstore.runners.cli import main

    assert main(["ask", str(tmp_path / "no-store"), "Tram \udcff open?", "--model", str(tmp_path / "no-model")]) == 2
    assert capsys.readouterr().err == "dilstore ask: error: the question is not UTF-8 text (byte at character 6)\n"
    # A blank question too, where it waited 9 s for the model, the maps and the JVM (odqa43 L1).
    assert main(["ask", str(tmp_path / "no-store"), " \t", "--model", str(tmp_path / "no-model")]) == 2
    assert capsys.readouterr().err == "dilstore ask: error: the question is empty\n"


def test_ask_and_evaluate_qa_refuse_a_store_url_without_an_index(store_and_model: tuple[Path, Path], tmp_path: Path,
                                                                  capsys) -> None:  # fmt: skip
    from dilstore.runners.cli import main
    from tests.fixtures.http_store import serve_directory

    store_dir, model_dir = store_and_model
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question": GOOD, "answer": ["1882"]}) + "\n", encoding="utf-8")
    with serve_directory(store_dir.parent) as server:
        url = f"{server.url}/{store_dir.name}"
        for command in (["ask", url, GOOD], ["evaluate-qa", url, "--questions", str(questions)]):
            assert main([*command, "--model", str(model_dir), "--threads", "1"]) == 2
            err = capsys.readouterr().err
            assert f"store {url} is not on the local filesystem" in err and "(--index DIR; index= in Python)" in err


def test_ask_reads_a_store_at_an_http_url_like_the_local_path(store_and_model: tuple[Path, Path]) -> None:
    """The store from a real HTTP server on 127.0.0.1, the BM25 index local (--index): the same answers."""
    from tests.fixtures.http_store import serve_directory

    store_dir, model_dir = store_and_model
    local = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher(),
                             OdqaSettings(mu=0.5))  # fmt: skip
    with serve_directory(store_dir.parent) as server:
        store = open_store(f"{server.url}/{store_dir.name}")
        remote = OpenDomainReader(local.model, store, OneHitSearcher(), OdqaSettings(mu=0.5))
        answers = [odqa.answer(GOOD).to_dict() for odqa in (local, remote)]
    for answer in answers:
        answer.pop("timings")
    assert answers[0] == answers[1] and answers[0]["passage_id"] == "tram#0"


@pytest.mark.slow
def test_ask_command_with_a_store_url_in_a_subprocess(store_and_model: tuple[Path, Path], index: Path) -> None:
    """`dilstore ask http://... --index DIR` (BM25 over a local index, JVM in the child) answers like the local path."""
    from tests.fixtures.http_store import serve_directory

    store_dir, model_dir = store_and_model
    with serve_directory(store_dir.parent) as server:
        places = (str(store_dir), f"{server.url}/{store_dir.name}")
        asked = dilstore_commands(*(["ask", where, GOOD, "--model", str(model_dir), "--index", str(index),
                                     "--top-p", "3", "--threads", "1", "--json"] for where in places))
    answers = []
    for done in asked:
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        answer.pop("timings")
        answers.append(answer)
    assert answers[0] == answers[1]


class TerminalAfterCtrlD(io.StringIO):
    """A terminal where Ctrl-D mid-line gave `text` without its newline: reading again would wait for more keys."""

    def readline(self, size: int | None = -1) -> str:
        line = super().readline()
        assert line, "read again after the input had ended mid-line: the user had to press Ctrl-D once more"
        return line


def test_input_that_ends_mid_line_ends_the_session_after_its_question(store_and_model: tuple[Path, Path]) -> None:
    """ask50 F3: at a terminal, Ctrl-D mid-line answered the question, then waited for a third Ctrl-D."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher())
    out = io.StringIO()
    assert interactive(odqa, TerminalAfterCtrlD(f"\n{GOOD}"), out, io.StringIO(), as_json=True) == 0
    assert json.loads(out.getvalue())["question"] == GOOD


@pytest.mark.parametrize("questions", [["\u200b", GOOD], [GOOD, "\u200b", GOOD, GOOD], [GOOD, "\u200b"]])
def test_a_refused_question_makes_the_session_s_status_2_whatever_is_answered_after_it(
    store_and_model: tuple[Path, Path], questions: list[str]
) -> None:
    """A script that pipes in a question file learns that one was not answered, wherever it stood in the file."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher())
    out, err = io.StringIO(), io.StringIO()
    assert interactive(odqa, io.StringIO("".join(f"{question}\n" for question in questions)), out, err,
                       as_json=True) == 2  # fmt: skip
    assert len(err.getvalue().splitlines()) == questions.count("\u200b")
    answered = [json.loads(line).get("question") for line in out.getvalue().splitlines()]
    assert answered.count(GOOD) == questions.count(GOOD)


class Terminal(io.StringIO):
    """Questions typed at a terminal."""

    def isatty(self) -> bool:
        return True


def test_at_a_terminal_a_refused_question_is_told_on_stderr_only_even_with_json(
    store_and_model: tuple[Path, Path],
) -> None:
    """Typed questions have no line numbers: the error goes to stderr beside the prompt, and stdout carries only the
    answers' JSON, one object per answered question."""
    store_dir, model_dir = store_and_model
    odqa = OpenDomainReader(DilBertReader.from_pretrained(model_dir), open_store(store_dir), OneHitSearcher())
    out, err = io.StringIO(), io.StringIO()
    assert interactive(odqa, Terminal(f"\u200b\n{GOOD}\n"), out, err, as_json=True) == 2
    assert [json.loads(line)["question"] for line in out.getvalue().splitlines()] == [GOOD]
    assert "dilstore ask: error: the question '\\u200b' has no word pieces after tokenization" in err.getvalue()
