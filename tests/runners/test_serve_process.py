"""`dilstore serve` as a real process with a real BM25 index: `ask --json` equality, graceful SIGTERM, refusals.

The index is built, `dilstore ask` run and the server started in child
processes, so this module never starts the JVM itself (the refused store is
refused before its index is opened).
"""

from __future__ import annotations

import http.server
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dilstore.runners.cli import main
from tests.fixtures.benchmarks import benchmark_module
from tests.fixtures.odqa_fixtures import (
    collection_documents,
    write_collection,
    write_reader_and_store,
    write_reader_checkpoint,
)
from tests.fixtures.paths import ROOT
from tests.fixtures.serve_process import ServeProcess

QUESTIONS = [
    "When did the Zürich tram network open?",
    "How high is Mount Kilimanjaro?",
    "Who was the lighthouse keeper?",
]
WAIT = 120.0
SHUTDOWN_TIMEOUT = 3
# Builds the index (Anserini's log kept off stdout), then runs `dilstore ask ARGS` on stdin's questions:
# one JVM start for both.
INDEX_THEN_ASK = (
    "import sys; from pathlib import Path; from dilstore.reader.retrieval import build_bm25_index; "
    "from dilstore.runners.cli import main; from dilstore.runners.cmd_index import stdout_to_stderr\n"
    "with stdout_to_stderr(): build_bm25_index(Path(sys.argv[1]), Path(sys.argv[2]))\n"
    "sys.exit(main(sys.argv[3:]))"
)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A tiny store with its BM25 index at STORE/bm25, and `ask --json`'s answers to QUESTIONS."""
    root = tmp_path_factory.mktemp("serve-process")
    model, store, ids = write_reader_and_store(root)
    write_collection(root / "collection" / "passages.jsonl", collection_documents(store, ids))
    ask = ["ask", str(store), "--model", str(model), "--threads", "1", "--top-p", "4", "--json"]
    done = subprocess.run([sys.executable, "-c", INDEX_THEN_ASK, str(root / "collection"), str(store / "bm25"), *ask],
                          input="\n".join(QUESTIONS) + "\n", capture_output=True, text=True, cwd=ROOT,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [answer.pop("line") for answer in answers] == list(range(1, len(QUESTIONS) + 1))  # stdin's line numbers
    assert [answer["question"] for answer in answers] == QUESTIONS
    return {"store": store, "model": model, "answers": answers, "root": root}


@pytest.fixture
def server(indexed: dict[str, object]) -> Iterator[ServeProcess]:
    options = [str(indexed["store"]), "--model", str(indexed["model"]), "--threads", "1",
               "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
    server = ServeProcess(options, timeout=WAIT, cwd=ROOT)
    try:
        yield server
    finally:
        server.kill()


def wait_for_in_flight(url: str, requests: int) -> None:
    """Until /metrics shows `requests` /ask requests in flight (their headers read, their bodies awaited)."""
    deadline = time.monotonic() + WAIT
    in_flight = f'dilstore_requests_in_flight{{endpoint="/ask"}} {requests}'
    while in_flight not in httpx.get(url + "/metrics", timeout=WAIT).text:
        assert time.monotonic() < deadline, "the request never arrived"
        time.sleep(0.05)


def split_ask(question: str) -> tuple[bytes, bytes]:
    """A raw POST /ask of `question` in two parts: the headers with the body's first bytes, and the rest."""
    body = json.dumps({"question": question, "top_p": 4}).encode()
    head = (b"POST /ask HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    return head + body[:10], body[10:]


def finish_after_a_pause(server: ServeProcess, connection: socket.socket, rest: bytes) -> bytes:
    """After a stop signal: check the server waits for the request in flight, send its rest, read the response."""
    time.sleep(0.5)
    assert server.process.poll() is None, "the server exited with a request in flight"
    connection.sendall(rest)
    response = b""
    while chunk := connection.recv(65536):
        response += chunk
    return response


def test_answers_equal_ask_json_and_sigterm_drains_the_request_in_flight(indexed, server: ServeProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        assert client.get("/health").status_code == 200
        for question, expected in zip(QUESTIONS, indexed["answers"], strict=True):
            response = client.post("/ask", json={"question": question, "top_p": 4})
            assert response.status_code == 200, response.text
            served = response.json()
            assert set(served["timings"]) == set(expected["timings"])
            assert {k: v for k, v in served.items() if k != "timings"} == {
                k: v for k, v in expected.items() if k != "timings"
            }
    # Two requests whose headers have arrived but whose bodies have not, in flight when SIGTERM comes: one is
    # finished after the signal and answered; the other stalls, and the server exits at its --shutdown-timeout.
    host, port = server.url.removeprefix("http://").split(":")
    start, rest = split_ask(QUESTIONS[1])
    with socket.create_connection((host, int(port)), timeout=WAIT) as connection, \
            socket.create_connection((host, int(port)), timeout=WAIT) as stalled:  # fmt: skip
        connection.sendall(start)
        stalled.sendall(start)
        wait_for_in_flight(server.url, 2)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        response = finish_after_a_pause(server, connection, rest)
        status = server.process.wait(WAIT)  # a stalled client held the server up for as long as it stalled
        waited = time.monotonic() - signalled
        cancelled = stalled.recv(65536)
    server.reader.join(WAIT)  # the log's last lines
    head, _, payload = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), response[:500]
    answer = json.loads(payload)
    assert {k: v for k, v in answer.items() if k != "timings"} == {
        k: v for k, v in indexed["answers"][1].items() if k != "timings"
    }
    assert status == 0 and waited < SHUTDOWN_TIMEOUT + 10, "".join(server.log)
    assert cancelled.startswith(b"HTTP/1.1 503") and b"the server shut down before this request was" in cancelled
    log = "".join(server.log)
    assert f"WARNING:  1 request(s) still unfinished after --shutdown-timeout {SHUTDOWN_TIMEOUT:g} s" in log
    assert "Application shutdown complete" in log and "ERROR" not in log
    assert "Finished server process" in log and "Traceback" not in log


def test_a_second_signal_while_connections_close_quits_at_once_without_a_traceback(server: ServeProcess) -> None:
    """uvicorn's "Waiting for connections to close. (CTRL+C to force quit)" invites a second signal; starlette then
    logged the cancelled lifespan as an ERROR traceback."""
    host, port = server.url.removeprefix("http://").split(":")
    start, _ = split_ask(QUESTIONS[0])
    with socket.create_connection((host, int(port)), timeout=WAIT) as stalled:
        stalled.sendall(start)
        wait_for_in_flight(server.url, 1)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while "Waiting for connections to close" not in "".join(server.log):
            assert time.monotonic() < deadline and server.process.poll() is None, "".join(server.log)
            time.sleep(0.05)
        server.process.send_signal(signal.SIGINT)
        status = server.process.wait(WAIT)
    server.reader.join(WAIT)  # the log's last lines
    log = "".join(server.log)
    assert status == 0, log
    assert "WARNING:  forced to quit: the requests in flight and 0 queued were not answered" in log  # serve46 F1
    assert "Traceback" not in log and "ERROR" not in log, log


def test_a_store_of_another_model_is_refused_with_exit_2(indexed, tmp_path: Path, capsys) -> None:
    """In this process: the fingerprint is checked before the index is opened, so the JVM never starts."""
    other = write_reader_checkpoint(tmp_path / "other", seed=1)
    assert main(["serve", str(indexed["store"]), "--model", str(other), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "dilstore serve: error: store" in err and "differs in: weights_sha256" in err
    assert "Uvicorn running" not in err


def test_a_server_that_cannot_start_is_an_error_with_its_stderr(tmp_path: Path) -> None:
    """ServeProcess does not wait for a server that exited: the error names the command and repeats its stderr."""
    missing = tmp_path / "no-store"
    with pytest.raises(RuntimeError) as raised:
        ServeProcess([str(missing)], timeout=WAIT, cwd=ROOT)
    assert "the server did not start" in str(raised.value)
    assert str(missing) in str(raised.value).splitlines()[0]
    assert "dilstore serve: error" in str(raised.value)


def test_a_request_that_does_not_arrive_whole_in_time_loses_its_connection(indexed) -> None:
    """Clients that send nothing, part of their headers, or part of their body are cut at --request-timeout.

    A request that is not HTTP gets a 400 whose body is JSON, like every other error of the server.

    They held their sockets for as long as they stalled (uvicorn times out only idle kept-alive connections), and
    enough of them use up the server's file descriptors. Whole requests on other connections are answered meanwhile.
    At the end SIGHUP stops the server as gracefully as SIGTERM: a server started from a terminal or an ssh session
    gets it when the session goes away, and it killed the server at once, mid-request.
    """
    timeout = 3  # the request in flight at SIGHUP arrives whole within it, half a second after the signal
    options = [str(indexed["store"]), "--model", str(indexed["model"]), "--threads", "1",
               "--request-timeout", str(timeout)]  # fmt: skip
    server = ServeProcess(options, timeout=WAIT, cwd=ROOT)
    try:
        host, port = server.url.removeprefix("http://").split(":")
        head_and_some_body, _ = split_ask(QUESTIONS[0])
        partial_head = b"POST /ask HTTP/1.1\r\nHost: test\r\n"
        # The last one sends a whole request and part of the next on one connection: the second's deadline starts
        # when the first is answered, and no data comes to start it.
        behind = b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n" + head_and_some_body
        stalled = [socket.create_connection((host, int(port)), timeout=WAIT) for _ in range(4)]
        opened = time.monotonic()
        for connection, sent in zip(stalled, [b"", partial_head, head_and_some_body, behind], strict=True):
            connection.sendall(sent)
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            answered = client.post("/ask", json={"question": QUESTIONS[0], "top_p": 4})
        assert answered.status_code == 200, answered.text
        received = [b"".join(iter(lambda connection=connection: connection.recv(65536), b"")) for connection in stalled]
        closed = time.monotonic() - opened
        assert received[:2] == [b"", b""] and received[3].startswith(b"HTTP/1.1 200"), received
        expected = f'{{"detail": "the request did not arrive whole within {timeout} s (--request-timeout)"}}'.encode()
        # Headers whole, the body not: a 408 saying why, then the close (the pipelined one after the first's 200).
        assert received[2].startswith(b"HTTP/1.1 408") and received[2].endswith(expected), received
        assert received[3].count(b"HTTP/1.1 408") == 1 and received[3].endswith(expected), received
        for connection in stalled:
            connection.close()
        assert timeout - 0.5 <= closed < timeout + 30
        assert httpx.get(server.url + "/health", timeout=WAIT).status_code == 200
        with socket.create_connection((host, int(port)), timeout=WAIT) as garbled:
            garbled.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            refused = b"".join(iter(lambda: garbled.recv(65536), b""))
        with socket.create_connection((host, int(port)), timeout=WAIT) as garbled:  # a 400 to HEAD has no body
            garbled.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
            refused_head = b"".join(iter(lambda: garbled.recv(65536), b""))
        wait_for_in_flight(server.url, 0)
        start, rest = split_ask(QUESTIONS[0])
        with socket.create_connection((host, int(port)), timeout=WAIT) as connection:
            connection.sendall(start)
            wait_for_in_flight(server.url, 1)
            server.process.send_signal(signal.SIGHUP)
            response = finish_after_a_pause(server, connection, rest)
        assert response.startswith(b"HTTP/1.1 200"), response[:500]
        assert server.process.wait(WAIT) == 0
    finally:
        server.kill()
    log = "".join(server.log)
    assert log.count(f"its request did not arrive whole within {timeout} s (--request-timeout)") == 4, log
    assert "Application shutdown complete" in log and "Traceback" not in log, log
    head, _, body = refused.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), refused
    assert json.loads(body) == {"detail": "Invalid HTTP request received."}
    assert refused_head.startswith(b"HTTP/1.1 400") and refused_head.endswith(b"\r\n\r\n"), refused_head


class RecordingTransport:
    """The transport of one client connection to a ServeProtocol, without a socket: what was written, and whether
    the server closed it."""

    def __init__(self) -> None:
        self.written, self.closed = b"", False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize(
    ("second", "owing"),
    [(b"GET /b HTTP/1.1\r\nHo", True), (b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nabc", True),
     (b"", False)],
)  # fmt: skip
def test_a_pipelined_request_cut_short_behind_an_answered_one_is_held_to_the_deadline(
    second: bytes, owing: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A request that came in the same packet as the one before it, cut in its headers or its body, gets no data
    that would start its timer: the deadline starts as the answer before it completes, and at its end the
    connection closes with the warning (uvicorn's 5 s keep-alive is set long here, as it may be). With nothing
    owed, the idle kept-alive connection is uvicorn's to time out."""
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from dilstore.runners.serve_protocol import serve_protocol

    async def app(scope: dict, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    loop = asyncio.new_event_loop()
    try:
        state = ServerState()
        protocol = serve_protocol(1.5)(uvicorn.Config(app, timeout_keep_alive=600, log_config=None), state, {}, loop)
        transport = RecordingTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + second)
        loop.run_until_complete(asyncio.gather(*state.tasks))
        assert transport.written.startswith(b"HTTP/1.1 200 OK") and transport.written.endswith(b"ok")
        assert (protocol.deadline is not None) == owing and not transport.closed
        if owing:
            protocol.deadline.cancel()
            protocol._expire()  # the deadline's end, without the wait
            assert transport.closed
            assert "its request did not arrive whole within 1.5 s (--request-timeout)" in caplog.text
        protocol.connection_lost(None)
    finally:
        loop.close()


def test_requests_to_this_machine_s_servers_never_go_through_an_http_proxy(monkeypatch) -> None:
    """(port58 F8) With HTTP_PROXY set (a company proxy), httpx and urllib sent the tests' and the benchmarks'
    requests to their own 127.0.0.1 server through it: the proxy's 403, or a wait, for every /ask."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # a port nothing listens on: a request sent to this "proxy" is refused
    proxy = f"http://127.0.0.1:{closed.getsockname()[1]}"
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        assert httpx.get(url, timeout=10).status_code == 200  # the serve tests', bench_serve's and its reopen's client
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
        with benchmark_module("bench_trees") as bench_trees, bench_trees._LOCAL.open(url, timeout=10) as response:
            assert response.status == 200  # bench_trees' own opener, which needs no NO_PROXY
    finally:
        server.shutdown()
        server.server_close()
        closed.close()
