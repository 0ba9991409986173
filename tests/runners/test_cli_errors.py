"""The README's exit-code promise: every command's user errors are one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dilstore.runners.cli import main
from tests.fixtures.limits import address_space_limit
from tests.fixtures.paths import ROOT
from tests.fixtures.pipes import empty_pipe


def squad_text(answers: list[dict[str, object]]) -> str:
    """A SQuAD v1.1 file's text: one question, id 'q', with `answers`, on the context "Paris is." (10 characters)."""
    question = {"id": "q", "question": "Where?", "answers": answers}
    return json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "Paris is. ", "qas": [question]}]}]})


def filled(words: list[str], **places: Path) -> list[str]:
    """`words` with each `{name}` replaced by the path given for it (`filled(["{tmp}/q.json"], tmp=tmp_path)`)."""
    for name, path in places.items():
        words = [word.replace(f"{{{name}}}", str(path)) for word in words]
    return words


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["precompute", "--output", "/proc/dilstore-cannot-write/store"], "dilstore precompute: error: "),
        # Beam ignored the second file without a word, and the run read the first alone (review45b).
        (["precompute", "--input", "{tmp}/a.jsonl", "{tmp}/b.jsonl", "--output", "{tmp}/s", "--temp_location", "t"],
         "dilstore precompute: error: '{tmp}/b.jsonl' is neither an option nor an option's value: each corpus file "
         "takes an --input of its own"),
        (["precompute", "--save_main_session", "--input", "{tmp}/a.jsonl", "{tmp}/b.jsonl", "--output", "{tmp}/s"],
         "dilstore precompute: error: '{tmp}/b.jsonl' is neither an option"),  # after an on/off flag (review45c F2)
        (["info", "{tmp}/no-store"], "dilstore info: error: "),
        (["index", "{tmp}/no-store"], "dilstore index: error: "),
        (["index", "https://127.0.0.1:9/store"], "dilstore index: error: https://127.0.0.1:9/store is a URL"),
        (["info", "s3-nowhere://bucket/store"], "dilstore info: error: cannot open store s3-nowhere://bucket/store"),
        # The local filesystem takes nothing under it: this opened the current folder, a store there too (left60 F2).
        (["info", "local::file://{tmp}/no-store"],
         "dilstore info: error: cannot open store local::file://{tmp}/no-store: local:: is the local filesystem, "
         "which reads no other filesystem under it; give file://{tmp}/no-store itself"),
        (["serve", "http://127.0.0.1:9/store", "--port", "0"], "dilstore serve: error: cannot reach store"),
        # Path folded the URL's `//`: "no Lucene index at http:/127.0.0.1:9/store/bm25" (multi53 F5).
        (["ask", "{tmp}/no-store", "a question", "--index", "http://u:pw@127.0.0.1:9/store/bm25"],
         "dilstore ask: error: --index http://u:***@127.0.0.1:9/store/bm25 is a URL, and Lucene reads only local "
         "files: give a local copy of the store's bm25/ folder"),
        (["serve", "qa={tmp}/no-store", "--index", "qa=https://h/bm25", "--port", "0"],
         "dilstore serve: error: --index qa=https://h/bm25 is a URL, and Lucene reads only local files"),
        # A file: URL was ./file:/… ("no Lucene index at file:/…") or, with //, to be copied to a local one (url59 F2).
        (["ask", "{tmp}/no-store", "a question", "--index", "file:{tmp}/bm25"],
         "dilstore ask: error: --index file:{tmp}/bm25 is a URL: give its folder, {tmp}/bm25"),
        (["serve", "qa={tmp}/no-store", "--index", "qa=file://{tmp}/bm25", "--port", "0"],
         "dilstore serve: error: --index qa=file://{tmp}/bm25 is a URL: give its folder, {tmp}/bm25"),
        (["rerank", "{tmp}/no-store", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
         "dilstore rerank: error: "),
        (["evaluate-rank", "--qrels", "{tmp}/q.txt", "--run", "{tmp}/r.trec"], "dilstore evaluate-rank: error: "),
        (["ask", "{tmp}/no-store", "a question"], "dilstore ask: error: "),
        (["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/q.jsonl"], "dilstore evaluate-qa: error: "),
        (["evaluate-rc", "--data", "{tmp}/none.json"], "dilstore evaluate-rc: error: "),
        (["serve", "{tmp}/no-store", "--port", "0"], "dilstore serve: error: "),
        (["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"], "dilstore train: error: "),
        (
            ["train", "qa", "--layers", "1", "--train", "{tmp}/none.json", "--output", "{tmp}/o"],
            "dilstore train: error: ",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(
    arguments: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "a corpus file"}\n')  # inputs are checked first (ci59 F2)
    status = main(filled(arguments, tmp=tmp_path))
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(filled([message], tmp=tmp_path)[0]), err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["train", "ranking-data", "--squad", "{tmp}", "--output", "{tmp}/o"],
         "--squad {tmp}: is a directory; give a file"),
        (["train", "listformer", "--triples", "{tmp}", "--output", "{tmp}/o"],
         "--triples {tmp}: is a directory; give a file"),
        (["train", "qa", "--layers", "1", "--train", "/dev/null", "--output", "{tmp}/o"],
         "--train /dev/null: is not a regular file; give a file (a pipe, such as <(zcat FILE), can be read only once, "
         "and this file is read more than once)"),
        (["train", "qa", "--layers", "1", "--train", "{tmp}/squad.json", "--teacher", "{tmp}/squad.json",
          "--output", "{tmp}/o"], "--teacher {tmp}/squad.json: is a file, not a directory"),
        (["train", "ranking-data", "--squad", "{tmp}/squad.json", "--output", "{tmp}/squad.json"],
         "--output {tmp}/squad.json: is a file, not a folder"),
        (["train", "earl", "--triples", "{tmp}/squad.json", "--output", "{tmp}/squad.json"],
         "--output {tmp}/squad.json: is a file, not a folder"),
    ],
)
def test_an_input_of_the_wrong_kind_is_named_as_such(
    arguments: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder given as a file was reported as "no such file", which sent users looking for a missing path."""
    (tmp_path / "squad.json").write_text("{}", encoding="utf-8")
    status = main(filled(arguments, tmp=tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and err.strip().endswith(message.replace("{tmp}", str(tmp_path))), err


_RUNTIME = [
    ["ask", "{tmp}/no-store", "a question"],
    ["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/q.jsonl"],
    ["evaluate-rc", "--data", "{tmp}/none.json"],
    ["rerank", "{tmp}/no-store", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
    ["serve", "{tmp}/no-store", "--port", "0"],
    ["train", "qa", "--layers", "1", "--train", "{tmp}/none.json", "--output", "{tmp}/o"],
]


@pytest.mark.parametrize(
    ("arguments", "option", "message"),
    [
        *[(command, ["--threads", "0"], "--threads: expected a positive integer, got 0") for command in _RUNTIME],
        (_RUNTIME[0], ["--threads", "-3"], "--threads: expected a positive integer, got -3"),
        (["index", "{tmp}/no-store"], ["--threads", "0"], "--threads: expected a positive integer"),
        (["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"], ["--threads", "0"],
         "--threads: expected a positive integer"),
        (["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"], ["--seed", "-1"],
         "--seed: expected a seed from 0 to 4294967295, got -1"),
        *[(command, ["--device", "bogus"], "--device: not a torch device: 'bogus'") for command in _RUNTIME],
        (_RUNTIME[0], ["--device", "cuda:7"], "--device: cuda:7: this machine has"),
        (_RUNTIME[0], ["--device", "meta"], "--device: meta: dilstore runs on cpu, cuda or mps devices"),
    ],
)
def test_bad_threads_and_devices_are_usage_errors_before_the_command_runs(
    arguments: list[str], option: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch would raise on them later (set_num_threads, torch.device), as a traceback."""
    with pytest.raises(SystemExit) as exited:
        main(filled(arguments, tmp=tmp_path) + option)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and message in err.strip().splitlines()[-1] and "Traceback" not in err


@pytest.mark.parametrize("command", _RUNTIME)  # precompute's: test_precompute_checks (read61 F1)
def test_more_threads_than_the_cpus_can_use_are_a_usage_error(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--threads 18446744073709551616` ended ask, evaluate-*, rerank, serve and train in a ValueError traceback from
    torch.set_num_threads, and precompute in "the pipeline failed: ValueError: Overflow when unpacking long long"
    after its model load, naming no option (complex61 F9). Refused as --workers is, past 4 per usable CPU."""
    from dilstore.storage.cpus import usable_cpu_count

    most = 4 * usable_cpu_count()
    for threads in (2**64, most + 1):
        with pytest.raises(SystemExit) as exited:
            main(filled(command, tmp=tmp_path) + ["--threads", str(threads)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err
        assert err.strip().splitlines()[-1].endswith(f"argument --threads: expected at most {most} threads (4 per CPU "
                                                     f"of the {usable_cpu_count()} this process may use), got "
                                                     f"{threads}")  # fmt: skip


@pytest.mark.parametrize("command", [["index", "{tmp}/no-store"],
                                     ["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"]])
def test_more_bm25_threads_than_the_cpus_can_use_are_a_usage_error(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`index --threads 100000` failed after the store's checks as "the BM25 index ... could not be built
    (java.lang.IllegalArgumentException: None)", and 2147483648 as an args4j line about "-threads", neither naming
    the option (complex61 F10). Refused as torch's --threads is, past 4 per usable CPU."""
    from dilstore.storage.cpus import usable_cpu_count

    most = 4 * usable_cpu_count()
    with pytest.raises(SystemExit) as exited:
        main(filled(command, tmp=tmp_path) + ["--threads", str(most + 1)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().splitlines()[-1].endswith(
        f"argument --threads: expected at most {most} threads (4 per CPU of the {usable_cpu_count()} this process may "
        f"use), got {most + 1}")  # fmt: skip


@pytest.mark.parametrize("cpus", [1, 3])
def test_four_threads_per_usable_cpu_are_taken_and_one_more_is_refused(cpus: int, monkeypatch) -> None:
    """(mut61 M2) --threads' bound was seen only past it, and only at this machine's count: a bound that refused the
    4 per CPU its error promises, or one counted from os.cpu_count() (past a cgroup quota), went unseen."""
    from dilstore.runners.arg_types import thread_count
    from dilstore.storage import cpus as cpu_counts

    monkeypatch.setattr(cpu_counts, "usable_cpu_count", lambda: cpus)
    assert thread_count(str(4 * cpus)) == 4 * cpus
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        thread_count(str(4 * cpus + 1))
    assert str(refused.value) == (f"expected at most {4 * cpus} threads (4 per CPU of the {cpus} this process may "
                                  f"use), got {4 * cpus + 1}")  # fmt: skip


@pytest.mark.parametrize("command", [["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/q.jsonl"],
                                     ["evaluate-rc", "--data", "{tmp}/none.json"]])  # fmt: skip
def test_a_seed_without_a_limit_is_refused(command: list[str], tmp_path: Path, capsys) -> None:
    """It picks the --limit subset; without --limit every question was scored and the seed silently ignored."""
    assert main(filled(command, tmp=tmp_path) + ["--seed", "3"]) == 2
    assert capsys.readouterr().err.endswith("error: --seed picks the --limit subset; give --limit too, or leave "
                                            "--seed out to score all\n")  # fmt: skip


@pytest.mark.parametrize(
    ("command", "option"),
    [(["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/q.jsonl", "--limit", "2"], "--seed"),
     (["evaluate-rc", "--data", "{tmp}/none.json", "--limit", "2"], "--seed"),
     (["evaluate-rc", "--data", "{tmp}/none.json", "--score", "{tmp}/p.json", "--limit", "2"], "--seed"),
     (["train", "qa", "--layers", "1", "--train", "{tmp}/t.json", "--dev", "{tmp}/d.json", "--eval-limit", "2"],
      "--eval-seed")],
)  # fmt: skip
def test_a_negative_subset_seed_is_a_usage_error_naming_the_option(
    command: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left55b F1) Python's random.Random seeds with the absolute value, so `--seed -1` scored the very subset of
    `--seed 1` without a word; a large seed, which draws a subset of its own, is still taken."""
    with pytest.raises(SystemExit) as exited:
        main(filled(command, tmp=tmp_path) + [option, "-1"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().splitlines()[-1].endswith(
        f"argument {option}: expected a seed of at least 0, got -1"
    )
    from dilstore.runners.cli import build_parser, parse

    args = parse(build_parser(), filled(command, tmp=tmp_path) + [option, str(2**40)])
    assert getattr(args, option[2:].replace("-", "_")) == 2**40


@pytest.mark.parametrize(
    "option", ["--epochs", "--batch-size", "--gradient-accumulation-steps", "--log-every", "--keep-checkpoints",
               "--max-steps"],
)  # fmt: skip
def test_training_loop_settings_below_1_are_named_by_their_option(
    option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--gradient-accumulation-steps 0` was refused as "gradient-accumulation", an option no command has."""
    (tmp_path / "squad.json").write_text(squad_text([{"text": "Paris", "answer_start": 0}]), encoding="utf-8")
    arguments = ["train", "qa", "--layers", "1", "--train", str(tmp_path / "squad.json"), "--output", str(tmp_path)]
    assert main([*arguments, option, "0"]) == 2
    assert capsys.readouterr().err == f"dilstore train: error: {option[2:]} must be at least 1, got 0\n"


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        (_RUNTIME[5] + ["--dev", "{tmp}/none.json"], ["--eval-batch-size", "0"]),
        (_RUNTIME[2], ["--max-answer-length", "0"]),
        (_RUNTIME[2], ["--doc-stride", "-1"]),
        (["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"], ["--negatives", "0"]),
        (["train", "ranking-data", "--squad", "{tmp}/none.json", "--output", "{tmp}/o"], ["--depth", "0"]),
        (_RUNTIME[0], ["--n-best", "0"]),
        (_RUNTIME[1], ["--max-answer-length", "-1"]),
        (_RUNTIME[0], ["--pair-batch-tokens", "0"]),
        (_RUNTIME[1], ["--max-pairs-per-batch", "0"]),
        (_RUNTIME[0], ["--max-question-length", "2"]),
    ],
)
def test_counts_below_1_are_usage_errors_naming_the_option(
    arguments: list[str], option: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked late, `train qa --eval-batch-size 0` trained to the end and then blamed "batch-size"; `ask` and
    `evaluate-qa` named their settings' fields ("n_best must be at least 1")."""
    with pytest.raises(SystemExit) as exited:
        main(filled(arguments, tmp=tmp_path) + option)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    expected = "an integer of at least 3" if option[0] == "--max-question-length" else "a positive integer"
    assert exited.value.code == 2 and f"argument {option[0]}: expected {expected}, got {option[1]}" in last


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        (["rerank", "{store}", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output", "{store}/manifest.json"],
         "--output"),
        (["evaluate-qa", "{store}", "--questions", "{tmp}/q.jsonl", "--predictions", "{store}/sub/../p.json"],
         "--predictions"),
    ],
)
def test_an_output_inside_the_store_read_is_refused_before_anything_is_written(
    arguments: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rerank --output STORE/manifest.json` replaced the manifest and left a store that verify calls damaged."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    status = main(filled(arguments, store=store, tmp=tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and f"error: {flag} {store}/" in err
    assert f"is inside the store {store}; write it elsewhere" in err
    assert (store / "manifest.json").read_text() == "{}"
    assert sorted(path.name for path in store.iterdir()) == ["manifest.json"]


@pytest.mark.parametrize("command", ["rerank", "evaluate-qa"])
def test_an_output_inside_the_store_given_by_relative_paths_is_refused(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from the store's parent folder, `STORE/manifest.json` is inside STORE just as its absolute path is."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    flag = "--output" if command == "rerank" else "--predictions"
    source = ["--topics", "t.tsv", "--run", "r.trec"] if command == "rerank" else ["--questions", "q.jsonl"]
    status = main([command, "store", *source, flag, "store/manifest.json"])
    err = capsys.readouterr().err
    assert status == 2
    refusal = f"{flag} store/manifest.json is inside the store store; write it elsewhere"
    assert err == f"dilstore {command}: error: {refusal}\n"
    assert (tmp_path / "store" / "manifest.json").read_text() == "{}"


@pytest.mark.parametrize("prefix", ["file:", "file://", "simplecache::file://", "filecache::"])
def test_an_output_inside_a_store_given_as_a_file_url_is_refused(
    prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(url59 F1) The store read as `file:/abs/st` or `file:///abs/st` (its readers open the folder /abs/st) was not
    checked: the first was looked for at ./file:/abs/st, the second passed as remote, and `--predictions
    /abs/st/p.json` went into the store, which verify then calls damaged. (left60 F2) So did a cache over that
    folder, `simplecache::file:///abs/st` or `filecache::/abs/st`."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    url = f"{prefix}{store}"
    status = main(["evaluate-qa", url, "--questions", f"{tmp_path}/q.jsonl", "--predictions", f"{store}/p.json"])
    assert status == 2
    assert capsys.readouterr().err.endswith(f"error: --predictions {store}/p.json is inside the store {url}; write "
                                            "it elsewhere\n")  # fmt: skip


@pytest.mark.parametrize("prefix", ["simplecache::", "filecache::"])
def test_an_output_inside_a_store_given_as_a_cache_over_a_home_folder_is_refused(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(read60 F1) fsspec reads `simplecache::~/st` at the home folder's st, but the output check took the chain's
    last link as written, a folder named ~ in the current folder: `--predictions ~/st/p.json` (the shell expands that
    one) was written into the store, which verify then calls damaged."""
    monkeypatch.setenv("HOME", str(tmp_path))
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{}")
    url = f"{prefix}~/store"
    status = main(["evaluate-qa", url, "--questions", f"{tmp_path}/q.jsonl", "--predictions", f"{store}/p.json"])
    assert status == 2
    assert capsys.readouterr().err.endswith(f"error: --predictions {store}/p.json is inside the store {url}; write "
                                            "it elsewhere\n")  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        (["evaluate-rc", "--data", "{tmp}/d.json", "--model", "{model}", "--predictions", "{model}/config.json"],
         "--predictions"),
        (["evaluate-qa", "{tmp}", "--questions", "{tmp}/q.jsonl", "--model", "{model}", "--predictions",
          "{model}/config.json"], "--predictions"),
        (["rerank", "{tmp}", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--model", "{model}", "--output",
          "{model}/model.safetensors"], "--output"),
    ],
)
def test_an_output_inside_the_model_read_is_refused_before_anything_is_written(
    arguments: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`evaluate-rc --predictions MODEL/config.json` exited 0 and left a model that no longer loads (trainqa36 8)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    for name in ("d.json", "q.jsonl", "t.tsv", "r.trec"):
        (tmp_path / name).write_text("")
    status = main(filled(arguments, model=model, tmp=tmp_path))
    err = capsys.readouterr().err
    assert status == 2 and f"error: {flag} {model}/" in err and f"is inside the model folder {model};" in err, err
    assert (model / "config.json").read_text() == "{}" and (model / "model.safetensors").read_bytes() == b"weights"


def test_an_output_among_the_shipped_models_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the default --model, the same typo would have replaced a file of the checkpoint shipped in reader/models."""
    from dilstore.reader.packaged.shipped import default_checkpoint_dir

    shipped = default_checkpoint_dir() / "config.json"
    before = shipped.read_bytes()
    (tmp_path / "d.json").write_text("")
    assert main(["evaluate-rc", "--data", str(tmp_path / "d.json"), "--predictions", str(shipped)]) == 2
    assert "is inside the shipped models" in capsys.readouterr().err
    assert shipped.read_bytes() == before


def test_an_output_inside_a_folder_that_is_no_store_is_not_blamed(tmp_path: Path, capsys) -> None:
    """`rerank FOLDER ... --output FOLDER/o.trec` said the output was "inside the store", of a folder with no store."""
    arguments = ["rerank", str(tmp_path), "--topics", str(tmp_path / "t.tsv"), "--run", str(tmp_path / "r.trec")]
    (tmp_path / "t.tsv").write_text("q1\tquery\n")
    (tmp_path / "r.trec").write_text("q1 Q0 d1 1 1.0 bm25\n")
    assert main([*arguments, "--output", str(tmp_path / "o.trec")]) == 2
    err = capsys.readouterr().err
    assert err == f"dilstore rerank: error: no store at {tmp_path}: a folder with no dilstore manifest\n", err


@pytest.mark.parametrize("command", ["evaluate-rc", "evaluate-qa"])
@pytest.mark.parametrize(
    ("predictions", "message"),
    [
        ("{tmp}/nodir/p.json", "--predictions {tmp}/nodir/p.json: the folder {tmp}/nodir does not exist"),
        ("{tmp}", "--predictions {tmp} is a directory; give a file path"),
        ("{tmp}/data.json", "--predictions {tmp}/data.json is the input file {tmp}/data.json; write it elsewhere"),
    ],
)
def test_a_predictions_path_that_cannot_be_written_is_refused_before_the_evaluation(
    command: str, predictions: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found only at the end, it lost the whole evaluation's scores; `--predictions DATA` overwrote the input."""
    data = tmp_path / "data.json"
    data.write_text("{}")
    store = str(tmp_path / "no-store")
    source = ["--data", str(data)] if command == "evaluate-rc" else [store, "--questions", str(data)]
    status = main([command, *source, "--predictions", predictions.replace("{tmp}", str(tmp_path))])
    assert status == 2
    assert capsys.readouterr().err == f"dilstore {command}: error: {message.replace('{tmp}', str(tmp_path))}\n"
    assert data.read_text() == "{}"


@pytest.mark.parametrize("command", [["precompute", "--input", "{tmp}/c.jsonl", "--output", "{loop}"],
                                     ["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/c.jsonl",
                                      "--predictions", "{loop}"]], ids=["precompute", "evaluate-qa"])  # fmt: skip
def test_a_loop_of_symbolic_links_given_as_a_path_is_one_line(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(port58 F5) Python 3.11's and 3.12's Path.resolve() raises RuntimeError("Symlink loop from ...") for a link
    loop, and the commands ended with its traceback; it is the one line Python 3.13's OSError (ELOOP) gives."""
    (tmp_path / "c.jsonl").write_text('{"id": "d", "title": "t", "text": "words"}\n')
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    args = [part.replace("{tmp}", str(tmp_path)).replace("{loop}", str(loop)) for part in command]
    assert main(args) == 2
    assert capsys.readouterr().err == f"dilstore {command[0]}: error: Too many levels of symbolic links: {loop}\n"


@pytest.mark.parametrize("command", ["evaluate-qa", "rerank"])
def test_an_output_file_name_too_long_for_the_files_beside_it_is_refused_before_any_work(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(port58 F4) A name of 202 to 255 bytes (a legal one) ended the run after its first part's work: its journal's
    temporary, `.tmp-.NAME.dilstore-partial.HOST-PID.XXXXXXXX.tmp`, was "File name too long", and the error said to
    check the disk. One of 201 bytes passes this check (and meets the missing store)."""
    (tmp_path / "t.tsv").write_text("q\tquery\n")
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n")
    store, flag = str(tmp_path / "no-store"), "--output" if command == "rerank" else "--predictions"
    inputs = ["--topics", str(tmp_path / "t.tsv"), "--run", str(tmp_path / "r.trec")] if command == "rerank" else [
        "--questions", str(tmp_path / "t.tsv")]  # fmt: skip
    for length, refused in ((202, True), (201, False)):
        output = tmp_path / ("o" * length)
        assert main([command, store, *inputs, flag, str(output)]) == 2
        err = capsys.readouterr().err
        words = f"{flag} {output}: its name is {length} bytes long, and this file system allows at most 201 here"
        assert (words in err) is refused and len(err.splitlines()) == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == ["r.trec", "t.tsv"]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("{tmp}", "--output {tmp} is a directory; give a file path"),
        ("{tmp}/nodir/o.trec", "--output {tmp}/nodir/o.trec: the folder {tmp}/nodir does not exist"),
        ("{tmp}/r.trec", "--output {tmp}/r.trec is the input file {tmp}/r.trec; write it elsewhere"),
        # Another spelling of the input's path is the input all the same.
        ("{tmp}/sub/../r.trec", "--output {tmp}/sub/../r.trec is the input file {tmp}/r.trec; write it elsewhere"),
    ],
)
def test_a_rerank_output_that_cannot_be_written_is_refused_before_the_store_opens(
    output: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--output .` was "Device or resource busy" after the whole rerank; `--output RUN` overwrote the input run."""
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "t.tsv").write_text("q\tquery\n")
    args = ["rerank", str(tmp_path / "no-store"), "--topics", str(tmp_path / "t.tsv"),
            "--run", str(tmp_path / "r.trec"), "--output", output.replace("{tmp}", str(tmp_path))]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err == f"dilstore rerank: error: {message.replace('{tmp}', str(tmp_path))}\n"
    assert (tmp_path / "r.trec").read_text() == "q Q0 d 1 1.0 t\n"


def test_a_rerank_output_in_a_folder_that_cannot_be_written_is_refused_before_the_store_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A read-only folder was found only once every query was reranked (rank38 L5). The suite may run as root, whom
    no folder's permissions stop, so the read-only mount is stood in for."""
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n")
    (tmp_path / "t.tsv").write_text("q\tquery\n")
    read_only = tmp_path / "mounted"
    read_only.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: Path(path) != read_only and access(path, mode, **kw))
    args = ["rerank", str(tmp_path / "no-store"), "--topics", str(tmp_path / "t.tsv"),
            "--run", str(tmp_path / "r.trec"), "--output", str(read_only / "o.trec")]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err == (f"dilstore rerank: error: --output {read_only / 'o.trec'}: the folder "
                                       f"{read_only} cannot be written to\n")


def test_an_output_another_user_owns_in_a_sticky_folder_is_refused_before_the_store_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(perm57 F6) In a folder with the sticky bit (/tmp, a team's scratch), only a file's owner may replace it: an
    `evaluate-qa --predictions` or `rerank --output` naming a teammate's file ran to its end, then failed with
    "Operation not permitted: DIR/.tmp-NAME... -> NAME" and "run the same command again once NAME can be written",
    which it never could. Root replaces any file, so this user is stood in for by its uid."""
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n")
    (tmp_path / "t.tsv").write_text("q\tquery\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "o.trec").write_text("a teammate's run\n")
    shared.chmod(0o1777)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(shared).st_uid + 4242)
    args = ["rerank", str(tmp_path / "no-store"), "--topics", str(tmp_path / "t.tsv"),
            "--run", str(tmp_path / "r.trec"), "--output", str(shared / "o.trec")]  # fmt: skip
    assert main(args) == 2
    assert capsys.readouterr().err == (f"dilstore rerank: error: --output {shared / 'o.trec'} belongs to another user, "
                                       f"and its folder {shared} has the sticky bit (as /tmp has), where only a file's "
                                       "owner may replace it; give another path, or have its owner remove it\n")
    shared.chmod(0o777)
    assert main([*args[:-1], str(shared / "o.trec")]) == 2 and "no-store" in capsys.readouterr().err  # not sticky


@pytest.mark.parametrize(("user", "folder_mode", "folder_owner", "file_owner", "refused"), [
    (5, 0o1777, 0, 6, True),  # /tmp: another user's file
    (5, 0o1777, 0, 5, False),  # this user's own file in /tmp
    (5, 0o1777, 5, 6, False),  # a sticky folder of this user's: its owner may replace any file in it
    (5, 0o0777, 0, 6, False),  # no sticky bit
    (0, 0o1777, 6, 6, False),  # root replaces any file
])
def test_only_another_user_s_file_in_a_sticky_folder_it_does_not_own_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: int, folder_mode: int, folder_owner: int, file_owner: int,
    refused: bool,
) -> None:
    """(mut57c) The test above holds every file and folder by one owner: refusing this user's own file in /tmp, or
    any file in a sticky folder of its own, or any output for root, went unseen. Owners other than this process's
    are what stat says here (only root could chown)."""
    from dilstore.storage.replacement import sticky_keeps

    folder = tmp_path / "shared"
    folder.mkdir()
    output = folder / "o.trec"
    output.write_text("")
    owners = {folder: (stat.S_IFDIR | folder_mode, folder_owner), output: (stat.S_IFREG | 0o644, file_owner)}
    real = Path.stat

    def faked(path: Path, *, follow_symlinks: bool = True) -> os.stat_result:
        if path in owners:
            mode, uid = owners[path]
            return os.stat_result((mode, 0, 0, 1, uid, 0, 0, 0, 0, 0))
        return real(path, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "stat", faked)
    monkeypatch.setattr(os, "geteuid", lambda: user)
    assert sticky_keeps(output) is refused
    assert not sticky_keeps(folder / "new.trec")  # nothing there to replace


@pytest.mark.parametrize("kind", ["symlink", "fifo", "dash"])
def test_an_output_that_writing_would_replace_is_refused(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rerank --output /dev/stdout` replaced the machine's /dev/stdout link with a file holding the run (the file is
    written whole and renamed into place); a device or a pipe was replaced alike, and `-` became a file named `-`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n")
    (tmp_path / "t.tsv").write_text("q\tquery\n")
    target = tmp_path / "kept.trec"
    target.write_text("kept\n")
    output = tmp_path / "out.trec"
    if kind == "symlink":
        output.symlink_to(target)
        message = f"--output {output} is a symbolic link (to {target}), which writing would replace with a file"
    elif kind == "fifo":
        os.mkfifo(output)
        message = f"--output {output} is not a regular file (a device, pipe or socket)"
    else:
        output = Path("-")
        message = "--output -: the output is written to a file, not to stdout; give its path"
    args = ["rerank", str(tmp_path / "no-store"), "--topics", "t.tsv", "--run", "r.trec", "--output", str(output)]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"dilstore rerank: error: {message}")
    assert target.read_text() == "kept\n" and not (tmp_path / "-").exists()
    assert output.is_symlink() if kind == "symlink" else kind == "dash" or stat.S_ISFIFO(output.lstat().st_mode)


@pytest.mark.parametrize(("command", "flag"), [
    (["evaluate-rc", "--data", "{fifo}"], "--data"),
    (["evaluate-qa", "{tmp}/no-store", "--questions", "{fifo}", "--predictions", "{tmp}/p.json"], "--questions"),
    (["rerank", "{tmp}/no-store", "--topics", "{fifo}", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
     "--topics"),
    (["rerank", "{tmp}/no-store", "--topics", "{tmp}/t.tsv", "--run", "{fifo}", "--output", "{tmp}/o.trec"], "--run"),
])  # fmt: skip
def test_a_pipe_given_for_a_file_read_twice_is_refused_before_any_work(
    command: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--questions <(zcat ...)` was read to load it and again, empty, for its checksum: a resume took another piped
    file's answers as its own, and evaluate-rc reported the checksum of zero bytes (qa48 H1); rerank's `--run`
    alike (review48b B1)."""
    (tmp_path / "t.tsv").write_text("q\tquery\n", encoding="utf-8")
    (tmp_path / "r.trec").write_text("q Q0 d 1 1.0 t\n", encoding="utf-8")
    with empty_pipe(tmp_path / "piped.json") as fifo:
        arguments = [part.replace("{fifo}", str(fifo)) for part in filled(command, tmp=tmp_path)]
        assert main(arguments) == 2
    assert capsys.readouterr().err.startswith(f"dilstore {command[0]}: error: {flag} {fifo}: is not a regular file; "
                                              "give a file (a pipe, such as <(zcat FILE), can be read only once")


def test_evaluate_rc_refuses_windows_longer_than_the_model_s_positions_before_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Accepted, it failed at the first long window, after the work before it."""
    data = tmp_path / "data.json"
    data.write_text(squad_text([{"text": "Paris", "answer_start": 0}]))
    assert main(["evaluate-rc", "--data", str(data), "--max-seq-length", "100000"]) == 2
    assert capsys.readouterr().err == ("dilstore evaluate-rc: error: the window limit 100000 (--max-seq-length) is "
                                       "more than this model's 512 positions\n")


def test_evaluate_rc_on_a_base_model_says_it_needs_a_trained_reader(
    tiny_base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It suggested --layers K, an option evaluate-rc does not have (and a base model's QA head is untrained)."""
    data = tmp_path / "data.json"
    data.write_text("{}")
    status = main(["evaluate-rc", "--model", str(tiny_base), "--data", str(data)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"dilstore evaluate-rc: error: {tiny_base} is a base model without")
    assert "give a reader that `dilstore train qa` wrote" in err and "--layers" not in err


def test_serve_names_a_port_in_use_or_an_unknown_host_before_opening_any_store(tmp_path: Path, capsys) -> None:
    """The store does not exist: an error about the address shows it was checked first (stores can take long)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tmp_path / "no-store"), "--port", str(port)]) == 2
        expected = f"dilstore serve: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
        assert capsys.readouterr().err == expected
    assert main(["serve", str(tmp_path / "no-store"), "--host", "no-such-host.invalid", "--port", "0"]) == 2
    assert capsys.readouterr().err.startswith("dilstore serve: error: --host no-such-host.invalid: cannot resolve it (")


def test_an_os_error_inside_a_command_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Any OSError a command lets through (here: a permission error) becomes one line naming the file."""
    import dilstore.runners.cmd_store as cmd_store

    def refuse(args) -> int:
        raise PermissionError(13, "Permission denied", "/stores/locked")

    monkeypatch.setattr(cmd_store, "run_info", refuse)
    parser_run = main(["info", "/stores/locked"])
    assert parser_run == 2
    assert capsys.readouterr().err == "dilstore info: error: Permission denied: /stores/locked\n"


def test_a_command_s_error_hides_a_store_password_and_a_bug_s_runtime_error_is_shown_in_full(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(mut61 M8) The last line of an OSError and of a DilstoreError hides the password of a store URL it names, an
    OSError of no errno is its own words (not "None"), and a RuntimeError that is no shortage or link loop is a bug
    raised in full, not "error: None": no test held any of them."""
    import dilstore.runners.cmd_store as cmd_store
    from dilstore.storage.errors import DilstoreError
    from dilstore.storage.secrets import remember_secrets

    url = "https://reader:hunter2@stores.example/store"
    remember_secrets(url)
    errors = iter([PermissionError(13, "Permission denied", f"{url}/manifest.json"), OSError("the server hung up"),
                   DilstoreError(f"{url}: not a store"), RuntimeError("a bug")])  # fmt: skip

    def fail(args: argparse.Namespace) -> int:
        raise next(errors)

    monkeypatch.setattr(cmd_store, "run_info", fail)
    hidden = "https://reader:***@stores.example/store"
    for line in (f"Permission denied: {hidden}/manifest.json", "the server hung up", f"{hidden}: not a store"):
        assert main(["info", "/stores/locked"]) == 2
        assert capsys.readouterr().err == f"dilstore info: error: {line}\n"
    with pytest.raises(RuntimeError, match="^a bug$"):
        main(["info", "/stores/locked"])


def test_an_unreadable_input_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Checked up front (os.access; root reads everything, so the check is simulated here)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "text"}\n')
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == corpus else real_access(path, mode))
    assert main(["precompute", "--input", str(corpus), "--output", str(tmp_path / "store")]) == 2
    assert f"--input {corpus}: permission denied" in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("flag", ["--input", "--output", "--model", "--codebook"])
def test_a_precompute_path_that_is_not_utf8_is_refused_before_anything_is_written(
    flag: str, tmp_path: Path, capsys
) -> None:
    """(unicode56 F7) The store records its inputs, model and folder in UTF-8 files: an --input so named was "text
    that is not valid UTF-8" naming no file, and an --output so named ran the whole encoding and failed as the store
    was finished ('utf-8 [while running 'Precompute/Finish']' codec can't encode), at every rerun again."""
    named = tmp_path / os.fsdecode(b"caf\xe9")  # Latin-1 bytes, as a file copied from an old system is named
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "text"}\n', encoding="utf-8")
    paths = {"--input": corpus, "--output": tmp_path / "store", "--model": None, "--codebook": None}
    if flag == "--input":
        named.write_bytes(corpus.read_bytes())
    elif flag in ("--model", "--codebook"):
        named.mkdir()
    paths[flag] = named
    given = [word for option, path in paths.items() if path is not None for word in (option, str(path))]
    encoding = ["--encoding", "2bit"] if flag == "--codebook" else []
    assert main(["precompute", *given, *encoding, "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"dilstore precompute: error: {flag} {tmp_path}/caf\\xe9: its path is not "
                                       "UTF-8 text, which the store's records (its settings, summary and dead letters) "
                                       "hold: give it a UTF-8 name\n")  # fmt: skip
    assert not (tmp_path / "store").exists() and not list(tmp_path.glob("*store*"))


def test_a_relative_precompute_output_under_a_folder_whose_name_is_not_utf8_is_refused(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(left56b F2) `--output out` is UTF-8 as given, but the store records its folder as an absolute path: run from a
    folder whose name is not UTF-8, the run would encode everything and fail as the store was finished (unicode56
    F7). The check of the absolute form refuses it first; no test ran precompute from such a folder (mut56 M88)."""
    here = tmp_path / os.fsdecode(b"d\xff")
    here.mkdir()
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "text"}\n', encoding="utf-8")
    monkeypatch.chdir(here)
    assert main(["precompute", "--input", str(corpus), "--output", "out", "--model", str(tmp_path / "no-model"),
                 "--no-progress"]) == 2  # fmt: skip
    assert capsys.readouterr().err == ("dilstore precompute: error: --output out: its path is not UTF-8 text, which "
                                       "the store's records (its settings, summary and dead letters) hold: give it a "
                                       "UTF-8 name\n")  # fmt: skip
    assert list(here.iterdir()) == []


def test_verify_reports_a_missing_store_as_a_problem_with_exit_1(tmp_path: Path, capsys) -> None:
    """verify's own promise: 1 when the store has a problem (here: there is none), with no traceback."""
    assert main(["verify", str(tmp_path / "no-store")]) == 1
    captured = capsys.readouterr()
    assert "no store at" in captured.out and "Traceback" not in captured.err


@pytest.mark.parametrize("blank", ["", "  "])
@pytest.mark.parametrize("command", ["info", "verify", "index", "ask"])
def test_an_empty_store_path_is_named_as_such(command: str, blank: str, capsys) -> None:
    """'' read as the current folder, and the message named a blank store: "the store at  was never finalized"."""
    assert main([command, blank] + (["Who?"] if command == "ask" else [])) == 2
    assert capsys.readouterr().err == f"dilstore {command}: error: the store path is empty\n"


def test_usage_errors_exit_2_in_a_real_process() -> None:
    done = subprocess.run([sys.executable, "-m", "dilstore", "info"], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)  # fmt: skip
    assert done.returncode == 2 and "usage:" in done.stderr and "Traceback" not in done.stderr


MISTYPED = [
    (["ask", "{tmp}/missing", "Who?"], "dilstore ask: error: no store at {tmp}/missing", []),
    (["precompute", "--input", "{tmp}/missing.jsonl", "--output", "{tmp}/store"],
     "dilstore precompute: error: input file not found: {tmp}/missing.jsonl", []),
    (["precompute", "--input", "{tmp}/a.jsonl", "--output", "{tmp}/store", "--bogus_option", "1"],
     "dilstore precompute: error: unknown Beam option(s): --bogus_option", ["apache_beam"]),
    (["serve", "{tmp}/missing", "--port", "0"], "dilstore serve: error: no store at {tmp}/missing", []),
    (["evaluate-qa", "{tmp}/missing", "--questions", "{tmp}/q.jsonl"],
     "dilstore evaluate-qa: error: no store at {tmp}/missing", []),
    (["evaluate-qa", "{tmp}/missing", "--questions", "{tmp}/a.jsonl"],
     "dilstore evaluate-qa: error: {tmp}/a.jsonl:1: the line has no 'question' key", []),
    (["rerank", "{tmp}/missing", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
     "dilstore rerank: error: no store at {tmp}/missing", []),
    (["rerank", "{tmp}/missing", "--topics", "{tmp}/a.jsonl", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
     "dilstore rerank: error: {tmp}/a.jsonl:1: expected 2 tab-separated columns (qid, query), found 1", []),
    (["precompute", "--input", "{tmp}/a.jsonl", "--output", "{tmp}/store", "--append"],
     "dilstore precompute: error: no store at {tmp}/store", []),
    (["precompute", "--input", "{tmp}/a.jsonl", "--output", "{tmp}/store", "--encoding", "2bit", "--codebook",
      "{tmp}/missing"],
     "dilstore precompute: error: cannot open codebook {tmp}/missing: FileNotFoundError: {tmp}/missing does not exist",
     []),
    (["evaluate-rc", "--data", "{tmp}/missing.json"],
     "dilstore evaluate-rc: error: --data {tmp}/missing.json: no such file", []),
    (["evaluate-rc", "--data", "{tmp}/q.jsonl", "--model", "{tmp}/missing"],
     "dilstore evaluate-rc: error: model directory not found: {tmp}/missing", []),
    (["train", "qa", "--layers", "0", "--train", "{tmp}/missing.json", "--output", "{tmp}/run"],
     "dilstore train: error: --train {tmp}/missing.json: no such file", []),
    (["train", "earl", "--triples", "{tmp}/missing.jsonl", "--output", "{tmp}/run"],
     "dilstore train: error: --triples {tmp}/missing.jsonl: no such file", []),
    (["precompute", "--input", "{tmp}/a.jsonl", "--output", "{tmp}/store", "--model", "{tmp}/missing"],
     "dilstore precompute: error: model directory not found: {tmp}/missing", []),
    (["evaluate-rc", "--data", "{tmp}/q.jsonl", "--score", "{tmp}/missing.json"],
     "dilstore evaluate-rc: error: {tmp}/q.jsonl: the document has no 'data' key", []),
    (["ask", "{tmp}/built", "Who?", "--index", "{tmp}/missing"],
     "dilstore ask: error: no Lucene index at {tmp}/missing: give the folder of one `dilstore index` built "
     "(STORE/bm25, or a copy of it)", []),
    (["evaluate-qa", "{tmp}/built", "--questions", "{tmp}/q.jsonl", "--model", "{tmp}/missing"],
     "dilstore evaluate-qa: error: model directory not found: {tmp}/missing", []),
    (["rerank", "{tmp}/built", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output", "{tmp}/o.trec"],
     "dilstore rerank: error: store {tmp}/built holds 'dilbert' states; reranking needs an 'earl-s1' or 'earl-s2' "
     "store (`dilstore precompute --kind earl-s1|earl-s2`) or a 'listformer' one (`--kind listformer`)", []),
]  # fmt: skip
MISTYPED_IDS = ["ask", "precompute-input", "precompute-beam-option", "serve", "evaluate-qa-store",
                "evaluate-qa-questions", "rerank-store", "rerank-topics", "precompute-append",
                "precompute-codebook", "evaluate-rc-data", "evaluate-rc-model", "train-qa", "train-earl",
                "precompute-model", "evaluate-rc-score", "ask-index", "evaluate-qa-model", "rerank-kind"]  # fmt: skip
# Runs the commands of argv[2] (JSON: [folder, words]) in turn, in one fresh process, each with its stdout and
# stderr in files of its folder; writes each one's status and which of torch, transformers and Beam were loaded
# once it had run to the file argv[1].
_MISTYPED_CHILD = """
import json, os, sys, traceback
from dilstore.runners.cli import main
results = []
for folder, words in json.loads(sys.argv[2]):
    for number, name in ((1, "out"), (2, "err")):
        getattr(sys, "std" + name).flush()
        written = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(written, number)
        os.close(written)
    try:
        status = main(words)
    except BaseException:
        traceback.print_exc()
        status = None
    sys.stdout.flush()
    sys.stderr.flush()
    results.append([status, [name for name in ("torch", "transformers", "apache_beam") if name in sys.modules]])
with open(sys.argv[1], "w", encoding="utf-8") as file:
    json.dump(results, file)
"""


@pytest.fixture(scope="module")
def mistyped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int, list[str], str, str]]:
    """Each MISTYPED command run in one fresh process, in its own folder: by id, (folder, exit status, the heavy
    packages loaded once it had run, stdout, stderr). Those that need no Beam run first: sys.modules only grows,
    so each of them found torch, transformers and Beam unloaded before it ran, as a process of its own would, and a
    command that imported one is seen by its own check (and, a false alarm, by those after it)."""
    root = tmp_path_factory.mktemp("mistyped")
    runs = []
    cases = sorted(zip(MISTYPED_IDS, MISTYPED, strict=True), key=lambda case: bool(case[1][2]))  # Beam's last
    for name, (arguments, _, _) in cases:
        folder = root / name
        folder.mkdir()
        if any("{tmp}/built" in word for word in arguments):
            from tests.fixtures.store_fixtures import build_store, random_shards

            (build_store(folder / "built", random_shards([2])) / "bm25").mkdir()
            (folder / "built" / "bm25" / "segments_1").touch()
        (folder / "a.jsonl").write_text('{"id": "a", "text": "a corpus file"}\n')
        (folder / "q.jsonl").write_text('{"question": "Who?", "answer": ["a"]}\n')
        (folder / "t.tsv").write_text("1\tfirst query\n")
        (folder / "r.trec").write_text("1 Q0 d1 1 2.0 bm25\n")
        runs.append((name, folder, [word.format(tmp=folder) for word in arguments]))
    results = root / "results.json"
    done = subprocess.run([sys.executable, "-c", _MISTYPED_CHILD, str(results),
                           json.dumps([[str(folder), words] for _, folder, words in runs])],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = json.loads(results.read_text(encoding="utf-8"))
    return {name: (folder, status, loaded, (folder / "out").read_text(), (folder / "err").read_text())
            for (name, folder, _), (status, loaded) in zip(runs, statuses, strict=True)}  # fmt: skip


@pytest.mark.parametrize(("message", "loaded"), [(message, loaded) for _, message, loaded in MISTYPED],
                         ids=MISTYPED_IDS)  # fmt: skip
def test_a_mistyped_argument_is_named_before_torch_loads(mistyped, request: pytest.FixtureRequest, message: str,
                                                         loaded: list[str]) -> None:  # fmt: skip
    """(ci59 F1) `ask` on a mistyped store path set torch's threads and imported the reader (torch, transformers)
    before its store was opened: "no store at" came after some 6 s. (ci59 F2) `precompute` imported Beam, torch and
    transformers before it looked for its --input: "input file not found" came after some 8 s. (ci59 F3) A Beam
    option Beam refuses needs Beam alone, and was named after torch and transformers had loaded too (9 s, not 2.5).
    (ci59 F6) `serve` set torch's threads, importing it, before it checked its stores (2-5 s). (fast59 F1)
    `evaluate-qa` read its questions with a function of the module that imports the serving stack, and imported it
    before the store was checked: a question file without questions, or a mistyped store, was named after 5-6 s.
    (fast59 F2) `rerank` set torch's threads first and checked its topics with a function of the module that imports
    the rankers: a topics file of the wrong format, or a mistyped store, was named after 6-8 s. (fast59 F3)
    `precompute --append` to a mistyped store, or a mistyped --codebook, was named after Beam, torch and
    transformers had loaded, and the codebook after the model too: 10-25 s. (fast59 F4) `evaluate-rc` set torch's
    threads and imported the reader before it looked for its --data, --predictions folder and --model (10-12 s).
    (fast59 F5) `train qa` and the ranker trainings did so before they looked for their input files (6-12 s).
    (fast59 F6) `precompute` looked for its --model folder when it loaded the model, after Beam and torch (10 s).
    (fast59 F7) `evaluate-rc --score`, which runs no reader, imported it to read its files (9-10 s). (left60 F1)
    `ask` and `evaluate-qa` looked for their --index and --model folders, and `rerank` at its store's kind, inside
    the functions that open the reader, after torch and transformers: 5-9 s. `{tmp}/built` is a dilbert store with
    a bm25/ folder Lucene's file check takes. The commands run one after another in one fresh process (the
    `mistyped` fixture): one interpreter's start, not 19."""
    folder, status, found, out, err = mistyped[request.node.callspec.id]
    assert (status, found, out) == (2, loaded, ""), err
    assert err == message.format(tmp=folder) + "\n"
    assert not (folder / "store").exists()


def test_the_precompute_choices_are_those_of_the_modules_that_define_them() -> None:
    """The parser's copies keep `dilstore --help` light; a kind, encoding, split or format added at its source and
    not here would be refused as an invalid choice."""
    from dilstore.pipelines.corpora import FORMATS
    from dilstore.pipelines.passages import STRATEGIES
    from dilstore.reader.offline.kinds import OFFLINE_KINDS
    from dilstore.runners import cmd_precompute
    from dilstore.storage.encodings import ENCODINGS
    from dilstore.storage.format import KINDS

    assert set(cmd_precompute.KINDS) == set(OFFLINE_KINDS) == set(KINDS)
    assert set(cmd_precompute.ENCODINGS) == set(ENCODINGS)
    assert set(cmd_precompute.SPLITS) == set(STRATEGIES)
    assert set(cmd_precompute.FORMATS) == set(FORMATS)


def test_the_commands_default_lengths_and_help_texts_are_those_of_the_library() -> None:
    """The runners spell lengths and defaults out, so that `--help` stays light; a library default changed at its
    source would be neither used nor shown by the command line, so each copy must equal its source."""
    from dilstore.reader.evaluation.reading_comprehension import ReadingSettings
    from dilstore.reader.modeling.ranking_inputs import DEFAULT_MAX_DOC_LENGTH, DEFAULT_MAX_QUERY_LENGTH
    from dilstore.reader.serving.odqa import OdqaSettings
    from dilstore.reader.training.ranking import DEFAULT_MARGIN, DEFAULT_TEMPERATURE
    from dilstore.runners.cli import build_parser, chosen_parser
    from dilstore.runners.reading_options import reading_settings
    from dilstore.runners.serve_requests import AskRequest

    parser = build_parser()
    assert reading_settings(parser.parse_args(["evaluate-rc", "--data", "d"])) == ReadingSettings()
    ranking = parser.parse_args(["train", "earl", "--triples", "t"])
    assert (ranking.max_query_length, ranking.max_doc_length) == (DEFAULT_MAX_QUERY_LENGTH, DEFAULT_MAX_DOC_LENGTH)
    for command, option, default in (
        ("earl", "margin", DEFAULT_MARGIN),
        ("listformer", "temperature", DEFAULT_TEMPERATURE),
    ):
        kind = chosen_parser(parser, parser.parse_args(["train", command, "--triples", "t"]))
        help_text = next(action.help for action in kind._actions if action.dest == option)
        assert f"(default {default})" in help_text, (command, help_text)
    ask = next(action.choices["ask"] for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    shown = {action.dest: re.search(r"\(default (\S+?)[;)]", action.help or "") for action in ask._actions}
    for name, value in vars(OdqaSettings()).items():
        assert shown[name] is not None and shown[name].group(1) == str(value), (name, value)
    requests = AskRequest.model_fields
    assert f"(default {OdqaSettings().top_p})" in requests["top_p"].description
    assert f"(default {OdqaSettings().mu})" in requests["mu"].description


@pytest.mark.parametrize(
    ("command", "option"),
    [(["earl", "--loss", "softmax", "--margin", "1.0"], "--margin is the hinge loss's; with --loss softmax"),
     (["listformer", "--loss", "listnet", "--temperature", "1.0"],
      "--temperature is the approx-ndcg loss's; with --loss listnet")],
)
def test_a_loss_setting_given_with_another_loss_is_refused_even_at_its_default(
    command: list[str], option: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The library compares with the default, so `--margin 1.0` with the softmax loss was ignored without a word."""
    for name in ("triples.jsonl", "paragraphs.jsonl.gz"):
        (tmp_path / name).write_text("")
    argv = ["train", *command, "--triples", str(tmp_path / "triples.jsonl"), "--output", str(tmp_path / "run")]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"dilstore train: error: {option} it would be ignored\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("argv", "prefix", "unknown"),
    [
        (["ask", "store", "--bogus"], "dilstore ask", "--bogus"),
        (["train", "listformer", "--triples", "t", "--margin", "2"], "dilstore train listformer", "--margin 2"),
        (["--bogus"], "dilstore", "--bogus"),
        # Before the command: the command was blamed, and precompute handed it to Beam as a pipeline option.
        (["--bogus", "ask", "s"], "dilstore", "--bogus (a command's options go after it)"),
        (["--bogus", "precompute"], "dilstore", "--bogus (a command's options go after it)"),
    ],
)
def test_an_unknown_option_is_named_by_the_command_it_was_given_to(
    argv: list[str], prefix: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was the top-level parser's error ("dilstore: error:") with its usage, whichever command was run."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.splitlines()[0].startswith(f"usage: {prefix} ")
    assert err.splitlines()[-1] == f"{prefix}: error: unrecognized arguments: {unknown}"


_INTERRUPTED_INSIDE_A_LIBRARY = """
import sys
import dilstore.runners.cmd_store as cmd_store
from dilstore.runners.cli import main
from dilstore.storage.errors import StoppedBySignal

class HalfBuilt:
    '''As asyncio's event loop when a Ctrl-C lands in its constructor: its finalizer fails.'''
    def __del__(self):
        raise AttributeError("'HalfBuilt' object has no attribute '_ssock'")

async def open_group():
    return None

def interrupted(args):
    half_built = HalfBuilt()
    pending = open_group()  # made, never run: the interrupt came first
    if sys.argv[1] == "stopped":
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise StoppedBySignal("interrupted; run the same command again to go on", 2) from None
    raise KeyboardInterrupt

cmd_store.run_info = interrupted
sys.exit(main(["info", "/stores/any"]))
"""


@pytest.mark.parametrize(
    ("how", "line"),
    [("stopped", "dilstore info: interrupted; run the same command again to go on\n"),
     ("plain", "dilstore info: interrupted\n")],
)
def test_a_ctrl_c_inside_a_library_call_prints_only_its_one_line(how: str, line: str) -> None:
    """A Ctrl-C that landed in zarr's event-loop constructor printed, after the line, an 'Exception ignored in
    BaseEventLoop.__del__' traceback and "coroutine 'open_group' was never awaited" (a flaky precompute test)."""
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_INSIDE_A_LIBRARY, how],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 130, result.stderr
    assert result.stderr == line


@pytest.mark.parametrize("argv", [["ask", "st", "--json", "Who?"], ["ask", "--json", "st", "Who?"],
                                  ["ask", "st", "Who?", "--json"]])  # fmt: skip
def test_an_option_between_the_store_and_the_question_is_taken(argv: list[str]) -> None:
    """`ask STORE --json QUESTION` was "unrecognized arguments: QUESTION": argparse fills every positional from their
    first run (quant44 L2)."""
    from dilstore.runners.cli import build_parser, parse

    args = parse(build_parser(), argv)
    assert (args.store, args.question, args.json) == ("st", "Who?", True)


def test_words_no_positional_takes_are_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from dilstore.runners.cli import build_parser, parse

    for argv in (["ask", "st", "--json", "one", "two"], ["verify", "st", "--json", "extra"]):
        with pytest.raises(SystemExit) as stopped:
            parse(build_parser(), argv)
        assert stopped.value.code == 2
        assert f"dilstore {argv[0]}: error: unrecognized arguments: {argv[-1]}" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["evaluate-rc", "--data", "{tmp}/d.json", "--model", "{tmp}/no-model",
                                      "--predictions", "{out}"],
                                     ["evaluate-qa", "{tmp}/no-store", "--questions", "{tmp}/q.jsonl",
                                      "--predictions", "{out}"],
                                     ["rerank", "{tmp}/no-store", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec",
                                      "--output", "{out}"]])  # fmt: skip
def test_an_output_another_run_writes_is_refused_before_the_model_loads(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second run on the same output was turned away only when its journal took the lock, after its model (and
    the JVM) had loaded: seconds to minutes (qa48 L6). Here the store and model do not even exist."""
    for name, text in (("d.json", '{"data": []}'), ("q.jsonl", '{"question": "Q?", "answer": ["a"]}\n'),
                       ("t.tsv", "q\tquery\n"), ("r.trec", "q Q0 d 1 1.0 t\n")):  # fmt: skip
        (tmp_path / name).write_text(text, encoding="utf-8")
    out = tmp_path / "out.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from dilstore.storage.write_lock import write_lock\n"
         "with write_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)", str(out)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        arguments = [part.replace("{out}", str(out)) for part in filled(command, tmp=tmp_path)]
        assert main(arguments) == 2
        assert f"{out} is being written by pid {holder.pid} (lock " in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(
    ("size", "shown"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
     (1024**2, "1.0 MiB"), (1024**3, "1.0 GiB"), (5 * 1024**4, "5120.0 GiB"),
     (1024**2 - 1, "1.0 MiB"), (1024**2 - 51, "1.0 MiB"), (1024**2 - 52, "1023.9 KiB"), (1024**3 - 1, "1.0 GiB")],
)  # fmt: skip
def test_info_and_verify_show_a_size_in_the_largest_unit_it_fills(size: int, shown: str) -> None:
    """1024 bytes are 1.0 KiB, as 1024 KiB are 1.0 MiB; below 1024 of a unit, the unit below, unless the shown
    figure rounds up to 1024 of it (1,048,575 bytes read "1024.0 KiB")."""
    from dilstore.runners.cmd_store import _size

    assert _size(size) == shown


def test_an_eval_limit_without_dev_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--eval-limit picks the dev questions evaluated after training: without --dev it picks nothing, and the hours of
    training would end with no evaluation at all."""
    import dilstore.reader.training.qa as qa

    def trains(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run trained")

    monkeypatch.setattr(qa, "train_qa", trains)
    (tmp_path / "train.json").write_text("{}")
    argv = ["train", "qa", "--layers", "1", "--train", str(tmp_path / "train.json"), "--output", str(tmp_path / "o"),
            "--eval-limit", "5"]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err == ("dilstore train: error: --eval-limit picks the dev questions evaluated after "
                                       "training; give --dev too\n")  # fmt: skip


@pytest.mark.parametrize("trainer", [["qa", "--layers", "1", "--train", "t.json"], ["earl", "--triples", "t.jsonl"],
                                     ["listformer", "--triples", "t.jsonl"]])  # fmt: skip
@pytest.mark.parametrize(("flags", "progress"), [([], True), (["--json"], False), (["--no-progress"], False)])
def test_a_training_run_with_json_draws_no_progress_bars(trainer: list[str], flags: list[str], progress: bool) -> None:
    """(tail61 F3) `train ... --json` drew its progress bars on stderr, where every other command's --json turns
    them off: the trainers (and `train qa --dev`'s evaluation, by the same shows_progress) now take --json as
    --no-progress."""
    from dilstore.runners.cli import build_parser, parse
    from dilstore.runners.training_options import run_options

    args = parse(build_parser(), ["train", *trainer, *flags])
    assert run_options(args)["progress"] is progress


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--replace"], "--replace only applies to --append"),
     (["--replace", "--overwrite"], "--replace only applies to --append"),
     (["--append", "--overwrite"], "--append adds to a store and --overwrite replaces it; give one of them")],
)  # fmt: skip
def test_precompute_refuses_append_flags_that_do_not_go_together_before_anything_is_written(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--replace` without `--append` was a build that ignored it: the retired passages the user meant to replace
    stayed where they were."""
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text('{"id": "a", "text": "text"}\n')
    assert main(["precompute", "--input", str(corpus), "--output", str(tmp_path / "store"), *flags]) == 2
    assert capsys.readouterr().err == f"dilstore precompute: error: {message}\n"
    assert not (tmp_path / "store").exists()


def test_an_index_given_as_a_url_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """evaluate-qa reads its questions first; then --index as a URL is one line saying why (multi53 F5)."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "Who?", "answer": ["me"]}\n', encoding="utf-8")
    status = main(["evaluate-qa", str(tmp_path / "no-store"), "--questions", str(questions),
                   "--index", "s3://bucket/bm25"])  # fmt: skip
    assert status == 2
    assert capsys.readouterr().err.strip() == ("dilstore evaluate-qa: error: --index s3://bucket/bm25 is a URL, and "
                                               "Lucene reads only local files: give a local copy of the store's bm25/ "
                                               "folder")  # fmt: skip


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux), whose writes fail with ENOSPC")
@pytest.mark.parametrize("stdout_full", [False, True])
def test_only_an_error_that_names_no_file_is_put_on_a_standard_output_that_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stdout_full: bool
) -> None:
    """An OSError that names its file is that file's, whether or not stdout fails as well (mut56b M23); one that names
    no file is put on stdout only when a flush of stdout fails again, not when stdout takes it (mut56b M25)."""
    import contextlib
    import errno

    from dilstore.runners import cli

    if stdout_full:
        full = open("/dev/full", "w")  # noqa: SIM115 -- closed in the finally below
        monkeypatch.setattr(sys, "stdout", full)

    def command(named: bool) -> argparse.Namespace:
        def run(_: argparse.Namespace) -> int:
            print("a line of the output", file=sys.stdout)
            if named:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), "/gone/manifest.json")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        return argparse.Namespace(command="info", run=run, verbose=False)

    try:
        assert cli._run(command(named=True), exits=True) == 2
        assert capsys.readouterr().err == "dilstore info: error: No such file or directory: /gone/manifest.json\n"
        if not stdout_full:
            assert cli._run(command(named=False), exits=True) == 2
            assert capsys.readouterr().err == "dilstore info: error: No space left on device\n"
    finally:
        if stdout_full:
            monkeypatch.undo()
            with contextlib.suppress(OSError):  # the line printed is still in its buffer
                full.close()


@pytest.mark.parametrize(("environment", "threads"), [({}, 1), ({"OMP_NUM_THREADS": "3"}, 3),
                                                      ({"MKL_NUM_THREADS": "3"}, 3)])
def test_torch_threads_are_held_to_a_cgroup_quota(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], threads: int
) -> None:
    """Torch's thread count follows the affinity but not a cgroup CPU quota: under `docker run --cpus 1` on a 64-core
    host, ask, serve, evaluate-*, rerank and train ran 32 threads throttled by the quota (env57 F2). A thread count
    the environment asks for stays torch's."""
    import torch

    from dilstore.runners.reading_options import apply_threads
    from dilstore.storage import cpus

    before = torch.get_num_threads()
    monkeypatch.setattr(cpus, "usable_cpu_count", lambda: 1)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    try:
        torch.set_num_threads(3)  # torch's choice on a bigger machine, or from OMP_NUM_THREADS
        apply_threads(None)
        assert torch.get_num_threads() == threads
        apply_threads(2)  # (mut60 M9) --threads is taken as asked past the quota too: no test asked under one
        assert torch.get_num_threads() == 2
        torch.set_num_threads(threads)
        monkeypatch.setattr(cpus, "usable_cpu_count", lambda: 8)
        apply_threads(None)  # held down to the CPUs, never raised to them (mut57c)
        assert torch.get_num_threads() == threads
        apply_threads(2)  # --threads 2 is taken as asked
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("setter", ["dilstore.runners.reading_options:apply_threads",
                                    "dilstore.reader.offline.encoding:set_threads"])
def test_torch_s_threads_are_started_when_their_count_is_set(setter: str) -> None:
    """(left60 F7) libgomp started torch's threads at the first parallel operation, inside the model's load: under
    `ulimit -v 2480000` `precompute` (and `evaluate-qa` at 1500000) left it no room for a thread's stack, and libgomp
    ended the process with exit 1 ("Thread creation failed") after a line blaming the checkpoint. The commands' and
    precompute workers' thread setters start them at once. Run on a thread of its own: libgomp keeps one set of
    threads per thread that runs parallel operations, and this test process's main thread may have its own."""
    import importlib
    import threading

    import torch

    module, name = setter.split(":")
    set_threads = getattr(importlib.import_module(module), name)
    before = torch.get_num_threads()
    started: list[int] = []

    def count_started() -> None:
        torch.set_num_threads(1)  # what setting a count starts by itself (torch's other pool) is no part of the count
        running = set(os.listdir("/proc/self/task"))  # by id: a thread that ended just before may still be listed
        set_threads(3)  # (mut60 M9) more than before: the pool is started at the new count, not the old one
        started.append(len(set(os.listdir("/proc/self/task")) - running))

    try:
        worker = threading.Thread(target=count_started)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(before)
    assert started and started[0] >= 2, started


@pytest.mark.parametrize("where", ["home is a file", "runs is a file", "no home", "runs of no user"])
def test_a_default_run_folder_that_cannot_be_made_names_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Without --output, under a HOME it cannot write (a container's read-only or missing HOME), `train` said only
    that ~/.cache/dilstore/runs must be writable, a folder never named; with DILSTORE_RUNS a file, it blamed an
    --output not given; with no home folder at all (HOME unset, a uid without a user entry) or DILSTORE_RUNS=~nobody2/x,
    a RuntimeError traceback (env57 F3)."""
    import pwd

    afile = tmp_path / "afile"
    afile.write_text("", encoding="utf-8")
    monkeypatch.delenv("DILSTORE_RUNS", raising=False)
    if where == "home is a file":
        monkeypatch.setenv("HOME", str(afile))  # as a read-only HOME, for root too
        why = f"run folder {afile}/.cache/dilstore/runs/qa-k1: {afile} is a file, not a folder"
    elif where == "runs is a file":
        monkeypatch.setenv("DILSTORE_RUNS", str(afile))
        why = f"run folder {afile}/qa-k1: {afile} is a file, not a folder"
    elif where == "no home":
        monkeypatch.delenv("HOME")
        monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
        why = "there is no home folder for the default run folder"
    else:
        monkeypatch.setenv("DILSTORE_RUNS", "~dilstore-no-such-user/x")
        why = "DILSTORE_RUNS=~dilstore-no-such-user/x: ~dilstore-no-such-user is no user's home folder"
    assert main(["train", "qa", "--layers", "1", "--train", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dilstore train: error: ") and why in err and err.count("\n") == 1, err
    assert "give --output DIR, or set DILSTORE_RUNS to a" in err and "--output /" not in err
    source = {"home is a file": "in ~/.cache/dilstore/runs ($DILSTORE_RUNS is unset)",
              "runs is a file": "in $DILSTORE_RUNS"}.get(where, "")  # (mut57c) where the folder came from
    assert source in err, err
    assert main(["train", "qa", "--layers", "1", "--train", str(afile), "--output", str(afile)]) == 2
    err = capsys.readouterr().err  # a given --output is named as given, no default folder blamed (mut57c)
    assert f"--output {afile}" in err and "default run folder" not in err, err


def test_only_the_default_run_folder_s_own_errors_name_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(mut57c) Its lock that cannot be taken is the default folder's error, told with where the folder comes from;
    an error of the run itself, once the lock is held, is the run's, told as it is."""
    from dilstore.runners import training_options
    from dilstore.storage.errors import DilstoreError

    monkeypatch.setenv("DILSTORE_RUNS", str(tmp_path / "runs"))
    args = argparse.Namespace(output=None, run_name="qa")

    def failing(args: argparse.Namespace) -> int:
        raise DilstoreError("the run's own error")

    with pytest.raises(DilstoreError, match="^the run's own error$"):
        training_options.holding_the_output(failing)(args)

    def refused(folder: Path) -> None:
        raise DilstoreError(f"{folder} is being written by process 7")

    monkeypatch.setattr(training_options, "write_lock", refused)
    with pytest.raises(DilstoreError, match=r"is being written by process 7 \(the default run folder, in "
                                            r"\$DILSTORE_RUNS: give --output DIR"):  # fmt: skip
        training_options.holding_the_output(failing)(args)

    def denied(folder: Path) -> None:
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(training_options, "write_lock", denied)
    with pytest.raises(DilstoreError, match=f"^Permission denied: {re.escape(str(tmp_path / 'runs' / 'qa'))} "
                                            r"\(the default run folder"):  # fmt: skip
        training_options.holding_the_output(failing)(args)


def test_a_hard_link_of_an_input_given_before_is_the_same_input(tmp_path: Path) -> None:
    """(left58b F3) `precompute` found an --input given twice by its resolved path only: a hard link of a file given
    before (or `A.jsonl` and `a.jsonl` on a case-insensitive disk) was read twice, every document of it once more.
    It is refused as the same file, as `docs.jsonl` and `./docs.jsonl` are."""
    from dilstore.runners.cmd_precompute import resolve_inputs
    from dilstore.storage.errors import DilstoreError

    (tmp_path / "c.jsonl").write_text('{"id": "d", "title": "t", "text": "words"}\n')
    os.link(tmp_path / "c.jsonl", tmp_path / "linked.jsonl")
    first, linked = str(tmp_path / "c.jsonl"), str(tmp_path / "linked.jsonl")
    with pytest.raises(DilstoreError, match=f"^--input {linked} is given twice \\(as {first} before it: the same "):
        resolve_inputs([first, linked], None)
    assert len(resolve_inputs([first], None)) == 1


@pytest.mark.parametrize("address_space", [None, 3000 << 20])
def test_a_command_out_of_memory_is_one_line_naming_the_limit_and_its_batch_options(
    address_space: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under `ulimit -v 3000000` `evaluate-qa` ended in a 60-line traceback of torch's "[enforce fail at
    alloc_cpu.cpp:127] ... DefaultCPUAllocator: can't allocate memory", exit 1 (limits59 F9)."""

    from dilstore.runners import cmd_evaluate_qa, cmd_store

    address_space_limit(monkeypatch, address_space)

    def torch_refuses(args: argparse.Namespace) -> int:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 47185920 bytes. Error code 12 (Cannot allocate memory)")

    def python_refuses(args: argparse.Namespace) -> int:
        raise MemoryError

    monkeypatch.setattr(cmd_evaluate_qa, "run", torch_refuses)
    monkeypatch.setattr(cmd_store, "run_info", python_refuses)
    under = "" if address_space is None else " under its address-space limit (ulimit -v) of 3,000 MiB"
    assert main(["evaluate-qa", str(tmp_path / "store"), "--questions", str(tmp_path / "q.jsonl")]) == 2
    assert capsys.readouterr().err == (f"dilstore evaluate-qa: error: ran out of memory{under}: lower "
                                       "--max-pairs-per-batch, --pair-batch-tokens or --question-batch (what it reads "
                                       "at once), or give it more memory\n")  # fmt: skip
    assert main(["info", str(tmp_path / "store")]) == 2
    assert capsys.readouterr().err == f"dilstore info: error: ran out of memory{under}: give it more memory\n"


def test_a_model_that_cannot_be_loaded_for_memory_is_the_out_of_memory_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under `ulimit -v 2500000` `precompute` said "cannot load a model from .../dilbert-minilm-squad: [enforce fail at
    alloc_cpu.cpp:127] ... can't allocate memory", naming neither the limit nor the options to lower: the model
    loaders wrap torch's allocation error as a checkpoint they cannot load (journey59 F2). (left60 F3) The line then
    told `ask` and `precompute` to lower their batch options, which do not shrink a model's load. (left60 F8) A
    weights file torch could not map for want of room was its own line, naming no limit."""

    from dilstore.runners import cmd_ask
    from dilstore.storage.errors import DilstoreError

    address_space_limit(monkeypatch, 2500 << 20)

    def loader_refuses(args: argparse.Namespace) -> int:
        allocation = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 589824 bytes.")
        raise DilstoreError(f"cannot load a model from m: {allocation}") from allocation

    def checkpoint_broken(args: argparse.Namespace) -> int:
        raise DilstoreError("cannot load a model from m: bad header") from RuntimeError("bad header")

    def map_refused(args: argparse.Namespace) -> int:  # (left60 F8) torch's map of the weights file, refused
        refused = RuntimeError("unable to mmap 45144116 bytes from file <m/model.safetensors>: Cannot allocate "
                               "memory (12)")  # fmt: skip
        raise DilstoreError(f"cannot load a model from m: {refused}") from refused

    for refuses in (loader_refuses, map_refused):
        monkeypatch.setattr(cmd_ask, "run", refuses)
        assert main(["ask", "store", "Who?"]) == 2
        assert capsys.readouterr().err == ("dilstore ask: error: ran out of memory under its address-space limit "
                                           "(ulimit -v) of 2,500 MiB while loading a model: give it more "
                                           "memory\n")  # fmt: skip
    monkeypatch.setattr(cmd_ask, "run", checkpoint_broken)
    assert main(["ask", "store", "Who?"]) == 2
    assert capsys.readouterr().err == "dilstore ask: error: cannot load a model from m: bad header\n"


@pytest.mark.parametrize("command", [["ask", "{store}", "Who?"], ["serve", "{store}", "--port", "0"]])
def test_an_address_space_limit_too_low_for_the_jvm_is_named_before_torch_loads(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left60 F4) Under `ulimit -v 1500000` `evaluate-qa` loaded torch and its model, and libgomp, short of room for
    a thread's stack, ended the process itself (exit 1, "Thread creation failed"), before the JVM's refusal of the
    limit could come. The JVM's room is checked before torch (`apply_threads`) now: the model only takes from it."""
    from dilstore.reader import retrieval
    from dilstore.runners import cmd_serve, odqa_options
    from tests.fixtures.store_fixtures import build_store, random_shards

    store = build_store(tmp_path / "store", random_shards([2]))
    (store / "bm25").mkdir()
    (store / "bm25" / "segments_1").touch()  # a folder Lucene's file check takes
    address_space_limit(monkeypatch, 1464 << 20)
    monkeypatch.setattr(retrieval, "mapped_bytes", lambda: 110 << 20)

    def torch_loads(threads: int | None) -> None:
        raise AssertionError("torch was set up before the JVM's room was checked")

    for module in (odqa_options, cmd_serve):
        monkeypatch.setattr(module, "apply_threads", torch_loads)
    assert main(filled(command, store=store)) == 2
    assert capsys.readouterr().err == (f"dilstore {command[0]}: error: Lucene's JVM (BM25 search) cannot start: this "
                                       "process's address-space limit (ulimit -v) is 1,464 MiB, of which 1,354 MiB are "
                                       "left, and the JVM needs about 1,500 MiB; raise the limit (ulimit -v, or the "
                                       "batch job's virtual-memory request)\n")  # fmt: skip


def test_serve_without_an_index_to_search_starts_under_a_limit_too_low_for_the_jvm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(mut60 M8) `serve` checks the JVM's room only where a store it serves has an index to search: a server of
    EARL stores alone starts no JVM, and was not refused under a limit that leaves it none. No test served a store
    without an index so: the check could run for every server. A stand-in for torch's setup ends the command just
    after the check would have refused it."""
    from dilstore.reader import retrieval
    from dilstore.runners import cmd_serve
    from dilstore.storage.errors import DilstoreError
    from tests.fixtures.store_fixtures import build_store, random_shards

    store = build_store(tmp_path / "earl", random_shards([2]), kind="earl-s1")
    address_space_limit(monkeypatch, 1464 << 20)
    monkeypatch.setattr(retrieval, "mapped_bytes", lambda: 110 << 20)

    def torch_loads(threads: int | None) -> None:
        raise DilstoreError("past the JVM's check")

    monkeypatch.setattr(cmd_serve, "apply_threads", torch_loads)
    assert main(["serve", str(store), "--port", "0"]) == 2
    assert capsys.readouterr().err == "dilstore serve: error: past the JVM's check\n"


def test_a_library_that_cannot_be_mapped_is_the_out_of_memory_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under `ulimit -v 1800000` `precompute` ended in a traceback of "ImportError: libtorch_cpu.so: failed to map
    segment from shared object", exit 1: the dynamic loader had no address space for torch (journey59 F3)."""

    from dilstore.runners import cmd_store

    address_space_limit(monkeypatch, 1800 << 20)

    def not_mapped(args: argparse.Namespace) -> int:
        raise ImportError("libtorch_cpu.so: failed to map segment from shared object")

    def not_installed(args: argparse.Namespace) -> int:
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(cmd_store, "run_info", not_mapped)
    assert main(["info", "store"]) == 2
    assert capsys.readouterr().err == ("dilstore info: error: ran out of memory under its address-space limit "
                                       "(ulimit -v) of 1,800 MiB while loading the library libtorch_cpu.so: give it "
                                       "more memory\n")  # fmt: skip
    monkeypatch.setattr(cmd_store, "run_info", not_installed)
    with pytest.raises(ImportError, match="No module named"):
        main(["info", "store"])


def test_a_precompute_run_out_of_memory_keeps_its_own_line_with_workers_and_the_rerun(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pipeline whose worker ran out of memory fails with a DilstoreError that already says so (limits59 F8: lower
    --batch-tokens or --workers, then run the same command again to go on) and is caused by torch's allocation
    RuntimeError; journey59 F2's line for a model's load took its place, dropping --workers and that the run goes on
    from its finished shards (read59b F2)."""
    from dilstore.runners import cmd_precompute
    from dilstore.runners.precompute_run import memory_advice
    from dilstore.runners.worker_deaths import RERUN
    from dilstore.storage.errors import DilstoreError

    torch_line = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4732416 bytes."
    failure = f"the pipeline failed: {torch_line}: {memory_advice()}, then {RERUN}"

    def pipeline_fails(args: argparse.Namespace) -> int:
        raise DilstoreError(failure) from RuntimeError(torch_line)

    monkeypatch.setattr(cmd_precompute, "run_command", pipeline_fails)
    assert main(["precompute", "--input", "in.jsonl", "--output", "out"]) == 2
    assert capsys.readouterr().err == f"dilstore precompute: error: {failure}\n"


@pytest.mark.parametrize(("module", "arguments"), [
    ("cmd_evaluate_rc", ["evaluate-rc", "--data", "{tmp}/d.json"]),
    ("odqa_options", ["ask", "{tmp}/dilbert", "Who?"]),
    ("odqa_options", ["evaluate-qa", "{tmp}/dilbert", "--questions", "{tmp}/q.jsonl"]),
    ("cmd_rerank", ["rerank", "{tmp}/earl-s1", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output",
                    "{tmp}/o.trec"]),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--output", "{tmp}/run"]),
    ("cmd_train_ranking", ["train", "earl", "--triples", "{tmp}/t.jsonl", "--output", "{tmp}/run"]),
], ids=["evaluate-rc", "ask", "evaluate-qa", "rerank", "train-qa", "train-earl"])  # fmt: skip
def test_a_command_sets_the_threads_it_is_given_once_its_inputs_are_checked(
    module: str, arguments: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(mut59b M14) fast59 F4 moved the threads' setting below the input checks; it could have gone altogether,
    leaving torch's own count on a machine shared on purpose with --threads, and no test noticed. (left60 F5) So
    could ask's, evaluate-qa's, rerank's and the trainings', which fast59 and ci59 moved too."""
    import importlib

    from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE
    from tests.fixtures.store_fixtures import build_store, random_shards

    class Set(Exception):
        """Stops the command where its threads are set, before the reader loads."""

    def apply_threads(threads: int | None) -> None:
        raise Set(threads)

    monkeypatch.setattr(importlib.import_module(f"dilstore.runners.{module}"), "apply_threads", apply_threads)
    for name, text in (("d.json", squad_text([{"text": "Paris", "answer_start": 0}])),
                       ("q.jsonl", '{"question": "Who?", "answer": ["a"]}\n'), ("t.tsv", "1\tq\n"),
                       ("r.trec", "1 Q0 d1 1 2.0 bm25\n"), ("t.jsonl", ""), (PARAGRAPHS_FILE, "")):  # fmt: skip
        (tmp_path / name).write_text(text)
    kind = next((kind for kind in ("dilbert", "earl-s1") if f"{{tmp}}/{kind}" in arguments), None)
    if kind is not None:
        (build_store(tmp_path / kind, random_shards([2]), kind=kind) / "bm25").mkdir()
        (tmp_path / kind / "bm25" / "segments_1").touch()  # a folder Lucene's file check takes
    with pytest.raises(Set, match="^2$"):
        main([*filled(arguments, tmp=tmp_path), "--threads", "2"])


@pytest.mark.parametrize(("module", "arguments", "message"), [
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--model", "{tmp}/missing"],
     "train: error: model directory not found: {tmp}/missing"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--model", "{tmp}/missing", "--resume"],
     None),
    ("cmd_train_ranking", ["train", "earl", "--triples", "{tmp}/t.jsonl", "--base-model", "{tmp}/d.json"],
     "train: error: {tmp}/d.json is a file, not a model folder"),
    ("cmd_train_ranking", ["train", "earl", "--triples", "{tmp}/t.jsonl", "--base-model", "{tmp}/d.json", "--resume"],
     None),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/bad.json"],
     "train: error: {tmp}/bad.json: data[0].paragraphs[0].qas[0] (id 'q').answers[0]: answer_start 9 is out of range "
     "for an answer of 5 characters in a context of 10"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/unanswered.json"],
     "train: error: {tmp}/unanswered.json: question 'q' has no answer to train on (1 such); train qa takes SQuAD "
     "v1.1 questions with answers"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--dev", "{tmp}/unanswered.json"],
     "train: error: {tmp}/unanswered.json: question 'q' has no reference answer to score against (1 such)"),
    ("cmd_evaluate_rc", ["evaluate-rc", "--data", "{tmp}/bad.json"],
     "evaluate-rc: error: {tmp}/bad.json: data[0].paragraphs[0].qas[0] (id 'q').answers[0]: answer_start 9 is out "
     "of range for an answer of 5 characters in a context of 10"),
    ("cmd_evaluate_rc", ["evaluate-rc", "--data", "{tmp}/d.json", "--max-seq-length", "64"],
     "evaluate-rc: error: max-seq-length (64) must exceed max-question-length (64) by at least 2, to leave room for "
     "a passage word piece and its [SEP]"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--max-seq-length", "64"],
     "train: error: max-seq-length (64) must exceed max-question-length (64) by at least 2, to leave room for a "
     "passage word piece and its [SEP]"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--max-seq-length", "96",
                   "--max-question-length", "24"],
     "train: error: doc-stride (128) must be smaller than max-seq-length (96)"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--teacher", "{tmp}/base"],
     "train: error: --teacher {tmp}/base is a base model without dilstore metadata, and its QA head is untrained: "
     "give a reader that `dilstore train qa` wrote"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--freeze-lower", "--store-encoding",
                   "2bit", "--codebook", "{tmp}/cb"],
     "train: error: cannot open codebook {tmp}/cb: no Zarr group is there (no zarr.json of one)"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--freeze-lower", "--store-encoding",
                   "2bit", "--codebook", "{tmp}/cb", "--resume"], None),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--shared-norm", "{tmp}/cb/t.jsonl"],
     "train: error: --shared-norm's paragraph file {tmp}/cb/paragraphs.jsonl.gz: no such file"),
    ("cmd_train", ["train", "qa", "--layers", "-1", "--train", "{tmp}/d.json"],
     "train: error: layers (k) must be at least 0, got -1"),
    ("cmd_train", ["train", "qa", "--layers", "1", "--train", "{tmp}/d.json", "--learning-rate", "-1"],
     "train: error: learning-rate must be positive, got -1.0"),
], ids=["train-qa-model", "train-qa-resume", "train-earl-base-model", "train-earl-resume", "train-qa-malformed",
        "train-qa-unanswered", "train-qa-dev-unanswered", "evaluate-rc-malformed", "evaluate-rc-window",
        "train-qa-window", "train-qa-stride", "train-qa-teacher", "train-qa-codebook",
        "train-qa-codebook-resume", "train-qa-shared-norm", "train-qa-layers", "train-qa-learning-rate"])  # fmt: skip
def test_a_training_s_or_reading_s_inputs_are_refused_before_torch_loads(
    module: str, arguments: list[str], message: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(left61 F1) `train qa --model` and `train earl --base-model` naming no model folder were refused by the
    model's load, after torch and transformers: 5-6 s. A resumed run reads its own checkpoint, not that folder,
    and goes on to the threads' setting (here: `Set`), where torch loads. (left61 F2) A malformed SQuAD file, or
    one with a question without an answer, given to `train qa --train` or `evaluate-rc --data` was named after the
    model had loaded (5-6 s); a --dev question without an answer was named after the whole training. (left61 F7)
    Window options that leave a window no passage word piece, or a training stride not below the window, were
    named at the first window or in the training's settings, once torch (and the model) had loaded: 5-8 s. (left61
    F8) A --teacher that is a base model, or a --codebook that is none, waited for torch and the model too (5.5-9 s);
    a resumed run reads the codebook its first part saved, not --codebook. (left61 F9) A --shared-norm without the
    paragraph file beside it was named after the model's load (6 s). (left61 F10) A training setting out of range
    (`--layers -1`, `--learning-rate -1`) was refused by TrainingConfig, whose module imports torch: 5-7 s."""
    import importlib

    from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE

    class Set(Exception):
        """Stops the command where its threads are set, before torch loads."""

    def apply_threads(threads: int | None) -> None:
        raise Set(threads)

    monkeypatch.setattr(importlib.import_module(f"dilstore.runners.{module}"), "apply_threads", apply_threads)
    for name, answers in (("d.json", [{"text": "Paris", "answer_start": 0}]), ("unanswered.json", []),
                          ("bad.json", [{"text": "Paris", "answer_start": 9}])):  # fmt: skip
        (tmp_path / name).write_text(squad_text(answers))
    for name in ("t.jsonl", PARAGRAPHS_FILE):
        (tmp_path / name).write_text("")
    (tmp_path / "cb").mkdir()
    (tmp_path / "cb" / "t.jsonl").write_text("")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    words = [*filled(arguments, tmp=tmp_path), *(["--output", str(tmp_path / "run")] if module != "cmd_evaluate_rc"
                                                   else [])]  # fmt: skip
    if message is None:
        with pytest.raises(Set):
            main(words)
        return
    assert main(words) == 2
    assert capsys.readouterr().err == f"dilstore {message.format(tmp=tmp_path)}\n"


@pytest.mark.parametrize(("kind", "missing"), [
    ("earl-s1", "EARL ranker checkpoint is missing: {models}/earl-minilm-squad"),
    ("listformer", "Listformer checkpoint is missing: {models}/listformer-minilm-squad"),
], ids=["earl", "listformer"])  # fmt: skip
def test_rerank_names_a_missing_packaged_ranker_before_torch_loads(
    kind: str, missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """(left61 F3) `rerank` without --model looked for the packaged ranker of its store's kind only when it loaded
    it, after torch and the rankers' imports: its absence (an install without the weights) was named after 7.5 s."""
    from dilstore.reader.packaged import shipped
    from dilstore.runners import cmd_rerank
    from tests.fixtures.store_fixtures import build_store, random_shards

    def apply_threads(threads: int | None) -> None:
        raise AssertionError("torch's threads set before the packaged ranker was looked for")

    monkeypatch.setattr(cmd_rerank, "apply_threads", apply_threads)
    monkeypatch.setattr(shipped, "packaged_models_dir", lambda: tmp_path / "models")
    build_store(tmp_path / "store", random_shards([2]), kind=kind)
    (tmp_path / "t.tsv").write_text("1\tfirst query\n")
    (tmp_path / "r.trec").write_text("1 Q0 d1 1 2.0 bm25\n")
    assert main(filled(["rerank", "{tmp}/store", "--topics", "{tmp}/t.tsv", "--run", "{tmp}/r.trec", "--output",
                        "{tmp}/o.trec"], tmp=tmp_path)) == 2  # fmt: skip
    assert capsys.readouterr().err.startswith(f"dilstore rerank: error: the default "
                                              f"{missing.format(models=tmp_path / 'models')} has no config.json; ")


def test_precompute_checks_a_packaged_model_reference_before_the_model_loads() -> None:
    """(mut59b M15) fast59 F6's early check of --model was tried with a folder only: a `package:` reference could
    be left to the model's load, after Beam and torch, and no test noticed."""
    from dilstore.runners.cmd_precompute import check_model_folder
    from dilstore.storage.errors import DilstoreError

    with pytest.raises(DilstoreError, match="no-such-model"):
        check_model_folder("package:no-such-model")
    check_model_folder(None)


@pytest.mark.parametrize("text", ["No module named 'torch'", "cannot import name 'bitmap' from 'PIL'",
                                  "lib.so: failed to map segment from shared object; and more"])
def test_only_a_library_the_loader_could_not_map_is_taken_for_memory_run_short(text: str) -> None:
    """(mut59b M13) Only a missing module was tried: any ImportError naming a map, or one whose text goes on after
    the loader's words, could be called running out of memory, and no test noticed."""
    from dilstore.runners.out_of_memory import library_not_mapped_line

    assert library_not_mapped_line(ImportError(text)) is None


@pytest.mark.parametrize("address_space", [None, 1800 << 20])
def test_a_command_that_cannot_start_a_thread_is_one_line_naming_the_limits(
    address_space: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under `ulimit -v 1800000` `dilstore index` ended in a traceback of threading's "RuntimeError: can't start new
    thread" (the thread that waits on Lucene's build had no room for its stack), exit 1 (journey59 F1)."""

    from dilstore.runners import cmd_index

    address_space_limit(monkeypatch, address_space)

    def no_thread(args: argparse.Namespace) -> int:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(cmd_index, "run_command", no_thread)
    under = "under its address-space limit (ulimit -v) of 1,800 MiB"
    stack = "" if address_space is None else f"no room for its stack {under}, or "
    assert main(["index", str(tmp_path / "store")]) == 2
    assert capsys.readouterr().err == (f"dilstore index: error: no thread could be started ({stack}the limit on "
                                       "processes and threads: ulimit -u)\n")  # fmt: skip
