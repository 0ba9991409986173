"""Which model makes which store kind, and how: loading, tokenizing and encoding per kind, for precompute.

One table (`OFFLINE_KINDS`) serves the four kinds a store can hold:

    kind        model (dilstore.json kind)          stored unit             per-token state
    dilbert     DilBertReader ("dilbert")           `p [SEP]` windows       encode_passages      (d,)
    earl-s1     EarlRanker ("earl")                 `[CLS] d [SEP]` windows encode_documents     (d,)
    earl-s2     EarlRanker ("earl")                 `[CLS] d [SEP]` windows document_key_values  (M, 2, d)
    listformer  ListformerRanker ("listformer")     `d [SEP]` windows       encode_documents     (d,)

Loading (`load_offline_model`) checks the directory's dilstore.json before
any weight is read, so a DilBert checkpoint asked for an EARL kind (or the
reverse) fails at once with a message saying which kind it makes. A plain
encoder directory (no dilstore.json) starts a new model: a DilBert reader
with k = `layers`, or an EARL ranker initialised as the paper does
(`EarlRanker.from_base`: N = `layers`, default l − 2, CLS pooling, untied).
A base-initialised EARL ranker has never been trained to rank, so its stores
only suit speed and size measurements. A plain encoder directory starts an
untrained Listformer (`ListformerRanker.from_base`) with k = `layers`, which
it then needs. An EARL ranker with the bi-encoder
prior also gives each passage its mean S1 vector, on S1 and S2 stores alike
(the store's passages/vectors).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import torch
from transformers import PreTrainedTokenizerBase

from dilstore.reader.modeling.architectures import require_segment_limit, segment_positions
from dilstore.reader.modeling.checkpoints import CheckpointMetadata, metadata_of_kind, require_checkpoint_dir
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.reader.text.tokenization import TokenizedText, encode_document_windows, encode_passage
from dilstore.storage.errors import DilstoreError

OfflineModel = DilBertReader | EarlRanker | ListformerRanker
_Model = TypeVar("_Model", DilBertReader, EarlRanker, ListformerRanker)


# Per-token states (b, n, *state_shape), and per-passage vectors (b, d) or None.
OfflineOutput = tuple[torch.Tensor, torch.Tensor | None]


def _dilbert_states(model: OfflineModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> OfflineOutput:
    """`p [SEP]` ids and mask (b, n) → passage states after layer k (b, n, d); no vectors."""
    return _as(model, DilBertReader).encode_passages(input_ids, attention_mask), None


def _earl_s1_states(model: OfflineModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> OfflineOutput:
    """`[CLS] d [SEP]` ids and mask (b, n) → S1, the document module's output (b, n, d), and the prior's vectors."""
    ranker = _as(model, EarlRanker)
    states = ranker.encode_documents(input_ids, attention_mask)  # (b, n, d)
    return states, _prior_vectors(ranker, states, attention_mask)


def _earl_s2_states(model: OfflineModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> OfflineOutput:
    """`[CLS] d [SEP]` ids and mask (b, n) → S2, every judger block's keys and values (b, n, M, 2, d), and the
    prior's vectors."""
    ranker = _as(model, EarlRanker)
    states = ranker.encode_documents(input_ids, attention_mask)  # (b, n, d)
    return ranker.document_key_values(states), _prior_vectors(ranker, states, attention_mask)


def _listformer_states(model: OfflineModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> OfflineOutput:
    """`d [SEP]` ids and mask (b, n) → each document's states after the delayed layers k (b, n, d), and the
    prior's vectors (b, d) when the ranker has the prior."""
    ranker = _as(model, ListformerRanker)
    states = ranker.encode_documents(input_ids, attention_mask)  # (b, n, d)
    return states, ranker.document_vectors(input_ids, attention_mask) if ranker.prior else None


def _prior_vectors(ranker: EarlRanker, states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
    """A prior ranker's mean S1 vector per passage (b, d) float32, which S2 cannot give back; else None."""
    return ranker.document_vectors(states, attention_mask) if ranker.prior else None


@dataclass(frozen=True)
class OfflineKind:
    """How one store kind is made: by which model class, from which token windows, with which offline half.

    `windows(tokenizer, text, max_length)` splits a text into stored units
    (never truncating); `states(model, ids, mask)` maps padded ids and mask
    (b, n) to per-token states (b, n, *state_shape) and per-passage vectors
    (b, d), or None when the model stores none. `rotated_codes`: whether
    2bit/1bit codebooks of this kind use rotated codes (storage.rotated_codes):
    they halve the codes' error but cost a (d x d) product per decoded token
    vector, which pays where the online layers run over every stored token
    (DilBert's upper layers, Listformer's joint layers) and not where EARL's
    judger only attends to them (BENCHMARKS.md, "Rotated codes").
    """

    name: str
    model_name: str
    model_class: type[OfflineModel]
    windows: Callable[[PreTrainedTokenizerBase, str, int], list[TokenizedText]]
    states: Callable[[OfflineModel, torch.Tensor, torch.Tensor], OfflineOutput]
    rotated_codes: bool


OFFLINE_KINDS: dict[str, OfflineKind] = {
    kind.name: kind
    for kind in (
        OfflineKind("dilbert", "a DilBert reader", DilBertReader, encode_passage, _dilbert_states, True),
        OfflineKind("earl-s1", "an EARL ranker", EarlRanker, encode_document_windows, _earl_s1_states, False),
        OfflineKind("earl-s2", "an EARL ranker", EarlRanker, encode_document_windows, _earl_s2_states, False),
        OfflineKind("listformer", "a Listformer ranker", ListformerRanker, encode_passage, _listformer_states, True),
    )
}


def offline_kind(name: str) -> OfflineKind:
    """The store kind called `name`, or a DilstoreError listing the kinds precompute makes."""
    try:
        return OFFLINE_KINDS[name]
    except KeyError:
        raise DilstoreError(f"unknown store kind {name!r}; precompute makes: {', '.join(OFFLINE_KINDS)}") from None


def load_offline_model(path: str | Path, kind: str, layers: int | None) -> OfflineModel:
    """The model that makes `kind` stores, from a checkpoint or a plain encoder directory (module docstring).

    `layers` is k for dilbert and listformer, N for the EARL kinds. A trained checkpoint
    fixes its own split: `layers` must then be None or equal to it. The directory's
    kind is checked before any weight is loaded.
    """
    wanted = offline_kind(kind)
    directory = require_checkpoint_dir(Path(path))
    metadata = metadata_of_kind(directory, (wanted.model_class.kind,), partial(_cannot_make, kind))
    model: OfflineModel
    if wanted.model_class is DilBertReader:
        if metadata is not None:
            trained = f"a DilBert reader trained with k = {metadata.layers}"
            why = ": a store at another k holds states that reader cannot read"
            _require_own_split(directory, metadata.layers, layers, "k", trained, why)
        model = DilBertReader.from_pretrained(directory, layers=layers)
    elif wanted.model_class is ListformerRanker:
        model = _load_listformer(directory, metadata, layers)
    elif metadata is None:
        model = EarlRanker.from_base(directory, EarlConfig(query_layers=layers))
    else:
        trained = f"an EARL ranker with N = {metadata.layers} query layers"
        _require_own_split(directory, metadata.layers, layers, "N", trained)
        model = EarlRanker.from_pretrained(directory)
    _require_finite_weights(model, directory)
    return model


def _require_finite_weights(model: OfflineModel, directory: Path) -> None:
    """A DilstoreError naming the first weight of `model` that holds NaN or infinity (a damaged checkpoint): every
    state it computes is then NaN, and precompute stopped at the first shard blaming one of its passages ("passage
    'p3': token 0 has NaN or infinite states"), not the model (num58 F4)."""
    _, network = model.fingerprinted_network()
    weights = {name: tensor for name, tensor in network.state_dict().items() if tensor.is_floating_point()}
    # A NaN or infinity makes its tensor's sum non-finite: one sum per tensor costs a twentieth of isfinite's mask
    # (about 10 ms for MiniLM's 22.6M weights against 0.2 s); only a non-finite sum (or finite weights near float32's
    # largest, whose sum overflows) is looked at element by element.
    sums = torch.stack([tensor.detach().sum(dtype=torch.float32) for tensor in weights.values()])  # (W,)
    if bool(torch.isfinite(sums).all()):
        return
    broken = next((name for name, tensor in weights.items() if not bool(torch.isfinite(tensor).all())), None)
    if broken is not None:
        raise DilstoreError(f"cannot load a model from {directory}: its weight {broken} holds NaN or infinite values, "
                            "so every state it computes would too; load a good copy of its files")  # fmt: skip


def _load_listformer(directory: Path, metadata: CheckpointMetadata | None, layers: int | None) -> ListformerRanker:
    """A trained Listformer (its own k, which `layers` may only repeat), or an untrained one from a plain encoder."""
    if metadata is None:
        if layers is None:
            raise DilstoreError(
                f"{directory} is a plain encoder: an untrained Listformer from it needs its delayed layers k "
                "(--layers)"
            )
        return ListformerRanker.from_base(directory, ListformerConfig(delayed_layers=layers))
    trained = f"a Listformer with k = {metadata.layers} delayed layers"
    _require_own_split(directory, metadata.layers, layers, "k", trained)
    return ListformerRanker.from_pretrained(directory)


def _require_own_split(directory: Path, own: int, layers: int | None, symbol: str, trained: str, why: str = "") -> None:
    """Refuse `layers` other than a trained checkpoint's own split `own` (its k or N: `symbol`); None takes its own.

    `trained` says what the checkpoint is ("an EARL ranker with N = 2 query
    layers"); `why`, when given, adds what another split would break.
    """
    if layers is not None and layers != own:
        raise DilstoreError(
            f"{directory} is {trained}, not {layers}{why}; omit the layers (--layers) or give its own {symbol}"
        )


def _cannot_make(kind: str, found: str) -> str:
    """Why a checkpoint of dilstore.json kind `found` cannot make `kind` stores: what it makes, what they need."""
    wanted = OFFLINE_KINDS[kind]
    makes = [name for name, other in OFFLINE_KINDS.items() if other.model_class.kind == found]
    return (
        f", which makes {' or '.join(makes) or 'no'} stores; {kind} stores need {wanted.model_name} "
        f"(dilstore.json kind {wanted.model_class.kind!r}) or a plain encoder directory"
    )


def max_positions(model: OfflineModel) -> int:
    """The most tokens one stored passage of `model` may hold: a segment's (architectures.segment_positions), less
    one for a Listformer with the prior, whose prior encoder reads each `d [SEP]` behind a [CLS] (spec61 F7: a
    --max-length of all the positions passed, and the run stopped at the first passage that long)."""
    return segment_limit(model) - (1 if _reads_behind_cls(model) else 0)


def segment_limit(model: OfflineModel) -> int:
    """The most tokens one segment of `model` may hold (architectures.segment_positions): what `precompute` allowed a
    stored passage before spec61 F7, and still allows an append to a store built so (read61 F2)."""
    config, _ = model.fingerprinted_network()
    return segment_positions(config)


def positions_note(model: OfflineModel) -> str:
    """What max_positions left out of the segment positions, for the refusal of a longer --max-length; "" if none."""
    return " (one less than its segment: the prior reads each passage behind the [CLS])" if _reads_behind_cls(model) \
        else ""


def _reads_behind_cls(model: OfflineModel) -> bool:
    """Whether `model` is a Listformer with the prior, whose document_vectors put a [CLS] before `d [SEP]`."""
    return isinstance(model, ListformerRanker) and model.prior


def require_within_positions(limit: int, model: OfflineModel, text: str, flag: str) -> None:
    """architectures.require_segment_limit for an offline model, checked when a reader or reranker opens."""
    config, _ = model.fingerprinted_network()
    require_segment_limit(config, limit, text, flag)


def _as(model: OfflineModel, cls: type[_Model]) -> _Model:
    """`model`, or a DilstoreError when it is not a `cls` (a store kind paired with the wrong model)."""
    if not isinstance(model, cls):
        raise DilstoreError(f"this store kind needs a {cls.__name__}, got a {type(model).__name__}")
    return model
