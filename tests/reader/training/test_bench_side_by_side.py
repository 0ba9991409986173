"""benchmarks/bench_side_by_side.py and benchmarks/cuda_mps.py: phases of workers side by side, and MPS that
starts, serves its clients and quits, or is reported missing without stopping the benchmark."""

from __future__ import annotations

import argparse
import json
import stat
import sys
from pathlib import Path

import pytest

from tests.fixtures.benchmarks import benchmark_module
from tests.reader.training.test_shared_norm import write_handful_triples


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("bench_side_by_side") as module:
        yield module


@pytest.fixture(scope="module")
def mps():
    with benchmark_module("cuda_mps") as module:
        yield module


def test_a_phase_is_a_worker_count_with_an_optional_wait(bench) -> None:
    assert bench.parse_phase("3") == (3, False)
    assert bench.parse_phase("1s") == (1, True)
    for bad in ("0", "s", "2x", "-1", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="a phase is N or Ns"):
            bench.parse_phase(bad)


def test_workers_train_each_phase_side_by_side_and_a_missing_mps_is_a_row(
    bench, mps, tiny_base: Path, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(mps, "control_binary", lambda: None)
    triples = write_handful_triples(tmp_path / "ranking", negatives=3)
    argv = ["--model", str(tiny_base), "--train", str(squad_file), "--shared-norm", str(triples), "--layers", "1",
            "--questions", "6", "--batch-size", "1", "--phases", "1", "1s", "2", "--seconds", "0.25", "--device", "cpu",
            "--threads", "1", "--sets", "plain", "mps"]  # fmt: skip
    assert bench.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    rows = json.loads(out[-1])["rows"]
    trained = [row for row in rows if "failed" not in row]
    assert [(row["set"], row["processes"], row["waits_each_step"]) for row in trained] == [
        ("plain", 1, False), ("plain", 1, True), ("plain", 2, False)
    ]
    for row in trained:
        assert len(row["windows_per_second_each"]) == row["processes"]
        assert all(rate > 0 for rate in row["windows_per_second_each"])
        assert row["windows_per_second"] == pytest.approx(sum(row["windows_per_second_each"]), abs=0.2)
        assert row["warm_up_seconds"] > 0
        assert row["warm_up_steps"] == 6, "one pass over 6 questions, 1 a step"
    assert rows[-1] == {"set": "mps", "failed": "no nvidia-cuda-mps-control on PATH or in /usr/local/nvidia/bin"}
    assert any(line.split()[:3] == ["plain", "2", "no"] and line.split()[-2].endswith("x") for line in out)


@pytest.mark.parametrize(("name", "compiled"), [("plain", False), ("mps", False), ("compile", True),
                                               ("compile+mps", True)])
def test_a_compiled_sets_workers_compile_and_every_worker_gets_its_phases(bench, name, compiled) -> None:
    """A compiled worker runs `train qa --compile`'s compile_layers (tests/reader/training/test_compile.py)."""
    command = bench.worker_command(["--layers", "4"], 1, Path("/sync"), [(1, False), (3, True)], name)
    assert command[2:7] == ["worker", "--index", "1", "--sync-dir", "/sync"]
    assert ("--compile" in command) is compiled
    assert command[command.index("--phases") + 1 :] == ["1", "3s"]
    parsed = bench.argument_parser().parse_args([*command[2:], "--model", "m", "--train", "t", "--shared-norm", "s"])
    assert parsed.role == "worker" and parsed.index == 1 and parsed.sync_dir == Path("/sync")
    assert parsed.compile is compiled and parsed.phases == [(1, False), (3, True)] and parsed.layers == 4


def test_compile_with_mps_runs_as_compile_where_mps_cannot_start(
    bench, mps, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mps, "control_binary", lambda: None)
    ran: list[tuple[str, list[tuple[int, bool]]]] = []

    def run_workers(args, env, phases, name):
        ran.append((name, phases))
        return [{"set": name, "processes": count, "waits_each_step": waits, "windows_per_second_each": [1.0] * count,
                 "windows_per_second": float(count), "warm_up_seconds": 1.0} for count, waits in phases]  # fmt: skip

    monkeypatch.setattr(bench, "run_workers", run_workers)
    (tmp_path / "m").mkdir()
    for name in ("t", "s"):
        (tmp_path / name).write_text("{}", encoding="utf-8")
    argv = ["--model", str(tmp_path / "m"), "--train", str(tmp_path / "t"), "--shared-norm", str(tmp_path / "s"),
            "--phases", "1", "1s", "3", "--sets", "plain", "compile+mps", "mps"]  # fmt: skip
    assert bench.main(argv) == 0
    assert ran == [("plain", [(1, False), (1, True), (3, False)]), ("compile", [(1, False), (3, False)])]
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert [row["set"] for row in rows if "failed" in row] == ["compile+mps", "mps"]


def test_a_worker_that_cannot_start_is_named_with_its_error(
    bench, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not-a-model").mkdir()  # there, but no checkpoint: the worker fails as it loads it
    argv = ["--model", str(tmp_path / "not-a-model"), "--train", str(squad_file), "--shared-norm", str(squad_file),
            "--phases", "1", "--device", "cpu", "--startup-timeout", "120"]  # fmt: skip
    assert bench.main(argv) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"]
    assert len(rows) == 1 and rows[0]["set"] == "plain" and rows[0]["failed"].startswith("worker 0 exited")
    assert "not-a-model" in rows[0]["failed"]


@pytest.mark.parametrize("missing", ["--model", "--train", "--shared-norm"])
def test_a_missing_input_is_a_usage_error_before_any_worker_starts(
    bench, squad_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    missing: str,
) -> None:
    """bench53 F14: a missing --model failed in every worker; the run printed a "failed" row ending in a
    traceback's last lines and exited 0."""
    monkeypatch.setattr(bench, "run_workers", lambda *args: pytest.fail("a worker was started"))
    (tmp_path / "model").mkdir()
    given = {"--model": str(tmp_path / "model"), "--train": str(squad_file), "--shared-norm": str(squad_file),
             missing: str(tmp_path / "absent")}  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        bench.main([word for flag, path in given.items() for word in (flag, path)])
    assert stopped.value.code == 2
    kind = "folder" if missing == "--model" else "file"
    assert f"error: {missing} {tmp_path / 'absent'}: no such {kind}" in capsys.readouterr().err


def _fake_control(tmp_path: Path, servers: str = "4242", start_exit: int = 0) -> tuple[Path, Path]:
    """A stand-in for nvidia-cuda-mps-control that logs its arguments, stdin and pipe directory, lists `servers`
    for get_server_list, and exits `start_exit` for -d (1: a daemon already serves that directory)."""
    log = tmp_path / "control.log"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "data = '' if sys.argv[1:] else sys.stdin.read().strip()\n"
        f"with open({str(log)!r}, 'a') as log:\n"
        "    log.write(' '.join(sys.argv[1:]) + '|' + data + '|' + os.environ['CUDA_MPS_PIPE_DIRECTORY'] + '\\n')\n"
        f"if data == 'get_server_list':\n    print({servers!r})\n"
        f"if sys.argv[1:] == ['-d'] and {start_exit}:\n    print('An instance of this daemon is already running')\n"
        f"    sys.exit({start_exit})\n",
        encoding="utf-8",
    )
    control.chmod(control.stat().st_mode | stat.S_IXUSR)
    return control, log


def _commands(log: Path) -> list[str]:
    """What the stand-in was asked, in order: its argument or the line on its stdin."""
    return [line.split("|")[0] or line.split("|")[1] for line in log.read_text(encoding="utf-8").splitlines()]


def test_mps_serves_its_clients_and_quits(mps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control, log = _fake_control(tmp_path)
    monkeypatch.setattr(mps, "control_binary", lambda: control)
    monkeypatch.setattr(mps, "CLIENT_CHECK", "import os; assert os.environ['CUDA_MPS_PIPE_DIRECTORY']")
    with mps.mps_server(tmp_path / "mps") as server:
        assert server.note == "on"
        assert server.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "pipe")
        assert server.env["CUDA_MPS_LOG_DIRECTORY"] == str(tmp_path / "mps" / "log")
        assert _commands(log) == ["-d", "get_server_list"]
    assert _commands(log) == ["-d", "get_server_list", "quit"]
    assert {line.split("|")[2] for line in log.read_text(encoding="utf-8").splitlines()} == {
        str(tmp_path / "mps" / "pipe")
    }


def test_a_daemon_left_running_is_used(mps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    control, log = _fake_control(tmp_path, start_exit=1)
    monkeypatch.setattr(mps, "control_binary", lambda: control)
    monkeypatch.setattr(mps, "CLIENT_CHECK", "print('ok')")
    with mps.mps_server(tmp_path / "mps") as server:
        assert server.env is not None and server.note.startswith("on (a daemon was already serving")
    assert _commands(log)[-1] == "quit"


@pytest.mark.parametrize(
    ("check", "servers", "reason"),
    [
        ("raise SystemExit('no CUDA device')", "4242", "a CUDA client failed under MPS: exit 1: no CUDA device"),
        ("print('ok')", "", "no MPS server listed after a client ran (none)"),
    ],
)
def test_mps_that_serves_no_client_quits_and_says_why(
    mps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, check: str, servers: str, reason: str
) -> None:
    control, log = _fake_control(tmp_path, servers=servers)
    monkeypatch.setattr(mps, "control_binary", lambda: control)
    monkeypatch.setattr(mps, "CLIENT_CHECK", check)
    with mps.mps_server(tmp_path / "mps") as server:
        assert server.env is None and server.note == reason
        assert _commands(log) == ["-d", "get_server_list", "quit"]


def test_a_missing_control_program_is_no_error(mps, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mps, "DRIVER_BIN", tmp_path / "nowhere")
    assert mps.control_binary() is None
    with mps.mps_server(tmp_path / "mps") as server:
        assert server.env is None and "no nvidia-cuda-mps-control" in server.note
