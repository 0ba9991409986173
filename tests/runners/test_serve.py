"""The query server in this process: answers equal `ask --json`, batching, bad input, overload, failures, metrics.

The app runs on uvicorn in a thread, on a socket bound to a free localhost
port, over a tiny random reader (k=1) and tiny EARL stores. BM25 is replaced
by a word-overlap searcher, so this module never starts the JVM; the real
index and the real command are tested in tests/runners/test_serve_process.py.

Two questions steer the searcher: GATE blocks the store's worker thread until
the test releases it, so the requests sent meanwhile wait in the queue and
deterministically form the next batch (or overflow it); BROKEN retrieves a
passage the store lacks, a failure inside the reading call.
"""

from __future__ import annotations

import asyncio
import errno
import gzip
import io
import json
import logging
import math
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.earl import EarlRanker
from dilstore.reader.retrieval import Hit, TooManyTermsError
from dilstore.reader.serving.odqa import OdqaSettings, OpenDomainReader, aggregate
from dilstore.reader.serving.rerank import open_reranker
from dilstore.runners.cli import main
from dilstore.runners.cmd_ask import print_answer
from dilstore.runners.cmd_serve import log_colors, parse_store_argument
from dilstore.runners.serve_app import create_app
from dilstore.runners.serve_batching import DEFAULT_MAX_TOP_P, ServeSettings
from dilstore.runners.serve_requests import RerankRequest
from dilstore.runners.serve_responses import AskAnswer, ErrorBody, Health, RerankAnswer
from dilstore.runners.serve_services import AskService, RerankService, ServedStore
from dilstore.storage.errors import DilstoreError
from dilstore.storage.reader import open_store
from tests.fixtures.odqa_fixtures import write_reader_checkpoint, write_store
from tests.fixtures.text_forms import full_width
from tests.reader.serving.test_rerank import DOCUMENTS, save_ranker, write_earl_store

GATE = "Gate question: hold the worker?"
BROKEN = "Broken question: what does the ghost say?"
QUESTIONS = [
    "When did the Zürich tram network open?",
    "Who won the Nobel Prize in Chemistry in 1911?",
    "How high is Mount Kilimanjaro?",
    "Who was the lighthouse keeper?",
    "What does the café sell on Sunday?",
]
WAIT = 30.0  # seconds any step may take before the test fails instead of hanging


class OverlapSearcher:
    """Stands in for BM25: ranks stored passages by words shared with the query (ties: store order)."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.words = {passage_id: set(re.findall(r"\w+", text.lower())) for passage_id, text in texts.items()}
        self.gate = threading.Event()
        self.gate.set()
        self.gated = threading.Event()  # set while a GATE search waits at the gate

    def search(self, query: str, k: int) -> list[Hit]:
        if query == GATE:
            self.gated.set()
            self.gate.wait(WAIT)
            self.gated.clear()
        if query == BROKEN:
            return [Hit("ghost#0", 9.0)]
        asked = set(re.findall(r"\w+", query.lower()))
        if len(asked) > 1024:  # as Lucene refuses a query of more clauses
            raise TooManyTermsError(f"the query has more terms than one BM25 search takes ({len(asked)})")
        scored = [(len(asked & words) + 1.0 / (rank + 2), pid) for rank, (pid, words) in enumerate(self.words.items())]
        return [Hit(pid, score) for score, pid in sorted(scored, key=lambda item: -item[0])[:k]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The reader store with its model and passage texts, and EARL S1/S2 stores of one ranker (plus another)."""
    root = tmp_path_factory.mktemp("serve")
    model_dir = write_reader_checkpoint(root / "reader")
    ids = write_store(root / "qa", model_dir)
    ranker_dir = save_ranker(root / "ranker", seed=0)
    ranker = EarlRanker.from_pretrained(ranker_dir)
    return {
        "model_dir": model_dir,
        "model": DilBertReader.from_pretrained(model_dir),
        "qa": root / "qa",
        "texts": {p.id: f"{p.title}\n{p.text}" for p in open_store(root / "qa").fetch(ids)},
        "ranker_dir": ranker_dir,
        "s1": write_earl_store(root / "s1", ranker, "earl-s1", "fp32"),
        "s2": write_earl_store(root / "s2", ranker, "earl-s2", "fp16"),
        "other_ranker_dir": save_ranker(root / "other-ranker", seed=1),
    }


def make_odqa(tiny: dict[str, Any]) -> OpenDomainReader:
    """An OpenDomainReader over the tiny store with the overlap searcher (the fixture's model, shared)."""
    return OpenDomainReader(tiny["model"], open_store(tiny["qa"]), OverlapSearcher(tiny["texts"]), OdqaSettings())


def make_stores(tiny: dict[str, Any], odqa: OpenDomainReader) -> list[ServedStore]:
    """qa (/ask), s1 (/rerank with a searcher) and s2 (/rerank without one)."""
    return [
        ServedStore("qa", AskService(odqa), {"info": {"kind": "dilbert"}}),
        ServedStore("s1", RerankService(open_reranker(tiny["s1"], tiny["ranker_dir"]), OverlapSearcher(DOCUMENTS))),
        ServedStore("s2", RerankService(open_reranker(tiny["s2"], tiny["ranker_dir"]))),
    ]


@contextmanager
def running(stores: list[ServedStore], **settings: Any) -> Iterator[tuple[httpx.Client, Any]]:
    """The app on uvicorn in a thread, on a free localhost port: a client for it, and the app; stopped after."""
    app = create_app(stores, ServeSettings(**settings))
    # A kept-alive connection idle past uvicorn's 5 s default is closed by the server, and a request sent as it
    # closes is reset: on a loaded machine the gap between two tests can be that long.
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=int(WAIT)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    base = "http://127.0.0.1:%d" % sock.getsockname()[1]
    try:
        with httpx.Client(base_url=base, timeout=WAIT) as client:
            yield client, app
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()
    assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def served(tiny: dict[str, Any]) -> Iterator[tuple[httpx.Client, Any, OpenDomainReader]]:
    """One server for the tests that do not need their own limits."""
    odqa = make_odqa(tiny)
    with running(make_stores(tiny, odqa), max_wait=0.0, access_log=True) as (client, app):
        yield client, app, odqa


def cli_json(odqa: OpenDomainReader, question: str, top_p: int | None = None, mu: float | None = None) -> dict:
    """What `dilstore ask --json` prints for the question (runners/cmd_ask.py's printer)."""
    out = io.StringIO()
    print_answer(odqa.answer(question, top_p=top_p, mu=mu), True, out, odqa.read_with)
    return json.loads(out.getvalue())


def without_timings(document: dict) -> dict:
    """The document less its timings, which must still have every stage."""
    assert set(document["timings"]) == {"retrieval", "store_read", "question_layers", "interaction_layers", "decode",
                                        "total"}  # fmt: skip
    return {key: value for key, value in document.items() if key != "timings"}


def assert_same_answer(served: dict, alone: dict) -> None:
    """Same answer and n-best (texts, passages, spans); scores equal up to float rounding."""
    def shape(doc: dict) -> list:
        return [doc["question"], doc["answer"], doc["passage_id"], doc["mu"]] + [
            (s["text"], s["passage_id"], s["char_start"], s["char_end"]) for s in doc["nbest"]
        ]

    assert shape(served) == shape(alone)
    for key in ("score", "reader_score", "bm25_score"):
        assert served[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-4)
    for a, b in zip(served["nbest"], alone["nbest"], strict=True):
        assert (a["score"], a["reader_score"]) == pytest.approx((b["score"], b["reader_score"]), rel=1e-4, abs=1e-4)


# ---------------------------------------------------------------------- answers


@pytest.mark.parametrize(("top_p", "mu"), [(None, None), (3, 1.0), (8, 0.0), (1, 0.25)])
def test_ask_returns_the_json_of_ask(served, top_p: int | None, mu: float | None) -> None:
    client, _, odqa = served
    body = {"question": QUESTIONS[0], **({"top_p": top_p} if top_p else {}), **({"mu": mu} if mu is not None else {})}
    response = client.post("/ask", json=body)
    assert response.status_code == 200, response.text
    assert without_timings(response.json()) == without_timings(cli_json(odqa, QUESTIONS[0], top_p, mu))
    # What the answer was read from (lowbit39 L1: a 2bit store with or without its online layers answers otherwise).
    assert (response.json()["encoding"], response.json()["online_variant"]) == (odqa.store.fingerprint.encoding, None)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def send_gated(client: httpx.Client, app: Any, gate: OverlapSearcher, bodies: list[dict], endpoint: str = "/ask"):
    """Hold the worker with GATE, queue `bodies` behind it, release: their responses, in order, and the GATE's.

    Every body is queued (or refused) before the worker is released, so the
    queued ones form the next batch.
    """
    gate.gate.clear()
    batcher = app.state.batchers["qa"]

    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=client.base_url, timeout=WAIT) as session:
            first = asyncio.create_task(session.post("/ask", json={"question": GATE, "top_p": 2}))
            await asyncio.to_thread(wait_until, gate.gated.is_set, "the worker waits at the gate")
            tasks = []
            for body in bodies:
                tasks.append(asyncio.create_task(session.post(endpoint, json=body)))
                await asyncio.sleep(0)
            await asyncio.to_thread(wait_until, lambda: sum(t.done() for t in tasks) + batcher.pending() >= len(bodies),
                                    "queued")  # fmt: skip
            gate.gate.set()
            return [*(await asyncio.gather(*tasks)), await first]

    return asyncio.run(go())


def metric(text: str, name: str, **labels: str) -> float:
    """One sample's value from /metrics text (0 when absent)."""
    for family in parse_prometheus(text).values():
        for sample_name, sample_labels, value in family["samples"]:
            if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items()):
                return value
    return 0.0


def test_a_store_whose_folder_name_is_not_utf8_is_served_and_health_stores_and_metrics_answer(
    tiny: dict[str, Any],
) -> None:
    """(unicode56 F9) A store in a folder named in Latin-1 bytes is named by them (lone surrogates, as Python decodes
    them): /health and /stores were 500s for good, so a load balancer took the server out of rotation, and /metrics
    too, while /rerank answered. Its name and path now come as JSON's escapes, which a client can send back."""
    name = os.fsdecode(b"caf\xe9")
    store = ServedStore(name, RerankService(open_reranker(tiny["s1"], tiny["ranker_dir"])),
                        {"path": f"/stores/{name}", "info": {"store": f"/stores/{name}"}})  # fmt: skip
    with running([store]) as (client, _):
        health = client.get("/health")
        assert (health.status_code, health.json()) == (200, {"status": "ok", "stores": [name]})
        assert health.content == b'{"status":"ok","stores":["caf\\udce9"]}'
        listed_stores = client.get("/stores")
        assert listed_stores.status_code == 200 and listed_stores.json()["stores"][0]["path"] == f"/stores/{name}"
        body = json.dumps({"query": "tram", "doc_ids": ["tram"], "store": name})  # the name as "caf\\udce9"
        reranked = client.post("/rerank", content=body, headers={"content-type": "application/json"})
        assert reranked.status_code == 200, reranked.text
        metrics = client.get("/metrics")
        assert metrics.status_code == 200 and 'dilstore_queue_depth{store="caf\\\\udce9"} 0' in metrics.text


def test_concurrent_requests_are_batched_and_equal_unbatched_answers(tiny: dict[str, Any]) -> None:
    odqa = make_odqa(tiny)
    bodies = [{"question": q, "top_p": top_p, "mu": mu} for q, top_p, mu in
              zip(QUESTIONS, (8, 3, 5, 8, 1), (0.5, 1.0, 0.0, 0.7, 0.5), strict=True)]  # fmt: skip
    with running(make_stores(tiny, odqa), max_wait=0.2, max_batch_pairs=256) as (client, app):
        *responses, gated = send_gated(client, app, odqa.searcher, bodies)
        text = client.get("/metrics").text
    assert gated.status_code == 200
    for body, response in zip(bodies, responses, strict=True):
        assert response.status_code == 200, response.text
        assert_same_answer(response.json(), cli_json(odqa, body["question"], body["top_p"], body["mu"]))
    # The GATE request ran alone, then all five together: 5 + 8 + 3 + 5 + 8 + 1 pairs.
    assert metric(text, "dilstore_batch_requests_count", store="qa") == 2
    assert metric(text, "dilstore_batch_requests_sum", store="qa") == 6
    assert metric(text, "dilstore_batch_pairs_sum", store="qa") == 2 + sum(b["top_p"] for b in bodies)


def test_batching_off_runs_each_request_alone(tiny: dict[str, Any]) -> None:
    odqa = make_odqa(tiny)
    bodies = [{"question": q, "top_p": 4} for q in QUESTIONS[:3]]
    with running(make_stores(tiny, odqa), max_wait=0.2, max_batch_pairs=1) as (client, app):
        *responses, _ = send_gated(client, app, odqa.searcher, bodies)
        text = client.get("/metrics").text
    assert [r.status_code for r in responses] == [200] * 3
    assert metric(text, "dilstore_batch_requests_count", store="qa") == 4
    assert metric(text, "dilstore_batch_requests_sum", store="qa") == 4


def test_a_failure_in_a_shared_batch_is_a_500_for_that_request_only(
    tiny: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    odqa = make_odqa(tiny)
    bodies = [{"question": QUESTIONS[0]}, {"question": BROKEN}, {"question": ""}, {"question": QUESTIONS[2]}]
    with running(make_stores(tiny, odqa), max_wait=0.2) as (client, app):
        responses = send_gated(client, app, odqa.searcher, bodies)[:-1]
        assert [r.status_code for r in responses] == [200, 500, 422, 200]
        assert "ghost#0" in responses[1].json()["detail"]
        assert responses[2].json()["detail"] == "the question is empty"
        for body, response in zip(bodies[::3], responses[::3], strict=True):
            assert_same_answer(response.json(), cli_json(odqa, body["question"]))
        assert client.get("/health").status_code == 200
        assert client.post("/ask", json={"question": QUESTIONS[1]}).status_code == 200
        text = client.get("/metrics").text
    assert metric(text, "dilstore_errors_total", endpoint="/ask", kind="internal") == 1
    assert metric(text, "dilstore_errors_total", endpoint="/ask", kind="bad_request") == 1
    retried = [r.getMessage() for r in caplog.records if "running each alone" in r.getMessage()]
    assert len(retried) == 1 and "requests failed (MissingPassagesError: " in retried[0]  # the shared run's failure


def test_a_store_whose_files_went_away_is_unavailable_and_health_says_so(
    tiny: dict[str, Any], tmp_path: Path
) -> None:
    """After `precompute --overwrite`, a move or a deletion under a running server, every request to that store
    failed with a 500 while /health said ok; now the store is marked unavailable: 503s, and /health is 503."""
    shutil.copytree(tiny["qa"], tmp_path / "qa")
    odqa = OpenDomainReader(tiny["model"], open_store(tmp_path / "qa"), OverlapSearcher(tiny["texts"]), OdqaSettings())
    stores = make_stores(tiny, odqa)
    with running(stores, max_wait=0.0) as (client, _):
        (tmp_path / "qa" / "shards").rename(tmp_path / "moved")
        first = client.post("/ask", json={"question": QUESTIONS[0]})
        assert first.status_code == 503, first.text
        assert first.json()["detail"].startswith("store 'qa' is unavailable: ")
        assert "restart the server" in first.json()["detail"]
        again = client.post("/ask", json={"question": QUESTIONS[1]})
        assert again.status_code == 503 and again.json()["detail"] == first.json()["detail"]
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable" and list(health.json()["problems"]) == ["qa"]
        Health.model_validate(health.json())  # as /openapi.json describes it
        assert client.head("/health").status_code == 503
        listed = {store["name"]: store for store in client.get("/stores").json()["stores"]}
        assert "problem" in listed["qa"] and "problem" not in listed["s1"]
        assert client.post("/rerank", json={"query": "tram", "doc_ids": ["tram"], "store": "s1"}).status_code == 200
        text = client.get("/metrics").text
    assert metric(text, "dilstore_errors_total", endpoint="/ask", kind="unavailable") == 2


def test_health_finds_a_store_replaced_under_an_idle_server(tiny: dict[str, Any], tmp_path: Path) -> None:
    """/health said 200 until a request happened to reach the replaced store, so an idle server stayed in a load
    balancer's rotation (conc39 M1)."""
    shutil.copytree(tiny["qa"], tmp_path / "qa")
    odqa = OpenDomainReader(tiny["model"], open_store(tmp_path / "qa"), OverlapSearcher(tiny["texts"]), OdqaSettings())
    with running(make_stores(tiny, odqa), max_wait=0.0) as (client, _):
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 200
        assert client.get("/health").status_code == 200
        (tmp_path / "qa").rename(tmp_path / "qa-old")  # what `precompute --overwrite` does: another store in its place
        shutil.copytree(tiny["qa"], tmp_path / "qa")
        health = client.get("/health")
        assert health.status_code == 503 and list(health.json()["problems"]) == ["qa"], health.text
        assert "after the store was opened" in health.json()["problems"]["qa"]
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 503


def test_a_store_s_first_problem_is_kept_and_logged_once(tiny: dict[str, Any], caplog) -> None:
    """Each request in flight that met a replaced store logged it unavailable again: three lines for one cause
    (crash40 L4)."""
    store = make_stores(tiny, make_odqa(tiny))[0]
    with caplog.at_level("ERROR", logger="dilstore.serve"):
        store.fail(OSError("first"))
        store.fail(OSError("second"))
    assert store.problem == "first"
    assert [record.getMessage() for record in caplog.records] == ["store 'qa' is unavailable from now on: first"]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_access_log_lines_name_status_seconds_and_store_but_no_query_string(served) -> None:
    """(obs57 F2) --access-log was uvicorn's line: no duration and no store, so a slow or failing store could not
    be told from the log, and a client's `?token=...` written into it. Now one line per request says all but that."""
    handler, log = Lines(), logging.getLogger("dilstore.serve.access")
    log.addHandler(handler)
    level, log.level = log.level, logging.INFO
    client = served[0]
    try:
        assert client.post("/ask?token=SECRET", json={"question": QUESTIONS[0], "top_p": 2}).status_code == 200
        assert client.post("/ask", json={"question": "x", "store": "nope"}).status_code == 404
        assert client.post("/rerank", json={"query": "tram", "doc_ids": ["tram"], "store": "s2"}).status_code == 200
        assert client.get("/a%0AERROR: \"forged\"").status_code == 404
    finally:
        log.removeHandler(handler)
        log.level = level
    pattern = re.compile(r'^127\.0\.0\.1:\d+ - "(\w+) (\S+) HTTP/1\.1" (\d{3}) (\d+\.\d{3})s(?: store=(.*))?$')
    parsed = [pattern.match(line) for line in handler.lines]
    assert all(parsed) and len(parsed) == 4, handler.lines
    assert [(m[1], m[2], m[3], m[5]) for m in parsed] == [  # type: ignore[index]
        ("POST", "/ask", "200", '"qa"'), ("POST", "/ask", "404", None), ("POST", "/rerank", "200", '"s2"'),
        ("GET", "/aERROR%3A%20%22forged%22", "404", None)]  # fmt: skip
    assert not any("SECRET" in line for line in handler.lines)


def test_requests_are_logged_with_access_log_only(monkeypatch, caplog) -> None:
    """(mut57c) --access-log reaches the app's settings, and an app without it logs no request: a server run without
    the flag wrote every request's line all the same, or one run with it wrote none, and no test said so."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from dilstore.runners import cmd_serve
    from dilstore.runners.cli import main
    from dilstore.runners.serve_app import add_request_handling
    from dilstore.runners.serve_metrics import Metrics

    for logged in (False, True):
        app = FastAPI()
        add_request_handling(app, Metrics(), access_log=logged)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dilstore.serve.access"):
            assert TestClient(app).get("/nothing").status_code == 404
        assert [record.name for record in caplog.records] == ["dilstore.serve.access"] * logged
    given: list[bool] = []
    monkeypatch.setattr(cmd_serve, "serve_on", lambda listeners, args, settings: given.append(settings.access_log) or 0)
    assert main(["serve", "store", "--port", "0", "--access-log"]) == 0 and main(["serve", "store", "--port", "0"]) == 0
    assert given == [True, False]


@contextmanager
def logging_as_serve_does(errors: logging.Handler) -> Iterator[list[logging.Logger]]:
    """uvicorn's, the server's and the access loggers (in that order) set up as `serve` sets them
    (log_as_uvicorn_does), uvicorn's lines going to `errors`; each logger as it was again afterwards."""
    from dilstore.runners.cmd_serve import log_as_uvicorn_does

    loggers = [logging.getLogger(name) for name in ("uvicorn", "dilstore.serve", "dilstore.serve.access")]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    try:
        loggers[0].handlers[:] = [errors]
        log_as_uvicorn_does()
        yield loggers
    finally:
        for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate


def test_access_log_lines_go_to_stdout_as_uvicorn_s_did(monkeypatch) -> None:
    """(read57 F4) uvicorn wrote its access log on stdout, the server's other lines on stderr; the access lines of
    obs57 F2 went to stderr, and `dilstore serve --access-log > access.log` found its file empty."""
    import uvicorn.logging

    from dilstore.runners.serve_app import access_logger

    out, err = io.StringIO(), io.StringIO()
    errors = logging.StreamHandler(err)
    errors.setFormatter(uvicorn.logging.DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))
    monkeypatch.setattr(sys, "stdout", out)
    with logging_as_serve_does(errors) as loggers:
        access_logger.info("%s", '127.0.0.1:50070 - "POST /ask HTTP/1.1" 200 0.012s store="qa"')
        loggers[1].error("store 'qa' is unavailable from now on: gone")
    assert out.getvalue() == 'INFO:     127.0.0.1:50070 - "POST /ask HTTP/1.1" 200 0.012s store="qa"\n'
    assert err.getvalue() == "ERROR:    store 'qa' is unavailable from now on: gone\n"


def test_an_access_log_output_that_cannot_be_written_is_one_warning_and_the_server_goes_on(monkeypatch, capsys) -> None:
    """json61 F2: `serve --access-log | head -1`, or `> access.log` on a full disk: once stdout failed, logging printed
    a "--- Logging error ---" block with a traceback on stderr for every request after it. Now one warning says so
    in the server's log and the access lines are dropped."""
    from dilstore.runners.serve_app import access_logger

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    errors = logging.StreamHandler(err := io.StringIO())
    monkeypatch.setattr(sys, "stdout", Closed())
    with logging_as_serve_does(errors):
        for _ in range(3):
            access_logger.info("%s", '127.0.0.1:50070 - "GET /health HTTP/1.1" 200 0.001s')
    assert err.getvalue() == ("--access-log: standard output cannot be written (Broken pipe); access lines are "
                              "dropped from now on\n")  # fmt: skip
    assert "Logging error" not in capsys.readouterr().err


def test_an_access_log_output_full_for_a_moment_drops_those_lines_only(monkeypatch) -> None:
    """(tail61b F2) a stdout another process set non-blocking answers EAGAIN (BlockingIOError) while its reader lags:
    the output was given up for good, pointed at the null device with every later line dropped. Now the lines it
    cannot take are dropped, said once, and the next ones are written, the first on a line of its own after the start
    of a line the output took part of."""
    from dilstore.runners.serve_app import access_logger

    class Lagging(io.StringIO):
        refusals = 2

        def write(self, text: str) -> int:
            if self.refusals:
                self.refusals -= 1
                super().write(text[:9] if self.refusals else "")  # the first refusal takes part of its line
                raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
            return super().write(text)

    errors = logging.StreamHandler(err := io.StringIO())
    monkeypatch.setattr(sys, "stdout", out := Lagging())
    with logging_as_serve_does(errors):
        for number in range(4):
            access_logger.info("%s", f'127.0.0.1:5007{number} - "GET /health HTTP/1.1" 200 0.001s')
    assert out.getvalue().splitlines() == ["127.0.0.1", *(f'127.0.0.1:5007{number} - "GET /health HTTP/1.1" 200 0.001s'
                                                          for number in (2, 3))]  # fmt: skip
    assert err.getvalue() == ("--access-log: standard output is full for now (Resource temporarily unavailable); the "
                              "access lines it cannot take at once are dropped\n")  # fmt: skip


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
@pytest.mark.parametrize("output", ["closed pipe", "full disk"])
def test_an_access_log_output_that_fails_is_put_on_the_null_device_whatever_its_os_error(
    output: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(mut61 M1) json61 F2's handler was seen only for a broken pipe on a stream without a descriptor: a full disk's
    ENOSPC could go back to logging's traceback block for every request, and the lines left in stdout's buffer could
    fail again at the server's last flush, once it had stopped cleanly. A record that cannot be formatted is a bug
    for logging to show, not an output lost for good."""
    from dilstore.runners.serve_app import access_logger

    if output == "closed pipe":
        reader, writer = os.pipe()
        os.close(reader)
        stream = open(writer, "w")  # noqa: SIM115 -- closed below, as the interpreter's last flush would
        words = "Broken pipe"
    else:
        stream, words = open("/dev/full", "w"), "No space left on device"  # noqa: SIM115 -- closed below
    errors = logging.StreamHandler(err := io.StringIO())
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        with logging_as_serve_does(errors):
            access_logger.info("%d", "not a number")
            assert err.getvalue() == "" and "--- Logging error ---" in capsys.readouterr().err
            for _ in range(3):
                access_logger.info("%s", '127.0.0.1:50070 - "GET /health HTTP/1.1" 200 0.001s')
    finally:
        monkeypatch.undo()
    assert err.getvalue() == f"--access-log: standard output cannot be written ({words}); access lines are dropped " \
                             "from now on\n"  # fmt: skip
    assert os.fstat(stream.fileno()).st_rdev == os.stat(os.devnull).st_rdev
    stream.close()  # what its buffer held goes to the null device
    assert "Logging error" not in capsys.readouterr().err


def test_health_finds_a_store_moved_away_under_the_server(tiny: dict[str, Any], tmp_path: Path) -> None:
    """A store moved or deleted was served from its maps until a request needed a shard not opened yet, which got
    503, and /health stayed 200 until then (crash40 M4)."""
    shutil.copytree(tiny["qa"], tmp_path / "qa")
    odqa = OpenDomainReader(tiny["model"], open_store(tmp_path / "qa"), OverlapSearcher(tiny["texts"]), OdqaSettings())
    with running(make_stores(tiny, odqa), max_wait=0.0) as (client, _):
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 200
        (tmp_path / "qa").rename(tmp_path / "elsewhere")
        health = client.get("/health")
        assert health.status_code == 503 and "the store was moved or deleted" in health.json()["problems"]["qa"]
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 503


def test_an_io_error_on_the_manifest_is_a_502_health_stays_up_and_the_server_recovers(
    tiny: dict[str, Any], tmp_path: Path, caplog
) -> None:
    """An I/O error looking at the manifest (a failing disk) gave /ask an "internal error" 500 and /health a
    plain-text 500 with a traceback in the log (full49 F2): it is a failed read, which may work a moment later."""
    shutil.copytree(tiny["qa"], tmp_path / "qa")
    odqa = OpenDomainReader(tiny["model"], open_store(tmp_path / "qa"), OverlapSearcher(tiny["texts"]), OdqaSettings())
    odqa.store.check_files = True  # as `dilstore serve` opens it
    manifest, real_exists = tmp_path / "qa" / "manifest.json", Path.exists

    def failing(path: Path, *args: Any, **kwargs: Any) -> bool:
        if path == manifest:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(path))
        return real_exists(path, *args, **kwargs)

    with running(make_stores(tiny, odqa), max_wait=0.0) as (client, _):
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 200
        with pytest.MonkeyPatch.context() as patched, caplog.at_level("WARNING", logger="dilstore.serve"):
            patched.setattr(Path, "exists", failing)
            failed = client.post("/ask", json={"question": QUESTIONS[0]})
            health = client.get("/health")
        assert failed.status_code == 502, failed.text
        assert failed.json()["detail"] == (f"reading store 'qa' failed: checking {manifest} failed: OSError: "
                                           "Input/output error; try again")  # fmt: skip
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        assert any(f"checking store 'qa' failed: checking {manifest}" in r.getMessage() for r in caplog.records)
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 200


def test_a_manifest_no_look_will_reach_makes_the_store_unavailable_and_a_failed_look_keeps_it_so(
    tiny: dict[str, Any], tmp_path: Path
) -> None:
    """A manifest the server may not read (no permission) got 502 on every /ask while /health said 200; and a
    failed look at an unavailable store's manifest escaped /health as a plain-text 500 (review49 F3, F1)."""
    shutil.copytree(tiny["qa"], tmp_path / "qa")
    odqa = OpenDomainReader(tiny["model"], open_store(tmp_path / "qa"), OverlapSearcher(tiny["texts"]), OdqaSettings())
    odqa.store.check_files = True  # as `dilstore serve` opens it
    manifest, real_exists, failure = tmp_path / "qa" / "manifest.json", Path.exists, [errno.EACCES]

    def failing(path: Path, *args: Any, **kwargs: Any) -> bool:
        if path == manifest:
            raise OSError(failure[0], os.strerror(failure[0]), str(path))
        return real_exists(path, *args, **kwargs)

    with running(make_stores(tiny, odqa), max_wait=0.0) as (client, _), pytest.MonkeyPatch.context() as patched:
        patched.setattr(Path, "exists", failing)
        health = client.get("/health")
        assert health.status_code == 503, health.text
        assert health.json()["problems"]["qa"].startswith(f"{manifest} can no longer be read (Permission denied)")
        assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 503
        failure[0] = errno.EIO  # the unavailable store's look fails for a while: still 503, and JSON
        health = client.get("/health")
        assert health.status_code == 503 and list(health.json()["problems"]) == ["qa"], health.text


def test_a_full_queue_gets_503_with_retry_after_and_the_server_recovers(tiny: dict[str, Any]) -> None:
    odqa = make_odqa(tiny)
    bodies = [{"question": q} for q in QUESTIONS[:4]]
    with running(make_stores(tiny, odqa), max_wait=0.0, queue_size=2) as (client, app):
        responses = send_gated(client, app, odqa.searcher, bodies)
        codes = [r.status_code for r in responses]
        # Two of the four queue and two are refused; which two reach the server first is the connections' race
        # (it read [200, 503, 200, 503] once in a full-suite run).
        assert sorted(codes[:4]) == [200, 200, 503, 503] and codes[4] == 200
        refused = next(response for response in responses if response.status_code == 503)
        assert refused.headers["retry-after"] == "1"
        assert "overloaded" in refused.json()["detail"]
        assert client.get("/health").json() == {"status": "ok", "stores": ["qa", "s1", "s2"]}
        again = client.post("/ask", json=bodies[3])
        assert again.status_code == 200
        assert_same_answer(again.json(), cli_json(odqa, QUESTIONS[3]))
        text = client.get("/metrics").text
    assert metric(text, "dilstore_errors_total", endpoint="/ask", kind="overloaded") == 2
    assert metric(text, "dilstore_requests_total", endpoint="/ask", code="503") == 2


# ---------------------------------------------------------------------- bad input

BAD_ASKS = [
    ("not json", b"{question: 1", 422,
     "the body is not valid JSON: Expecting property name enclosed in double quotes at character 1"),
    ("an empty body", b"", 422, "the body is empty; send a JSON object"),
    ("a list", [QUESTIONS[0]], 422, "dictionary"),
    ("no question", {"top_p": 3}, 422, "question"),
    ("a number as question", {"question": 7}, 422, "string"),
    ("empty question", {"question": ""}, 422, "empty"),
    ("blank question", {"question": "   \n"}, 422, "empty"),
    ("over-long question", {"question": "word " * 80}, 422, "longer than 64 tokens"),
    ("huge question", {"question": "x" * 100_000}, 422, "characters long"),
    ("lone surrogate", b'{"question": "Who \\ud800?"}', 422, "lone surrogate U+D800 at character 5"),
    ("body over 1 MiB", b'{"question": "' + b"x" * (1 << 20) + b'"}', 413, "the server reads at most 1,048,576"),
    ("bytes not UTF-8", b'{"question": "caf\xe9?"}', 422, "the body is not valid JSON: 'utf-8' codec can't decode"),
    ("nested too deep", b"[" * 100_000 + b"]" * 100_000, 422, "the body is not valid JSON: maximum recursion depth"),
    ("a 5,000-digit top_p", b'{"question": "q?", "top_p": ' + b"9" * 5000 + b"}", 422,  # no "use sys.set_int_..."
     'the body is not valid JSON: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 '
     'digits"'),
    ("top_p zero", {"question": "q?", "top_p": 0}, 422, "greater than or equal to 1"),
    ("top_p over the limit", {"question": "q?", "top_p": 101}, 422, "at most 100"),
    ("top_p a float", {"question": "q?", "top_p": 2.5}, 422, "integer"),
    ("top_p a string", {"question": "q?", "top_p": "3"}, 422, "integer"),
    ("top_p a bool", {"question": "q?", "top_p": True}, 422, "integer"),
    ("mu above 1", {"question": "q?", "mu": 1.5}, 422, "less than or equal to 1"),
    ("mu below 0", {"question": "q?", "mu": -0.1}, 422, "greater than or equal to 0"),
    ("mu a string", {"question": "q?", "mu": "0.5"}, 422, "number"),
    ("mu NaN", b'{"question": "q?", "mu": NaN}', 422, "finite"),
    ("unknown field", {"question": "q?", "k": 3}, 422,
     "unknown field(s) 'k'; the fields are question, top_p, mu, store"),
    ("unknown store", {"question": "q?", "store": "nope"}, 404, "no store named 'nope'"),
    ("an EARL store", {"question": "q?", "store": "s1"}, 400, "answers /rerank"),
]
BAD_RERANKS = [
    ("neither ids nor k", {"query": "trams"}, 422, "exactly one of"),
    ("both ids and k", {"query": "trams", "doc_ids": ["tram"], "bm25_top_k": 2}, 422, "exactly one of"),
    ("empty query", {"query": "", "doc_ids": ["tram"]}, 422, "the query is empty"),
    ("blank query", {"query": "  ", "doc_ids": ["tram"]}, 422, "the query is empty"),
    # pydantic's length check failed first, with "unable to parse raw data as a unicode string" (serve42 L4).
    ("lone surrogate query", b'{"query": "tram \\udc00", "doc_ids": ["tram"]}', 422,
     "the query holds a lone surrogate U+DC00 at character 6, which is not Unicode text"),
    ("no ids", {"query": "trams", "doc_ids": []}, 422, "at least 1 item"),
    ("unknown id", {"query": "trams", "doc_ids": ["tram", "ghost", "tram"]}, 422,
     "1 of 2 doc_ids are not in this store: 'ghost'\""),  # not the library's skip_missing hint, which /rerank lacks
    # (mut56 M81) an id the store holds in another Unicode form is named with its form, as the library names it
    ("an id in another form", {"query": "trams", "doc_ids": ["\uff54\uff52\uff41\uff4d"]}, 422,
     "but 'tram' is: the same text in another Unicode form (NFKC)"),
    ("too many ids", {"query": "trams", "doc_ids": ["tram"] * 101}, 422, "at most 100"),
    ("k zero", {"query": "trams", "bm25_top_k": 0}, 422, "greater than or equal to 1"),
    ("k without an index", {"query": "trams", "bm25_top_k": 2, "store": "s2"}, 400, "no BM25 index"),
    # These three were 500s with a logged traceback; the third said the (healthy) index "cannot be read".
    ("a zero-width query", {"query": "\u200b", "doc_ids": ["tram"]}, 422, "has no word pieces after tokenization"),
    ("a NUL query", {"query": "\u0000", "bm25_top_k": 2}, 422, "has no word pieces after tokenization"),
    # 1,100 ideographs, each a term, under /rerank's 100 characters a query token (it takes 3,200 here).
    ("1,100 terms for BM25", {"query": " ".join(chr(0x4E00 + i) for i in range(1100)), "bm25_top_k": 2}, 422,
     "the query has more terms than one BM25 search takes (1100)"),
    ("a dilbert store", {"query": "trams", "doc_ids": ["tram"], "store": "qa"}, 400, "answers /ask"),
]


@pytest.mark.parametrize(("endpoint", "body", "status", "message"),
                         [("/ask", *case[1:]) for case in BAD_ASKS] + [("/rerank", *case[1:]) for case in BAD_RERANKS],
                         ids=[case[0] for case in BAD_ASKS + BAD_RERANKS])  # fmt: skip
def test_bad_input_gets_a_4xx_with_a_message(served, endpoint: str, body: Any, status: int, message: str) -> None:
    client, _, _ = served
    if isinstance(body, bytes):
        response = client.post(endpoint, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(endpoint, json=body)
    assert response.status_code == status, response.text
    assert message in json.dumps(response.json()["detail"]), response.text
    ErrorBody.model_validate(response.json())  # as /openapi.json describes it
    assert client.get("/health").status_code == 200 and client.head("/health").status_code == 200  # HEAD was 405


def test_a_store_name_in_another_unicode_form_is_named_with_its_form_in_the_404() -> None:
    """(left57 F2) A store served from a macOS folder is named decomposed (`Zu\u0308rich`); a request that named it
    composed got "no store named 'Zürich'; stores: Zürich", two names that print alike. The 404 now names the form
    the server holds, as fetch and rerank do for an id (unicode56 F4); a name in no form gets no hint."""
    from dilstore.runners.serve_app import StoreRouter
    from dilstore.runners.serve_requests import ClientError

    router = object.__new__(StoreRouter)
    router.names, router.by_name = ["Zu\u0308rich", "qa"], {"Zu\u0308rich": None, "qa": None}
    with pytest.raises(ClientError) as refused:
        router.choose("Zürich", "/ask")
    assert refused.value.status == 404
    assert str(refused.value).endswith("('Z\\xfcrich' is not among them, but 'Zu\\u0308rich' is: the same text in "
                                       "another Unicode form (NFD); store names are matched code point by code point)")
    with pytest.raises(ClientError, match=r"stores: Zu\u0308rich, qa$"):
        router.choose("Genève", "/ask")


@pytest.mark.parametrize(("endpoint", "body"), [
    ("/ask", {"question": QUESTIONS[0], "top_p": DEFAULT_MAX_TOP_P}),
    ("/rerank", {"query": "Zürich tram", "doc_ids": ["kili", "tram", "cafe", "curie"] * (DEFAULT_MAX_TOP_P // 4),
                 "store": "s2"}),
    ("/rerank", {"query": "Zürich tram", "bm25_top_k": DEFAULT_MAX_TOP_P, "store": "s1"}),
], ids=["top_p", "doc_ids", "bm25_top_k"])  # fmt: skip
def test_a_request_at_exactly_the_top_p_limit_is_answered(served, endpoint: str, body: dict) -> None:
    """--max-top-p is the most a request may ask for, not the first number refused (101 is, above)."""
    client, _, odqa = served
    response = client.post(endpoint, json=body)
    assert response.status_code == 200, response.text
    if endpoint == "/ask":
        assert without_timings(response.json()) == without_timings(cli_json(odqa, QUESTIONS[0], DEFAULT_MAX_TOP_P))


@pytest.mark.parametrize(("endpoint", "body", "message"), [
    ("/rerank", {"query": "trams", "doc_ids": ["tram", *range(100_000)]},
     "Value error, doc_ids must be strings; 100000 of the 100001 are not, the first at index 1: int 0"),
    ("/ask", {"question": "q?", **{f"k{i}": i for i in range(50_000)}},
     "Value error, unknown field(s) 'k0', 'k1', 'k2', 'k3', 'k4' and 49995 more; the fields are question, top_p, mu, "
     "store"),
])
def test_a_body_of_many_bad_items_is_one_error(served, endpoint: str, body: dict, message: str) -> None:
    """pydantic made one error per item on the event loop: a 1 MB body of 500,000 ints as doc_ids stalled every
    request for 18 s and was answered with a 47 MB 422."""
    client, _, _ = served
    response = client.post(endpoint, json=body)
    assert response.status_code == 422
    assert [error["msg"] for error in response.json()["detail"]] == [message]


@pytest.mark.parametrize(("endpoint", "headers", "declared"), [
    ("/ask", {"content-type": "text/plain"}, "has content-type 'text/plain'"),
    ("/rerank", {"content-type": "text/json"}, "has content-type 'text/json'"),
    ("/ask", {}, "has no content-type"),
])
def test_a_body_not_declared_as_json_is_told_to_be(served, endpoint: str, headers: dict, declared: str) -> None:
    """A JSON body sent as text/plain, or with no content-type, got "Input should be a valid dictionary"."""
    client, _, _ = served
    response = client.post(endpoint, content=b'{"question": "q?"}', headers=headers)
    assert response.status_code == 422
    assert response.json()["detail"] == ("the body must be JSON, sent with content-type application/json; this "
                                         f"request {declared}")


def test_a_compressed_body_gets_a_415_naming_its_encoding(served) -> None:
    """A gzip body was read as it came: "the body is not valid JSON: 'utf-8' codec can't decode byte 0x8b"."""
    client, _, _ = served
    body = gzip.compress(b'{"question": "q?"}')
    response = client.post("/ask", content=body, headers={"content-type": "application/json",
                                                          "content-encoding": "gzip"})  # fmt: skip
    assert response.status_code == 415
    assert response.json()["detail"] == ("the server reads bodies sent without a content-encoding; this request's is "
                                         "'gzip'")
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("content_type", ["application/json; charset=utf-8", "application/vnd.dilstore+json"])
def test_json_content_types_with_parameters_or_suffixes_are_read(served, content_type: str) -> None:
    client, _, _ = served
    response = client.post("/ask", content=b'{"question": "q?"}', headers={"content-type": content_type})
    assert response.status_code == 200, response.text


def test_a_chunked_body_over_the_cap_gets_a_413_and_the_server_goes_on(served) -> None:
    """Without a Content-Length, the declared-length check cannot see the size: the whole body was read and parsed."""
    client, _, _ = served
    chunks = (b'{"question": "', *([b"x" * 65536] * 17), b'"}')  # 1,114,128 bytes, no Content-Length
    response = client.post("/ask", content=iter(chunks), headers={"content-type": "application/json"})
    sent = response.request.headers
    assert sent.get("transfer-encoding") == "chunked" and "content-length" not in sent
    assert response.status_code == 413, response.text
    assert response.json()["detail"] == "the request body passed 1,048,576 bytes, the most the server reads"
    assert client.post("/ask", content=iter([b'{"question": "', b'Who?"}']),
                       headers={"content-type": "application/json"}).status_code == 200  # fmt: skip


def test_a_client_that_leaves_mid_body_counts_as_client_gone_not_a_bad_request(served) -> None:
    """A disconnect mid-body reached the route as FastAPI's "error parsing the body": counted as a 422 bad_request,
    indistinguishable in /metrics from a client's malformed JSON."""
    client, _, _ = served

    def count(text: str, **labels: str) -> float:
        return metric(text, "dilstore_requests_total", endpoint="/ask", **labels)

    before = client.get("/metrics").text
    host, port = client.base_url.host, client.base_url.port
    with socket.create_connection((host, port), timeout=WAIT) as sock:
        sock.sendall(b"POST /ask HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                     b'{"question": "')  # fmt: skip
    wait_until(lambda: count(client.get("/metrics").text, code="499") == count(before, code="499") + 1,
               "the cut request is counted")  # fmt: skip
    after = client.get("/metrics").text
    assert count(after, code="422") == count(before, code="422")
    gone = metric(after, "dilstore_errors_total", endpoint="/ask", kind="client_gone")
    assert gone == metric(before, "dilstore_errors_total", endpoint="/ask", kind="client_gone") + 1
    assert metric(after, "dilstore_errors_total", endpoint="/ask", kind="bad_request") == metric(
        before, "dilstore_errors_total", endpoint="/ask", kind="bad_request")  # fmt: skip
    assert client.post("/ask", json={"question": QUESTIONS[0]}).status_code == 200


# ---------------------------------------------------------------------- rerank, stores, docs, metrics


def test_rerank_scores_given_ids_and_bm25_hits_like_the_reranker(served, tiny: dict[str, Any]) -> None:
    client, _, _ = served
    ids = ["kili", "tram", "cafe", "curie"]
    for store in ("s1", "s2"):
        response = client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids, "store": store})
        assert response.status_code == 200, response.text
        expected = open_reranker(tiny[store], tiny["ranker_dir"]).rerank("Zürich tram", ids)
        results = response.json()["results"]
        assert [r["doc_id"] for r in results] == sorted(expected, key=lambda d: -expected[d])
        # What the states were read from (lowbit39 L1).
        assert response.json()["encoding"] == open_store(tiny[store]).fingerprint.encoding
        assert {r["doc_id"]: r["score"] for r in results} == pytest.approx(expected, rel=1e-5)
    response = client.post("/rerank", json={"query": "Zürich tram network", "bm25_top_k": 3})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    hits = OverlapSearcher(dict(DOCUMENTS)).search("Zürich tram network", 3)
    assert {r["doc_id"]: r["bm25_score"] for r in results} == {hit.passage_id: hit.score for hit in hits}
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert response.json()["query_truncated"] is False
    # Typed full width (a CJK input method), the query is searched and scored as the plain one.
    wide = client.post("/rerank", json={"query": full_width("Zürich tram network"), "bm25_top_k": 3})
    assert wide.json()["results"] == results and wide.json()["query"] == full_width("Zürich tram network")


def test_rerank_breaks_ties_by_doc_id_as_rerank_writes_them(tiny: dict[str, Any], monkeypatch) -> None:
    """Two MS MARCO passages of one text score alike: /rerank ranked them in the order the client sent them."""
    reranker = open_reranker(tiny["s2"], tiny["ranker_dir"])
    monkeypatch.setattr(reranker, "rerank_tokenized", lambda query, ids: dict.fromkeys(ids, 1.0))
    service = RerankService(reranker)
    for ids in (["kili", "tram", "curie"], ["curie", "kili", "tram"]):
        results = service.rerank(RerankRequest(query="Zürich tram", doc_ids=ids))["results"]
        assert [result["doc_id"] for result in results] == ["tram", "kili", "curie"]


def test_rerank_says_when_the_ranker_read_only_the_query_s_first_tokens(served, tiny: dict[str, Any]) -> None:
    """A 200,000-character query was scored on its first tokens, and the response did not say so."""
    client, _, _ = served
    long_query = "Zürich tram " * 100
    response = client.post("/rerank", json={"query": long_query, "doc_ids": ["tram", "kili"]})
    assert response.status_code == 200, response.text
    assert response.json()["query_truncated"] is True
    reranker = open_reranker(tiny["s1"], tiny["ranker_dir"])
    expected = reranker.rerank(long_query, ["tram", "kili"])
    assert {r["doc_id"]: r["score"] for r in response.json()["results"]} == pytest.approx(expected, rel=1e-5)
    # 750 KB of CJK or "a,a,..." held the store's worker for seconds, tokenized twice (review38 M2).
    longest = reranker.max_query_length * 100
    response = client.post("/rerank", json={"query": "中" * (longest + 1), "doc_ids": ["tram"]})
    assert response.status_code == 422
    assert response.json()["detail"] == (f"the query is {longest + 1} characters long; /rerank takes at most "
                                         f"{longest} (the ranker reads its first {reranker.max_query_length} tokens)")
    assert client.post("/rerank", json={"query": "中" * longest, "doc_ids": ["tram"]}).status_code == 200
    padded = client.post("/rerank", json={"query": "tram " + " " * longest, "doc_ids": ["tram"]})  # serve46 F3
    assert padded.status_code == 200, padded.text


def test_health_stores_docs(served) -> None:
    client, _, _ = served
    assert client.get("/health").json() == {"status": "ok", "stores": ["qa", "s1", "s2"]}
    listed = client.get("/stores").json()["stores"]
    assert [(s["name"], s["endpoint"]) for s in listed] == [("qa", "/ask"), ("s1", "/rerank"), ("s2", "/rerank")]
    assert client.get("/docs").status_code == 200
    assert {"/ask", "/rerank", "/health", "/stores", "/metrics"} <= set(client.get("/openapi.json").json()["paths"])


def test_the_openapi_schema_describes_every_body_the_query_endpoints_send(served) -> None:
    """/openapi.json described every 422 as a list of validation errors (most carry one string), listed no other
    error status, and gave the 200 bodies no schema: a generated client failed on them (serve46 F2)."""
    client, _, odqa = served
    paths = client.get("/openapi.json").json()["paths"]
    for path, answer in (("/ask", "AskAnswer"), ("/rerank", "RerankAnswer")):
        responses = paths[path]["post"]["responses"]
        assert set(responses) == {"200", "400", "404", "408", "413", "415", "422", "500", "502", "503"}
        schemas = {status: body["content"]["application/json"]["schema"] for status, body in responses.items()}
        assert schemas.pop("200") == {"$ref": f"#/components/schemas/{answer}"}
        assert all(schema == {"$ref": "#/components/schemas/ErrorBody"} for schema in schemas.values()), schemas
    answered = client.post("/ask", json={"question": QUESTIONS[0], "top_p": 3}).json()
    assert AskAnswer.model_validate(answered).nbest and answered["answer"]
    unanswered = {**aggregate(odqa.read([QUESTIONS[0]], [[]])[0], 0.5, 5).to_dict(), **odqa.read_with}
    assert AskAnswer.model_validate(unanswered).score is None  # no passage gave a span: nulls
    RerankAnswer.model_validate(client.post("/rerank", json={"query": "trams", "doc_ids": ["tram", "kili"]}).json())
    found = RerankAnswer.model_validate(client.post("/rerank", json={"query": "Zürich tram", "bm25_top_k": 3}).json())
    assert found.results and all(result.bm25_score is not None for result in found.results)
    # /metrics sends text, not JSON, and /health may answer 503 (review46 L2).
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    health = paths["/health"]["get"]["responses"]
    assert {status: body["content"]["application/json"]["schema"] for status, body in health.items()} == {
        status: {"$ref": "#/components/schemas/Health"} for status in ("200", "503")}
    assert Health.model_validate(client.get("/health").json()).status == "ok"
    # Every body's schema forbids other fields, so that a client learns each field, and the validations above
    # fail when the handlers send a field the schemas lack (the module's promise).
    components = client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("AskAnswer", "AskSpan", "AskPassage", "RerankAnswer", "RerankResult", "Health", "ErrorBody",
                 "ValidationProblem"):
        assert components[name]["additionalProperties"] is False, name
    assert AskAnswer.model_validate(answered).model_dump().keys() == answered.keys()
    with pytest.raises(ValueError, match="added_field"):
        AskAnswer.model_validate({**answered, "added_field": 1})


def parse_prometheus(text: str) -> dict[str, dict[str, Any]]:
    """Parse the text exposition format strictly enough to catch malformed output.

    Every sample must follow its family's HELP and TYPE lines and belong to
    it; histogram buckets must be cumulative, end in le="+Inf" and equal the
    family's _count.
    """
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')
    families: dict[str, dict[str, Any]] = {}
    current = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
            families[current] = {"samples": []}
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current and kind in ("counter", "gauge", "histogram")
            families[name]["type"] = kind
        else:
            match = sample.match(line)
            assert match, f"malformed sample line: {line!r}"
            name, labels, value = match.groups()
            assert current is not None and name in (current, *(current + s for s in ("_bucket", "_sum", "_count")))
            parsed = dict(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', labels or ""))
            families[current]["samples"].append((name, parsed, float(value)))
    for name, family in families.items():
        if family["type"] != "histogram":
            continue
        series: dict[tuple, list[tuple[float, float]]] = {}
        counts = {}
        for sample_name, labels, value in family["samples"]:
            key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            if sample_name.endswith("_bucket"):
                series.setdefault(key, []).append((float(labels["le"]), value))
            elif sample_name.endswith("_count"):
                counts[key] = value
        for key, buckets in series.items():
            bounds, values = zip(*buckets, strict=True)
            assert list(bounds) == sorted(bounds) and math.isinf(bounds[-1]), name
            assert list(values) == sorted(values) and values[-1] == counts[key], name
    return families


def test_metrics_count_query_requests_by_store_and_code(served) -> None:
    """(obs57 F3) /metrics counted requests by endpoint only: with two /rerank stores, an operator could not tell
    which one answered the 503s or 422s. dilstore_store_requests_total counts them by store and code."""
    client = served[0]

    def counts() -> dict[tuple[str, str], float]:
        family = parse_prometheus(client.get("/metrics").text)["dilstore_store_requests_total"]
        assert family["type"] == "counter"
        return {(labels["store"], labels["code"]): value for _, labels, value in family["samples"]}

    before = counts()
    assert client.post("/ask", json={"question": QUESTIONS[1], "top_p": 1}).status_code == 200
    assert client.post("/ask", json={"question": QUESTIONS[1], "top_p": DEFAULT_MAX_TOP_P + 1}).status_code == 422
    assert client.post("/rerank", json={"query": "tram", "doc_ids": ["tram"], "store": "s2"}).status_code == 200
    assert client.post("/ask", json={"question": "x", "store": "nope"}).status_code == 404  # no store: not counted
    after = counts()
    changed = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    assert changed == {("qa", "200"): 1, ("qa", "422"): 1, ("s2", "200"): 1}


def test_metrics_parse_as_prometheus_text(served) -> None:
    client, _, _ = served
    client.post("/ask", json={"question": QUESTIONS[1]})
    client.post("/ask", json={"question": ""})
    response = client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = parse_prometheus(response.text)
    assert {"dilstore_requests_total", "dilstore_errors_total", "dilstore_request_seconds", "dilstore_queue_seconds",
            "dilstore_batch_requests", "dilstore_batch_pairs", "dilstore_requests_in_flight",
            "dilstore_queue_depth"} <= set(families)  # fmt: skip
    assert families["dilstore_request_seconds"]["type"] == "histogram"
    assert metric(response.text, "dilstore_requests_total", endpoint="/ask", code="200") >= 1
    assert metric(response.text, "dilstore_request_seconds_count", endpoint="/ask") >= 2
    assert metric(response.text, "dilstore_queue_seconds_count", store="qa") >= 1


# ---------------------------------------------------------------------- the command


def test_a_store_of_another_model_is_refused_with_exit_2(tiny: dict[str, Any], capsys) -> None:
    status = main(["serve", str(tiny["s1"]), "--model", str(tiny["other_ranker_dir"]), "--port", "0"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("dilstore serve: error:") and "differs in: weights_sha256" in err


def test_a_store_damaged_on_disk_or_too_many_files_for_the_limit_is_refused_at_start(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A chunk cut short started a healthy server that lost the store at its first request, and a restart repeated
    it; a store of more mapped files than the open-file limit failed its reads part-way through (serve42 M2, H1)."""
    from dilstore.runners import open_files

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny["s1"], damaged)
    chunk = next(path for path in sorted((damaged / "shards").rglob("*"))
                 if path.is_file() and "/states/" in path.as_posix() and "/c/" in path.as_posix())  # fmt: skip
    chunk.write_bytes(chunk.read_bytes()[:7])
    assert main(["serve", str(damaged), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("dilstore serve: error: store 'damaged' is damaged: ")
        and "7 bytes, the manifest recorded" in err
    )
    assert err.rstrip().endswith(f"`dilstore verify {damaged}` checks it, a new precompute mends it")
    monkeypatch.setattr(open_files, "raise_open_file_limit", lambda: 520)
    assert main(["serve", str(tiny["s1"]), str(tiny["s2"]), "--port", "0"]) == 2
    assert re.search(r"the stores map up to \d+ files, .* may open only 520 files in all; raise the limit to at "
                     r"least \d+ \(ulimit -n", capsys.readouterr().err)  # fmt: skip


def test_the_port_is_held_on_every_address_from_before_the_stores_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port was checked, let go, and bound again after the stores loaded: taken meanwhile (a second instance
    started at the same moment), uvicorn exited 3 with its own log lines (serve42 L1). A name of two addresses
    (localhost: ::1 and 127.0.0.1) is held on both, as uvicorn bound it (review42 M1)."""
    from dilstore.runners import cmd_serve

    def two_addresses(host: str, port: int, **options: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)) for address in ("127.0.0.1", "127.0.0.2")]

    monkeypatch.setattr(cmd_serve.socket, "getaddrinfo", two_addresses)
    listeners = cmd_serve.listening_sockets("two.example", 0)
    try:
        assert [listener.getsockname()[0] for listener in listeners] == ["127.0.0.1", "127.0.0.2"]
        port = listeners[0].getsockname()[1]
        assert listeners[1].getsockname()[1] == port > 0
        for address in ("127.0.0.1", "127.0.0.2"):
            with socket.socket() as other:
                other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError, match="Address already in use"):
                    other.bind((address, port))
        with pytest.raises(DilstoreError, match=f"^cannot listen on two.example:{port}: Address already in use$"):
            cmd_serve.listening_sockets("two.example", port)
    finally:
        for listener in listeners:
            listener.close()


def test_model_options_must_match_the_stores(tiny: dict[str, Any], capsys) -> None:
    model = str(tiny["ranker_dir"])
    assert main(["serve", str(tiny["s1"]), str(tiny["s2"]), "--model", model, "--model", model, "--model", model]) == 2
    assert "once per store" in capsys.readouterr().err
    for option in ("--max-batch-pairs", "--queue-size", "--max-top-p"):
        with pytest.raises(SystemExit):
            main(["serve", str(tiny["s1"]), option, "0"])
        assert f"argument {option}: expected a positive integer, got 0" in capsys.readouterr().err
    assert main(["serve", str(tiny["qa"]), "--max-top-p", "20", "--port", "0"]) == 2  # every /ask without top_p: 422
    assert capsys.readouterr().err == ("dilstore serve: error: --max-top-p 20 is below /ask's default top_p 29, so "
                                       "every /ask without top_p would be refused; give --max-top-p 29 or more\n")
    for wait in ("nan", "inf", "-1", "60001"):  # nan spun the batcher forever and inf killed it, with /health ok
        assert main(["serve", str(tiny["s1"]), "--max-wait-ms", wait]) == 2
        assert f"max-wait-ms must be from 0 to 60000, got {float(wait):g}" in capsys.readouterr().err
    assert main(["serve", str(tiny["s1"]), f"{tiny['s1'].name}={tiny['s2']}"]) == 2
    assert "store names must differ" in capsys.readouterr().err
    assert parse_store_argument(f"books={tiny['s1']}") == ("books", str(tiny["s1"]))
    assert parse_store_argument(str(tiny["s1"])) == ("s1", str(tiny["s1"]))
    assert parse_store_argument("http://127.0.0.1:8000/stores/books/") == ("books", "http://127.0.0.1:8000/stores/books/")
    assert parse_store_argument("wiki=s3://bucket/a=b") == ("wiki", "s3://bucket/a=b")
    assert main(["serve", str(tiny["s1"]), "--index", "nothing=/tmp"]) == 2
    assert "no store is named 'nothing'" in capsys.readouterr().err



@pytest.mark.parametrize("argument", ["runs/k=3/store", "/data/a=b", "./x=y", "s3://bucket/run=2/store"])
def test_a_store_path_holding_an_equals_sign_is_a_path_not_a_name(argument: str) -> None:
    """`NAME=STORE` names a store only when NAME is no path (holds no "/"): a folder such as runs/k=3/store is served
    whole, under its last component, not as the store "3/store" named "runs/k"."""
    assert parse_store_argument(argument) == (Path(argument.split("://")[-1]).name, argument)


def test_a_folder_here_named_with_an_equals_sign_is_served_as_that_folder(tmp_path: Path, monkeypatch) -> None:
    """(port58 F7) `serve k=3` of the folder k=3 here said "no store at 3"; where a folder 3 is there too, the
    argument stays NAME=STORE, as documented."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "k=3").mkdir()
    assert parse_store_argument("k=3") == ("k=3", "k=3")
    (tmp_path / "3").mkdir()
    assert parse_store_argument("k=3") == ("k", "3")


def test_a_store_served_through_a_link_is_named_by_the_link(tmp_path: Path, monkeypatch) -> None:
    """(port58 F9) `serve /srv/current`, a link to the build being served, named the store by the link's target
    (`store-v7`), so requests for "current" were for an unknown store, and the name moved with each switch."""
    (tmp_path / "store-v7").mkdir()
    (tmp_path / "current").symlink_to("store-v7")
    assert parse_store_argument(str(tmp_path / "current")) == ("current", str(tmp_path / "current"))
    monkeypatch.chdir(tmp_path / "store-v7")
    assert parse_store_argument(".") == ("store-v7", ".")
    assert parse_store_argument("../current/") == ("current", "../current/")


@pytest.mark.parametrize("option", ["s1=", "s1", "=dir"])
def test_an_index_option_without_its_name_or_folder_is_refused(option: str) -> None:
    """`--index s1=` named the current folder (Path("") is "."), which was then searched as s1's BM25 index."""
    from dilstore.runners.cmd_serve import per_store_indexes

    with pytest.raises(DilstoreError, match="--index takes NAME=DIR|no store is named ''"):
        per_store_indexes([option], ["s1"])
    assert per_store_indexes(["s1=dir"], ["s1"]) == {"s1": Path("dir")}


@pytest.mark.parametrize("below", [1, 2, 9])
def test_a_max_top_p_any_amount_below_ask_s_default_is_refused_for_a_dilbert_store_only(below: int) -> None:
    """Every /ask that leaves top_p out reads DEFAULT_TOP_P passages: a --max-top-p one below it refused them all."""
    from dilstore.reader.serving.answers import DEFAULT_TOP_P
    from dilstore.runners.cmd_serve import check_default_top_p

    with pytest.raises(DilstoreError, match=f"--max-top-p {DEFAULT_TOP_P - below} is below"):
        check_default_top_p(DEFAULT_TOP_P - below, ["earl-s1", "dilbert"])
    check_default_top_p(DEFAULT_TOP_P - below, ["earl-s1", "listformer"])
    check_default_top_p(DEFAULT_TOP_P, ["dilbert"])

def test_every_store_and_model_path_is_checked_before_the_first_model_loads(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A mistyped second store or model was found only after the first store's model had loaded."""

    def opened_too_soon(*arguments: Any) -> None:
        raise AssertionError(f"a store was opened before every path was checked: {arguments}")

    monkeypatch.setattr("dilstore.runners.cmd_serve.open_served_store", opened_too_soon)
    assert main(["serve", str(tiny["s1"]), str(tmp_path / "no-store"), "--port", "0"]) == 2
    assert capsys.readouterr().err == f"dilstore serve: error: no store at {tmp_path / 'no-store'}\n"
    model = str(tiny["ranker_dir"])
    assert main(["serve", str(tiny["s1"]), str(tiny["s2"]), "--model", model, "--model", str(tmp_path)]) == 2
    expected = f"dilstore serve: error: {tmp_path} is not a Hugging Face checkpoint: it has no config.json\n"
    assert capsys.readouterr().err == expected
    assert main(["serve", str(tiny["s1"]), str(tiny["s2"]), "--index", f"s2={tmp_path}", "--port", "0"]) == 2
    # `dilstore index` never writes a folder given with --index: the message does not send the user to it (review40 L1).
    assert capsys.readouterr().err.startswith(f"dilstore serve: error: no Lucene index at {tmp_path}: give the folder "
                                              "of one `dilstore index` built")  # fmt: skip


def test_a_rerank_store_s_index_is_checked_as_a_dilbert_store_s_is(tiny: dict[str, Any], tmp_path: Path) -> None:
    """A mistyped --index of an EARL store was ignored (bm25_top_k then got 400 "no BM25 index"), and another
    store's index was searched, each hit missing from the store: a 500 per request."""
    from dilstore.runners.cmd_serve import open_served_store

    with pytest.raises(DilstoreError, match=f"^no Lucene index at {tmp_path}: give the folder of one `dilstore index`"):
        open_served_store("s1", str(tiny["s1"]), tiny["ranker_dir"], None, tmp_path)
    (tmp_path / "segments_1").write_bytes(b"")
    (tmp_path / "dilstore-index.json").write_text(json.dumps({"generation": "of-another-store", "passages": 3}))
    with pytest.raises(DilstoreError, match=f"^the BM25 index at {tmp_path} was built for another store"):
        open_served_store("s1", str(tiny["s1"]), tiny["ranker_dir"], None, tmp_path)


def test_a_dilbert_store_s_online_layers_are_named_at_start_up_and_in_stores(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch
) -> None:
    """/stores said `model: default` and the start-up line nothing of the online layers swapped in for a 2bit
    store, which answer otherwise than the reader's own (lowbit39 L1)."""
    from dilstore.reader.serving import odqa as odqa_module
    from dilstore.runners import cmd_serve

    def reader_with_variant(*args: Any, **kwargs: Any) -> OpenDomainReader:
        reader = make_odqa(tiny)
        monkeypatch.setattr(reader.model, "online_variant", "online-2bit.safetensors")
        return reader

    monkeypatch.setattr(cmd_serve, "served_index", lambda *args: tmp_path)
    monkeypatch.setattr(odqa_module, "open_reader", reader_with_variant)
    store = cmd_serve.open_served_store("qa", str(tiny["qa"]), tiny["model_dir"], None)
    assert store.description["online_variant"] == "online-2bit.safetensors"
    assert store.summary().endswith(f"model {tiny['model_dir']}, online layers online-2bit.safetensors")
    with running([store]) as (client, _):
        assert client.get("/stores").json()["stores"][0]["online_variant"] == "online-2bit.safetensors"
        assert client.post("/ask", json={"question": QUESTIONS[0]}).json()["online_variant"] == (
            "online-2bit.safetensors")  # fmt: skip


def test_stores_served_from_urls_answer_like_local_ones(tiny: dict[str, Any]) -> None:
    """A store given as an http:// URL (a real server on 127.0.0.1) is mounted like a local one; a dilbert store
    at a URL needs --index, since Lucene reads only local files."""
    from dilstore.runners.cmd_serve import open_served_store
    from dilstore.storage.errors import DilstoreError
    from tests.fixtures.http_store import serve_directory

    ids = ["kili", "tram", "cafe", "curie"]
    with serve_directory(tiny["s2"].parent) as files:
        url = f"{files.url}/{tiny['s2'].name}"
        name, path = parse_store_argument(url)
        store = open_served_store(name, path, tiny["ranker_dir"], None)
        assert store.description["path"] == url and store.description["info"]["passages"] == len(DOCUMENTS)
        assert store.description["online_variant"] is None  # a ranker has no online layers of its own encoding
        # The start-up line names the store's encoding (lowbit39 L1: nothing but /stores said which it was).
        assert store.summary().startswith(f"store {name!r} (earl-s2, fp16, {len(DOCUMENTS)} passages) from {url},")
        with pytest.raises(DilstoreError, match="give a local copy of the store's bm25/ folder with --index qa=DIR$"):
            open_served_store("qa", f"{files.url}/{tiny['qa'].name}", tiny["model_dir"], None)
        with running([store]) as (client, _):
            response = client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids, "store": name})
    assert response.status_code == 200, response.text
    expected = open_reranker(tiny["s2"], tiny["ranker_dir"]).rerank("Zürich tram", ids)
    assert {r["doc_id"]: r["score"] for r in response.json()["results"]} == pytest.approx(expected, rel=1e-6)


def test_a_remote_store_s_missing_file_is_that_request_s_502_not_the_store_s_end(
    tiny: dict[str, Any], tmp_path: Path
) -> None:
    """One 404 from the web server (a CDN edge mid-deploy) marked a store at a URL unavailable until a restart, and
    /health 503 took the whole server out of rotation (remote40 H3)."""
    from dilstore.runners.cmd_serve import open_served_store
    from tests.fixtures.http_store import serve_directory

    served = shutil.copytree(tiny["s2"], tmp_path / "site" / "s2")
    body = {"query": "Zürich tram", "doc_ids": ["kili", "tram"]}
    with serve_directory(served.parent) as files:
        # With a password in its URL, which no response may show: serve has no authentication (review40b H1).
        url = files.url.replace("http://", "http://reader:S3CRET@") + "/s2"
        store = open_served_store("s2", url, tiny["ranker_dir"], None)
        with running([store]) as (client, _):
            (served / "shards").rename(tmp_path / "shards-away")  # every shard file answers 404 for a while
            failed = client.post("/rerank", json=body)
            assert failed.status_code == 502 and failed.json()["detail"].startswith("reading store 's2' failed: ")
            assert "S3CRET" not in failed.text and "S3CRET" not in client.get("/stores").text
            assert client.get("/health").status_code == 200
            (tmp_path / "shards-away").rename(served / "shards")
            assert client.post("/rerank", json=body).status_code == 200


def test_health_does_not_wait_for_a_silent_storage_server(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each /health waited for a remote store's manifest (fsspec waits 5 minutes), one more read every 10 s, until
    the thread pool ran out and every /health hung, local stores' too (review40c H1)."""
    import threading

    from dilstore.runners import serve_app
    from dilstore.runners.cmd_serve import open_served_store
    from dilstore.storage import reader
    from dilstore.storage.location import StoreLocation
    from tests.fixtures.http_store import serve_directory

    monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
    monkeypatch.setattr(serve_app, "HEALTH_CHECK_SECONDS", 0.2)
    silent, answer, reads = threading.Event(), threading.Event(), []
    real = StoreLocation.read_bytes

    def read_bytes(location: StoreLocation, relative: str, at_most: int | None = None) -> bytes:
        if relative == "manifest.json" and silent.is_set():
            reads.append(relative)
            answer.wait(timeout=30)  # until the test ends: a server that never answers
        return real(location, relative, at_most)

    served = shutil.copytree(tiny["s2"], tmp_path / "site" / "s2")
    with serve_directory(served.parent) as files:
        store = open_served_store("s2", f"{files.url}/s2", tiny["ranker_dir"], None)
        monkeypatch.setattr(StoreLocation, "read_bytes", read_bytes)
        silent.set()
        with running([store]) as (client, _):
            try:
                statuses = [client.get("/health", timeout=5).status_code for _ in range(4)]
                assert statuses == [200] * 4
                assert reads == ["manifest.json"], "one read at a time, however often /health is asked"
            finally:
                silent.clear()
                answer.set()  # the server's stop waits for the read it started


def test_health_finds_a_remote_store_rebuilt_on_its_server(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store at a URL rebuilt on the web server was never checked: its open shards were read at the old offsets,
    and answers mixing two builds came back with 200 while /health said ok (remote40 H1)."""
    import dataclasses

    from dilstore.runners.cmd_serve import open_served_store
    from dilstore.storage import reader
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest, write_manifest
    from tests.fixtures.http_store import serve_directory

    monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)  # each /health reads the manifest again
    served = shutil.copytree(tiny["s2"], tmp_path / "site" / "s2")
    with serve_directory(served.parent) as files:
        store = open_served_store("s2", f"{files.url}/s2", tiny["ranker_dir"], None)
        with running([store]) as (client, _):
            assert client.get("/health").status_code == 200
            manifest = read_manifest(StoreLocation.parse(served))
            write_manifest(served, dataclasses.replace(manifest, generation="another-build"))  # as a rebuild leaves it
            health = client.get("/health")
            assert health.status_code == 503 and "was rebuilt (build 'another-build'" in health.json()["problems"]["s2"]


def test_a_remote_store_found_rebuilt_stays_unavailable_between_manifest_reads(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a check found a store at a URL rebuilt, the next check (a /health within BUILD_CHECK_SECONDS, which
    reads no manifest) passed, and made it "available again: its files are back": /health said 200 and requests
    read the new build's files at the old offsets (another model's states: answers with 200) until the next
    manifest read, nine seconds in every ten (remote52 F1)."""
    import dataclasses

    from dilstore.runners.cmd_serve import open_served_store
    from dilstore.storage import reader
    from dilstore.storage.location import StoreLocation
    from dilstore.storage.manifest import read_manifest, write_manifest
    from tests.fixtures.http_store import serve_directory

    served = shutil.copytree(tiny["s2"], tmp_path / "site" / "s2")
    body = {"query": "Zürich tram", "doc_ids": ["kili", "tram"]}
    with serve_directory(served.parent) as files:
        store = open_served_store("s2", f"{files.url}/s2", tiny["ranker_dir"], None)
        with running([store]) as (client, _):
            monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 0.0)
            manifest = read_manifest(StoreLocation.parse(served))
            write_manifest(served, dataclasses.replace(manifest, generation="another-build"))  # as a rebuild leaves it
            assert client.get("/health").status_code == 503
            monkeypatch.setattr(reader, "BUILD_CHECK_SECONDS", 3600.0)  # no manifest read until the test ends
            assert [client.get("/health").status_code for _ in range(3)] == [503] * 3
            assert client.post("/rerank", json=body).status_code == 503


def test_a_store_file_cut_under_the_server_makes_that_store_unavailable_not_a_dead_server(
    tiny: dict[str, Any], tmp_path: Path
) -> None:
    """serve maps its stores; a mapped file cut short in place (cp over it, a full disk) made the next read a SIGBUS
    that killed the server with every store it served. serve checks the mapped files before each read."""
    from dilstore.runners.cmd_serve import open_served_store

    shutil.copytree(tiny["s2"], tmp_path / "s2")
    ids = ["kili", "tram", "cafe", "curie"]
    store = open_served_store("s2", str(tmp_path / "s2"), tiny["ranker_dir"], None)
    assert store.service.reranker.store.check_files  # type: ignore[union-attr]
    with running([store]) as (client, _):
        assert client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids}).status_code == 200
        for states in (tmp_path / "s2" / "shards").glob("*/states/*/c/**/*"):
            if states.is_file():
                os.truncate(states, 64)
        cut = client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids})
        health = client.get("/health")
    assert cut.status_code == 503 and "after the store was opened" in cut.json()["detail"], cut.text
    assert health.status_code == 503 and list(health.json()["problems"]) == ["s2"]


@pytest.mark.usefixtures("quick_retries")  # the store's reads fail on purpose
def test_a_remote_store_that_fails_in_transit_gets_502_for_that_request_and_stays_served(
    tiny: dict[str, Any]
) -> None:
    """One HTTP 500 from the store's server made the store unavailable for good and /health 503 for the whole
    server, even after the file server recovered."""
    from dilstore.runners.cmd_serve import open_served_store
    from tests.fixtures.http_store import serve_directory

    ids = ["kili", "tram", "cafe", "curie"]
    with serve_directory(tiny["s2"].parent, listings=False) as files:
        store = open_served_store("s2", f"{files.url}/{tiny['s2'].name}", tiny["ranker_dir"], None)
        with running([store]) as (client, _):
            files.faults["/states/"] = 500
            failed = client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids})
            assert client.get("/health").status_code == 200
            files.faults.clear()
            answered = client.post("/rerank", json={"query": "Zürich tram", "doc_ids": ids})
            text = client.get("/metrics").text
    assert failed.status_code == 502, failed.text
    assert failed.json()["detail"].startswith("reading store 's2' failed: ") and "500" in failed.json()["detail"]
    assert answered.status_code == 200, answered.text
    assert metric(text, "dilstore_errors_total", endpoint="/rerank", kind="store_read") == 1


def test_no_color_turns_the_server_s_log_colours_off() -> None:
    """uvicorn coloured its log lines on a terminal whatever NO_COLOR said; no other command colours (cli43 L3)."""
    import logging

    import uvicorn

    assert log_colors({"NO_COLOR": "1"}) is False and log_colors({"NO_COLOR": ""}) is None and log_colors({}) is None
    config = uvicorn.Config(lambda scope, receive, send: None, use_colors=log_colors({"NO_COLOR": "1"}))
    config.configure_logging()
    (handler,) = logging.getLogger("uvicorn").handlers
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, "Started server process", None, None)
    assert handler.formatter.format(record) == "INFO:     Started server process"


def test_a_body_of_exactly_the_cap_is_read_and_one_byte_more_is_not(served) -> None:
    """The server reads at most MAX_BODY_BYTES: a body of that many bytes is read (its question is then too long),
    one of a byte more gets the 413, whether its length is declared or it comes in chunks."""
    from dilstore.runners.serve_app import MAX_BODY_BYTES

    client, _, _ = served
    start, end = b'{"question": "', b'"}'
    headers = {"content-type": "application/json"}
    for extra, status in ((0, 422), (1, 413)):
        body = start + b"x" * (MAX_BODY_BYTES + extra - len(start) - len(end)) + end
        assert len(body) == MAX_BODY_BYTES + extra
        assert client.post("/ask", content=body, headers=headers).status_code == status
        assert client.post("/ask", content=iter([body[:65536], body[65536:]]), headers=headers).status_code == status


def test_an_app_of_two_stores_of_one_name_is_refused(served) -> None:
    """Two stores under one name would leave one of them unreachable: create_app refuses them, as the command does."""
    _, _, odqa = served
    stores = [ServedStore("qa", AskService(odqa), {}), ServedStore("qa", AskService(odqa), {})]
    with pytest.raises(DilstoreError, match=r"store names must differ, got \['qa', 'qa'\]"):
        create_app(stores, ServeSettings())


def test_a_store_at_a_url_whose_server_sends_whole_files_is_refused_at_start(tiny: dict[str, Any]) -> None:
    """Python's http.server answers a byte range with the whole file: a store served from one started a server whose
    /health said 200 while every request to that store got 502, however many times it was asked (multi53 F2)."""
    import threading
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    from dilstore.runners.cmd_serve import open_served_store
    from dilstore.storage.errors import DilstoreError
    from tests.fixtures.http_store import BackloggedServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            """Silent."""

    files = BackloggedServer(("127.0.0.1", 0), partial(Quiet, directory=str(tiny["s2"].parent)))
    thread = threading.Thread(target=files.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{files.server_address[1]}/{tiny['s2'].name}"
        with pytest.raises(DilstoreError, match=r"^store 's2' cannot be read: .*the server does not answer byte "
                                                r"ranges"):  # fmt: skip
            open_served_store("s2", url, tiny["ranker_dir"], None)
    finally:
        files.shutdown()
        files.server_close()
        thread.join()


def test_a_store_named_with_an_equals_sign_is_given_its_index() -> None:
    """(left58b F4) A store served as the folder `k=3` (named `k=3`) could not be given an index: `--index k=3=DIR`
    split at its first "=", "no store is named 'k'". NAME is the part before the first "=" that ends a store's name;
    an index folder holding "=" stays whole."""
    from dilstore.runners.cmd_serve import per_store_indexes

    assert per_store_indexes(["k=3=idx"], ["k=3", "s1"]) == {"k=3": Path("idx")}
    assert per_store_indexes(["s1=runs/k=3/bm25"], ["k=3", "s1"]) == {"s1": Path("runs/k=3/bm25")}
    with pytest.raises(DilstoreError, match=r"^--index k=3=idx: no store is named 'k' \(stores: s1\)"):
        per_store_indexes(["k=3=idx"], ["s1"])


def failing_off_the_loop(message: str) -> Callable[..., Awaitable[None]]:
    """A stand-in for `asyncio.to_thread` (or serve_app.while_connected) that raises RuntimeError(`message`), as
    starting its thread failed, closing the coroutines it was given so that none is left never awaited."""

    async def failing(*args: Any, **kwargs: Any) -> None:
        for work in args:
            if asyncio.iscoroutine(work):
                work.close()
        raise RuntimeError(message)

    return failing


def health_with_threads_failing(client: Any, monkeypatch: pytest.MonkeyPatch, message: str) -> httpx.Response:
    """/health's answer while every `asyncio.to_thread` fails with RuntimeError(`message`); the stand-in is undone
    after it (with every other patch of `monkeypatch`)."""
    monkeypatch.setattr(asyncio, "to_thread", failing_off_the_loop(message))
    health = client.get("/health")
    monkeypatch.undo()
    return health


def test_a_thread_the_system_refuses_is_a_503_or_health_from_the_last_checks_not_a_500_with_a_traceback(
    served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Under a limit on processes and threads (ulimit -u, a pids cgroup) each /health that could not start its
    checking thread was a 500 with an 80-line ASGI traceback in the log (61 of 200 concurrent requests at
    `prlimit --nproc=36`), and a request that could not was a 500 "internal error" (limits59 F3)."""
    from dilstore.runners import serve_app

    client, _, _ = served
    with caplog.at_level("WARNING", logger="dilstore.serve"):
        health = health_with_threads_failing(client, monkeypatch, "can't start new thread")
        monkeypatch.setattr(serve_app, "while_connected", failing_off_the_loop("can't start new thread"))
        asked = client.post("/ask", json={"question": "Which river?", "top_p": 2})
    assert (health.status_code, health.json()["status"]) == (200, "ok")
    assert asked.status_code == 503 and asked.headers["retry-after"] == "1"
    assert asked.json()["detail"].startswith("no thread could be started: the limit on this user's processes")
    messages = [record.getMessage() for record in caplog.records if record.getMessage().startswith("/")]
    assert [message.split(":")[0] for message in messages] == ["/health answers from the stores' last checks", "/ask"]
    assert not any(record.exc_info for record in caplog.records)


def test_only_a_refused_thread_lets_health_answer_from_the_last_checks(
    served, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """(mut59b M6) Only a refused thread was tried: /health could answer any failed check from the last ones,
    logging that no thread could be started, and no test noticed. Another failure stays a 500."""
    client, _, _ = served
    with caplog.at_level("WARNING", logger="dilstore.serve"):
        health = health_with_threads_failing(client, monkeypatch, "dictionary changed size during iteration")
    assert health.status_code == 500
    assert not any("no thread could be started" in record.getMessage() for record in caplog.records)


def test_the_watch_warns_of_a_refused_thread_and_logs_any_other_failure_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """(mut59b M7) The watch's warning for a refused thread (limits59 F3) was never run: it could log a traceback
    every WATCH_SECONDS again, or hide another failure's, and no test noticed."""
    import types

    from dilstore.runners import serve_app

    class Stop(BaseException):
        """Ends the watch's loop."""

    failures = iter([RuntimeError("can't start new thread"), KeyError("stores"), Stop()])

    def check_stores() -> None:
        raise next(failures)

    monkeypatch.setattr(serve_app, "WATCH_SECONDS", 0.0)
    with caplog.at_level("WARNING", logger="dilstore.serve"), pytest.raises(Stop):
        asyncio.run(serve_app.StoreRouter.watch(types.SimpleNamespace(check_stores=check_stores)))  # type: ignore[arg-type]
    logged = [(record.levelname, record.getMessage(), record.exc_info is not None) for record in caplog.records
              if record.name == "dilstore.serve"]  # fmt: skip
    assert logged == [("WARNING", f"the stores are checked again in 0 s: {serve_app.NO_THREAD}", False),
                      ("ERROR", "checking the stores failed", True)]  # fmt: skip
