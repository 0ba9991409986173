"""benchmarks/cost_model.py: its arithmetic on known inputs, and the provenance of its committed inputs.

The cost model turns measured figures into storage, CPU hours and a GPU
estimate for full corpora. These tests pin the arithmetic on hand-checkable
inputs, and hold the committed inputs file to its rules: every entry has a
value, unit, source, date and status, BENCHMARKS.md sources name a real
section, and figures that restate the code (state shapes, the codebook's
sample size) match it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import re

import pytest

from dilstore.storage.residual_codes import CODEBOOK_SAMPLE_UNITS
from tests.fixtures.paths import ROOT

BENCHMARKS_SECTIONS = set(re.findall(r"^## (.+)$", (ROOT / "BENCHMARKS.md").read_text(), flags=re.MULTILINE))


@pytest.fixture(scope="module")
def cost():
    spec = importlib.util.spec_from_file_location("cost_model", ROOT / "benchmarks" / "cost_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tree():
    return json.loads((ROOT / "benchmarks" / "cost_inputs.json").read_text())


@pytest.fixture(scope="module")
def inputs(cost):
    return cost.read_inputs(cost.INPUTS)


def test_every_input_entry_has_a_source_and_benchmarks_sources_name_a_section(cost, tree) -> None:
    found = list(cost.entries(tree))
    assert len(found) > 40
    cost.check_entries(tree)
    for path, entry in found:
        source = entry["source"]
        if source.startswith("BENCHMARKS.md § "):
            assert source.removeprefix("BENCHMARKS.md § ") in BENCHMARKS_SECTIONS, path
        elif source != "assumption":
            assert (ROOT / source).is_file(), path
        assert (entry["status"] == "assumed") == (source == "assumption"), path
        assert re.fullmatch(r"2026-\d\d-\d\d", entry["date"]), path


@pytest.mark.parametrize("field", ["source", "unit", "date"])
def test_an_entry_without_a_required_field_is_refused(cost, tree, field: str) -> None:
    broken = copy.deepcopy(tree)
    del broken["vm_vcpus"][field]
    with pytest.raises(cost.InputError, match=f"vm_vcpus lacks {field}"):
        cost.check_entries(broken)


def test_inputs_agree_with_the_code_they_restate(cost, inputs) -> None:
    assert inputs["codebook"]["sample_documents"] == CODEBOOK_SAMPLE_UNITS
    bench_scale = importlib.import_module("bench_scale")  # on sys.path once cost_model is loaded
    d = inputs["model"]["hidden"]
    shapes = {"dilbert": (d,), "earl-s1": (d,), "earl-s2": (inputs["model"]["judger_blocks"], 2, d)}
    for kind, shape in shapes.items():
        assert inputs["kinds"][kind]["values_per_token"] == math.prod(shape)
        for encoding, measured in inputs["kinds"][kind]["state_bytes_per_token"].items():
            marginal = bench_scale.encoding_bytes_per_token(encoding, shape)
            assert marginal <= measured <= marginal * 1.01, (kind, encoding)  # measured = marginal + fixed bytes


def test_storage_is_tokens_times_bytes_per_token_plus_the_index(cost) -> None:
    stored = cost.storage_bytes(tokens=1e9, passages=1e7, state_per_token=100.0, ids_per_token=12.0,
                                index_per_passage=16.0)
    assert stored == {"states": 1e11, "token_ids_and_spans": 1.2e10, "index": 1.6e8, "total": 1e11 + 1.2e10 + 1.6e8}


def test_precompute_hours_scale_linearly_and_codebooks_add_a_fixed_pass(cost, inputs) -> None:
    kind = {"precompute_tokens": 1000.0, "precompute_seconds": 1.0, "values_per_token": 384}  # 1,000 tokens/s
    fp16 = cost.precompute_seconds(1e6, 100.0, kind, "fp16", inputs)
    assert fp16["total"] == pytest.approx(1000.0) and fp16["codebook_sampling"] == 0
    assert cost.precompute_seconds(2e6, 100.0, kind, "fp16", inputs)["total"] == pytest.approx(2000.0)
    two_bit = cost.precompute_seconds(1e6, 100.0, kind, "2bit", inputs)
    encode = inputs["encode_us_per_token"]
    assert two_bit["extra_encode"] == pytest.approx(1e6 * (encode["2bit"] - encode["fp16"]) * 1e-6)
    assert two_bit["codebook_sampling"] == pytest.approx(CODEBOOK_SAMPLE_UNITS * 100.0 / 1000.0
                                                         + inputs["codebook"]["train_seconds"])
    four_values = cost.precompute_seconds(1e6, 100.0, {**kind, "values_per_token": 4 * 384}, "2bit", inputs)
    assert four_values["extra_encode"] == pytest.approx(4 * two_bit["extra_encode"])
    assert cost.precompute_seconds(1e6, 100.0, kind, "int8", inputs)["extra_encode"] == 0  # int8 encodes faster


def test_gpu_estimate_takes_the_largest_floor(cost) -> None:
    gpu = {"peak_bf16_flops": 1e15, "utilisation": 0.1, "host_cores": 10, "write_bytes_per_s": 1e9}
    estimate = cost.gpu_estimate_seconds(tokens=1e9, flops=1e7, encode_us=2.0, store_bytes=5e11, gpu=gpu)
    assert estimate["model_flops"] == pytest.approx(100.0)
    assert estimate["host_encode"] == pytest.approx(200.0)
    assert estimate["write"] == pytest.approx(500.0)
    assert (estimate["total"], estimate["bound_by"]) == (estimate["write"], "write")


def test_flops_per_token_counts_the_offline_layers_and_s2_projections(cost) -> None:
    model = {"hidden": 2, "intermediate": 8, "offline_layers": 3, "judger_blocks": 2}
    layer = 2 * (4 * 4 + 2 * 2 * 8) + 4 * 10 * 2  # QKV + output + FFN, attention over 10 tokens
    assert cost.flops_per_token(model, "earl-s1", 10) == 3 * layer
    assert cost.flops_per_token(model, "earl-s2", 10) == 3 * layer + 2 * 2 * 2 * 4


def test_growth_fits_a_line_and_labels_fitted_values(cost) -> None:
    grown = cost.growth([[1, 10.0], [2, 20.0], [4, 40.0]], at=[2, 10])
    assert grown["slope"] == pytest.approx(10.0) and grown["intercept"] == pytest.approx(0.0, abs=1e-9)
    assert [(row["value"], row["status"]) for row in grown["at"]] == [(20.0, "measured"),
                                                                      (pytest.approx(100.0), "fitted")]


def test_report_on_the_committed_inputs(cost, inputs) -> None:
    result = cost.cost_model(inputs)
    assert len(result["rows"]) == 2 * 3 * 4
    wiki = {(row["kind"], row["encoding"]): row for row in result["rows"] if row["corpus"] == "English Wikipedia"}
    assert wiki["dilbert", "fp16"]["storage_bytes"]["states"] == pytest.approx(4.5e9 * 768.4)
    assert wiki["earl-s2", "fp16"]["storage_bytes"]["total"] > 3.9 * wiki["earl-s1", "fp16"]["storage_bytes"]["total"]
    assert all(row["core_hours"] == pytest.approx(2 * row["cpu_hours"]) for row in result["rows"])
    index = result["growth"]["index_bytes"]
    assert index["slope"] == pytest.approx(16.06, rel=0.01)
    assert [row["status"] for row in index["at"]] == ["measured", "fitted", "fitted"]
    assert {row["kind"] for row in result["check"]} == {"earl-s1", "earl-s2"}
    assert all(0.8 < row["model_over_measured"] < 1.25 for row in result["check"])
    text = cost.render(result)
    assert "ESTIMATE" in text and "(fitted)" in text


def test_readme_example_is_what_the_model_computes(cost, inputs) -> None:
    """README's cost-model example (a Wikipedia DilBert store in fp16 and 1bit, its CPU hours) is the committed inputs'
    result, rounded as README rounds it (repro55 F4).

    README said 0.28 TB in 1bit: 50 state bytes a token, before the rotated codes' 51 made it 0.285 TB.
    """
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"a Wikipedia DilBert store takes ([\d.]+) TB in fp16 and ([\d.]+) TB in 1bit, and about (\d+) "
                     r"CPU-hours here", readme)
    assert said, "README's cost-model example has moved or been reworded: update this test with it"
    wiki = {row["encoding"]: row for row in cost.cost_model(inputs)["rows"]
            if row["corpus"] == "English Wikipedia" and row["kind"] == "dilbert"}
    assert said.group(1) == f"{wiki['fp16']['storage_bytes']['total'] / 1e12:.2f}"
    assert said.group(2) == f"{wiki['1bit']['storage_bytes']['total'] / 1e12:.2f}"
    assert said.group(3) == f"{wiki['fp16']['cpu_hours']:.0f}"


def test_a_missing_inputs_file_is_one_line_and_exit_2(cost, tmp_path, capsys) -> None:
    assert cost.main(["--inputs", str(tmp_path / "none.json")]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_an_output_in_a_missing_folder_is_refused_before_the_report(cost, tmp_path, capsys) -> None:
    """It printed the whole report, then a FileNotFoundError traceback."""
    assert cost.main(["--output", str(tmp_path / "none" / "cost.json")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "the folder" in captured.err and "does not exist" in captured.err


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("corpora", "English Wikipedia", "passages"), 0, "corpora.English Wikipedia.passages has value 0"),
        (("kinds", "dilbert", "precompute_seconds"), -1, "kinds.dilbert.precompute_seconds has value -1"),
        (("vm_vcpus",), "many", "vm_vcpus has value 'many'"),
        (("vm_vcpus",), True, "vm_vcpus has value True"),
        (("gpu", "utilisation"), float("nan"), "gpu.utilisation has value nan"),
        (("gpu", "utilisation"), float("inf"), "gpu.utilisation has value inf"),
        (("scale", "open_ms_by_shards"), [[4, 20.1], [12]], "scale.open_ms_by_shards has value [[4, 20.1], [12]]"),
        (("scale", "open_ms_by_shards"), [], "scale.open_ms_by_shards has value []"),
        (("scale", "open_ms_by_shards"), 5, "scale.open_ms_by_shards has value 5"),
        (("vm_vcpus",), [[1, 2]], "vm_vcpus has value [[1, 2]]"),
        (("vm_vcpus",), 10**400, "vm_vcpus has value 1000"),
        (("gpu", "utilisation"), 5, "gpu.utilisation has value 5: a share of the peak, at most 1"),
    ],
)
def test_a_value_that_is_no_positive_finite_number_is_refused(cost, tree, path, value, message: str) -> None:
    """A zero was a ZeroDivisionError, a string a TypeError, a huge int an OverflowError, a scalar where pairs belong
    (or pairs for a scalar) a TypeError, and a negative, NaN, bool or over-1 utilisation value gave a report with
    negative hours, NaN terabytes or a GPU faster than its peak."""
    broken = copy.deepcopy(tree)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]]["value"] = value
    with pytest.raises(cost.InputError, match=re.escape(message)):
        cost.check_entries(broken)


def test_a_kind_or_encoding_the_model_lacks_is_refused(cost, tree) -> None:
    """An unknown kind was costed with dilbert's FLOPs, and an unknown encoding ignored."""
    unknown_kind = copy.deepcopy(tree)
    unknown_kind["kinds"]["colbert"] = unknown_kind["kinds"]["dilbert"]
    with pytest.raises(cost.InputError, match="kinds names 'colbert', not one of dilbert"):
        cost.check_entries(unknown_kind)
    unknown_encoding = copy.deepcopy(tree)
    unknown_encoding["encode_us_per_token"]["fp8"] = unknown_encoding["encode_us_per_token"]["fp16"]
    with pytest.raises(cost.InputError, match="encode_us_per_token names 'fp8', not one of fp16, int8, 2bit, 1bit"):
        cost.check_entries(unknown_encoding)


@pytest.mark.parametrize("content", [b"[1, 2]", b"\xff\xfe{", None])
def test_inputs_that_are_no_object_or_cannot_be_read_are_one_line_and_exit_2(cost, tmp_path, capsys,
                                                                             content: bytes | None) -> None:
    """A list was an AttributeError, bytes that are not UTF-8 a UnicodeDecodeError, a folder an IsADirectoryError."""
    inputs = tmp_path / "inputs.json"
    if content is None:
        inputs.mkdir()
    else:
        inputs.write_bytes(content)
    assert cost.main(["--inputs", str(inputs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("cost_model: error: ") and captured.err.count("\n") == 1


def test_inputs_whose_results_overflow_are_one_line_and_exit_2(cost, tree, tmp_path, capsys) -> None:
    """Each input finite, their product not: the report printed `Infinity`, which strict JSON readers refuse."""
    broken = copy.deepcopy(tree)
    broken["corpora"]["English Wikipedia"]["tokens"]["value"] = 1e308
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps(broken), encoding="utf-8")
    assert cost.main(["--inputs", str(inputs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "a result too large for a number (Infinity)" in captured.err
