"""Train EARL, its two baselines and the Listformer end to end on (query, positive, negatives) triples.

One loop serves the rankers of reader/modeling/rankers.py (EARL, the
cross-encoder and the Siamese encoder, seed 004, 3.4 and 4.3; the Listformer,
seed 003); each scores groups of 1 positive and n negatives per query,
(b, 1 + n), and the loss is one of reader/training/losses.py: the pairwise
hinge or the softmax cross-entropy, or a listwise loss over the group as a
list (ApproxNDCG with temperature `temperature`, or ListNet), its labels
built beside the scores (1 for the positive, 0 for each negative), so each
label stays with its document. The Listformer reads each group as one list
in one pass; `delayed_layers` is its k.

- Data: triples and paragraphs files (reader/data/ranking_files.py); every query
  and paragraph is tokenized once, by the ranker's own convention.
- The loop is reader/training/loop.py's, shared with `train qa`: AdamW with
  linear warm-up and decay, gradient clipping and accumulation, fp32 on CPU
  and bf16 (or fp16) autocast on CUDA, a seeded triple order (a resumed run
  skips exactly what it saw; dropout continues from the saved RNG), periodic
  resumable checkpoints under OUTPUT/checkpoints/step-N.
- The final ranker goes to OUTPUT with dilstore_training.json (kind, command,
  data, steps, seconds, hardware). A Listformer's final weights are fp16; its
  periodic checkpoints keep fp32, so that a resumed run continues exactly.
- EARL with the bi-encoder prior (`prior`) starts as the base model's cosine.
  `freeze_encoder` then trains only the judger blocks, the head and the
  prior's scale, so the prior stays that cosine and checkpoints name the base
  instead of storing the encoder (EarlRanker.freeze_encoder);
  `encoder_learning_rate` instead trains the encoder copies at their own,
  lower peak rate.
- A Listformer with the prior (`prior`) starts as the same cosine, from a
  frozen copy of the base that its checkpoints name instead of storing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch

from dilstore.reader.data.ranking_data import require_written_together
from dilstore.reader.data.ranking_files import Triple, read_paragraphs, read_triples
from dilstore.reader.modeling.architectures import require_segment_limit
from dilstore.reader.modeling.checkpoints import quoted_with_article
from dilstore.reader.modeling.earl import ENCODER_PREFIXES, POOLINGS, EarlConfig, EarlRanker
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.reader.modeling.ranker_base import RankerBase
from dilstore.reader.modeling.rankers import load_ranker, new_ranker
from dilstore.reader.modeling.ranking_inputs import (
    DEFAULT_MAX_DOC_LENGTH,
    DEFAULT_MAX_QUERY_LENGTH,
    RANKER_KINDS,
)
from dilstore.reader.training.configs import LoopConfig, require_finite
from dilstore.reader.training.loop import (
    Throughput,
    accumulate_micro_batches,
    autocast_context,
    optimizer_step_batches,
)
from dilstore.reader.training.losses import (
    DEFAULT_MARGIN,
    approx_ndcg_loss,
    listnet_loss,
    pairwise_hinge_loss,
    softmax_cross_entropy_loss,
)
from dilstore.reader.training.runs import TrainerRun, finish_run, start_run
from dilstore.storage.checks import require_at_least_one
from dilstore.storage.errors import DilstoreError

LOSSES = ("softmax", "hinge", "approx-ndcg", "listnet")
LISTWISE_LOSSES = ("approx-ndcg", "listnet")
DEFAULT_TEMPERATURE = 1.0


@dataclass(frozen=True, kw_only=True)
class RankingTrainingConfig(LoopConfig):
    """Everything that decides what a ranking run computes (the seed's AdamW 3e-5 and linear schedule)."""

    kind: str
    negatives: int = 7
    loss: str = "softmax"
    margin: float = DEFAULT_MARGIN
    temperature: float = DEFAULT_TEMPERATURE
    epochs: int = 1
    batch_size: int = 16
    max_query_length: int = DEFAULT_MAX_QUERY_LENGTH
    max_doc_length: int = DEFAULT_MAX_DOC_LENGTH
    query_layers: int | None = None
    pooling: str = "cls"
    tied: bool = False
    prior: bool = False
    freeze_encoder: bool = False
    encoder_learning_rate: float | None = None
    delayed_layers: int = 0

    def __post_init__(self) -> None:
        if self.kind not in RANKER_KINDS:
            raise DilstoreError(f"unknown ranker kind {self.kind!r}; the kinds are {', '.join(RANKER_KINDS)}")
        require_at_least_one({"negatives": self.negatives, "train_limit": self.train_limit})
        super().__post_init__()
        if self.max_query_length < 3 or self.max_doc_length < 3:
            raise DilstoreError(
                f"max-query-length and max-doc-length must be at least 3 ([CLS] text [SEP]), "
                f"got {self.max_query_length} and {self.max_doc_length}"
            )
        if self.loss not in LOSSES:
            raise DilstoreError(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if not 0 < self.margin < math.inf:
            raise DilstoreError(f"margin must be a positive finite number, got {self.margin}")
        if not 0 < self.temperature < math.inf:
            raise DilstoreError(f"temperature must be a positive finite number, got {self.temperature}")
        if self.margin != DEFAULT_MARGIN and self.loss != "hinge":
            raise DilstoreError(f"margin is the hinge loss's; with the {self.loss} loss it would be ignored")
        if self.temperature != DEFAULT_TEMPERATURE and self.loss != "approx-ndcg":
            raise DilstoreError(f"temperature is the approx-ndcg loss's; with the {self.loss} loss it would be ignored")
        if self.kind != "listformer" and self.delayed_layers:
            raise DilstoreError("delayed-layers describes a Listformer only")
        ListformerConfig(self.delayed_layers)
        if self.pooling not in POOLINGS:
            raise DilstoreError(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        earl_only = (self.query_layers is not None, self.pooling != "cls", self.tied,
                     self.freeze_encoder, self.encoder_learning_rate is not None)  # fmt: skip
        if self.kind != "earl" and any(earl_only):
            raise DilstoreError(
                "query-layers, pooling, tied, freeze-encoder and encoder-learning-rate describe an EARL ranker only"
            )
        if self.prior and self.kind not in ("earl", "listformer"):
            raise DilstoreError("prior describes an EARL ranker or a Listformer only")
        if self.freeze_encoder and self.encoder_learning_rate is not None:
            raise DilstoreError(
                "freeze-encoder and encoder-learning-rate exclude each other: a frozen encoder has none"
            )
        if self.encoder_learning_rate is not None:
            require_finite({"encoder-learning-rate": self.encoder_learning_rate})
        if self.encoder_learning_rate is not None and self.encoder_learning_rate <= 0:
            raise DilstoreError(f"encoder-learning-rate must be positive, got {self.encoder_learning_rate}")

    def earl_config(self) -> EarlConfig:
        """The EARL variant this config trains (ignored by the other kinds)."""
        return EarlConfig(query_layers=self.query_layers, pooling=self.pooling, tied=self.tied, prior=self.prior)

    def listformer_config(self) -> ListformerConfig:
        """The Listformer variant this config trains (ignored by the other kinds)."""
        return ListformerConfig(delayed_layers=self.delayed_layers, prior=self.prior)

    def learning_rates(self) -> dict[str, float] | None:
        """Parameter-name prefixes with their own peak rate: EARL's encoder copies under encoder_learning_rate."""
        if self.encoder_learning_rate is None:
            return None
        return dict.fromkeys(ENCODER_PREFIXES, self.encoder_learning_rate)


@dataclass(frozen=True)
class RankingData:
    """Triples with every query and paragraph tokenized once by the ranker being trained."""

    triples: list[Triple]
    query_tokens: list[np.ndarray]  # per triple
    doc_tokens: dict[str, np.ndarray]  # per paragraph id

    def batch(self, indices: Sequence[int]) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """Queries and their [positive, negatives...] groups for the triples at `indices`."""
        queries = [self.query_tokens[i] for i in indices]
        groups = [
            [self.doc_tokens[pid] for pid in (self.triples[i].positive, *self.triples[i].negatives)] for i in indices
        ]
        return queries, groups


@dataclass(frozen=True)
class RankingTrainingResult:
    """What a run did: the budget actually spent and where the ranker is."""

    output: Path
    kind: str
    steps: int
    total_steps: int
    triples_seen: int
    train_triples: int
    train_seconds: float
    final_loss: float
    losses: list[float] = field(repr=False)
    ranker: RankerBase = field(repr=False, compare=False)


def load_ranking_data(
    ranker: RankerBase, triples_file: Path, paragraphs_file: Path, config: RankingTrainingConfig
) -> RankingData:
    """Read and check the files, keep the first `train_limit` triples and `negatives` negatives, tokenize once."""
    require_written_together(triples_file, paragraphs_file)
    paragraphs = read_paragraphs(paragraphs_file)
    triples = read_triples(triples_file, paragraphs, paragraphs_file, config.negatives)
    if config.train_limit is not None:
        triples = triples[: config.train_limit]
    used = dict.fromkeys(pid for triple in triples for pid in (triple.positive, *triple.negatives))
    return RankingData(
        triples=triples,
        query_tokens=[
            _tokenized(ranker.tokenize_query, triple.query, config.max_query_length,
                       f"{triples_file}:{triple.line}: the query of {triple.qid!r}")  # fmt: skip
            for triple in triples
        ],
        doc_tokens={
            pid: _tokenized(ranker.tokenize_document, paragraphs[pid], config.max_doc_length,
                            f"{paragraphs_file}: paragraph {pid!r}")  # fmt: skip
            for pid in used
        },
    )


def _tokenized(tokenize: Callable[[str, int], np.ndarray], text: str, max_length: int, where: str) -> np.ndarray:
    """`tokenize(text, max_length)`; its error (no word pieces left: zero-width or control characters only) names
    `where`, the file, line and id, since a preview of invisible characters cannot be found in a large file."""
    try:
        return tokenize(text, max_length)
    except DilstoreError as error:
        raise DilstoreError(f"{where}: {error}") from None


def ranking_loss(scores: torch.Tensor, config: RankingTrainingConfig) -> torch.Tensor:
    """The configured loss over scores (b, 1 + n), positive first, computed in fp32.

    The listwise losses get the group's labels beside its scores: 1 for the
    positive in column 0, 0 for the negatives after it.
    """
    scores = scores.float()  # (b, 1 + n)
    if config.loss == "hinge":
        return pairwise_hinge_loss(scores, config.margin)
    if config.loss in LISTWISE_LOSSES:
        labels = torch.zeros_like(scores)  # (b, 1 + n)
        labels[:, 0] = 1.0
        if config.loss == "listnet":
            return listnet_loss(scores, labels)
        return approx_ndcg_loss(scores, labels, config.temperature)
    return softmax_cross_entropy_loss(scores)


def accumulate_ranking_gradients(
    ranker: RankerBase,
    data: RankingData,
    micro_batches: Sequence[Sequence[int]],
    config: RankingTrainingConfig,
    device: torch.device,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches, adding into `.grad`; returns the mean loss ()."""

    def micro_batch_loss(indices: Sequence[int]) -> torch.Tensor:
        queries, groups = data.batch(indices)
        with autocast_context(device, dtype):
            scores = ranker.score_groups(queries, groups)  # (b, 1 + n)
        return ranking_loss(scores, config)

    return accumulate_micro_batches(micro_batches, micro_batch_loss, scaler)


def train_ranker(
    base_model: Path,
    triples_file: Path,
    paragraphs_file: Path,
    output_dir: Path,
    config: RankingTrainingConfig,
    *,
    command: str,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
) -> RankingTrainingResult:
    """Train a `config.kind` ranker initialised from the plain encoder `base_model`; save it to `output_dir`.

    With `resume`, the run continues from its newest checkpoint (runs.start_run).
    """
    start = start_run(output_dir, config, resume=resume, device=device)
    resume_from = start.resume_from
    ranker = (
        load_ranker(resume_from)
        if resume_from
        else new_ranker(config.kind, base_model, config.earl_config(), config.listformer_config())
    )
    if ranker.kind != config.kind:
        found = quoted_with_article(ranker.kind)
        raise DilstoreError(f"--resume: {resume_from} holds {found} ranker, not {config.kind!r}")
    for limit, text, flag in ((config.max_query_length, "query", "--max-query-length"),
                              (config.max_doc_length, "document", "--max-doc-length")):  # fmt: skip
        require_segment_limit(ranker.config, limit, text, flag)
    if config.freeze_encoder and resume_from is None:
        assert isinstance(ranker, EarlRanker)  # freeze_encoder is EARL-only (RankingTrainingConfig)
        ranker.freeze_encoder(base_model)
    data = load_ranking_data(ranker, Path(triples_file), Path(paragraphs_file), config)
    run = TrainerRun(
        model=ranker,
        num_examples=len(data.triples),
        step_plan=optimizer_step_batches(len(data.triples), config),
        accumulate=partial(accumulate_ranking_gradients, ranker, data, config=config, device=start.device),
        throughput=Throughput(
            per_example=1 + config.negatives,
            bar_name="pairs_per_s",
            log_name="pairs/s",
            log_digits=1,
            seen_name="triples",
        ),
        identity={"kind": ranker.kind},
        inputs={
            "base_model": str(Path(base_model)),
            "triples": str(Path(triples_file)),
            "paragraphs": str(Path(paragraphs_file)),
        },
        counts=lambda position: {
            "triples_seen": position.features_seen,
            "pairs_seen": position.features_seen * (1 + config.negatives),
            "train_triples": len(data.triples),
        },
        learning_rates=config.learning_rates(),
        # A Listformer's periodic checkpoints keep fp32 weights (its final one is fp16),
        # so that --resume continues exactly where the run stopped.
        save_checkpoint=(
            partial(ranker.save_pretrained, dtype=torch.float32) if isinstance(ranker, ListformerRanker) else None
        ),
    )
    outcome = finish_run(start, run, config, command=command, progress=progress)
    return RankingTrainingResult(
        output=start.output_dir,
        kind=ranker.kind,
        steps=outcome.position.step,
        total_steps=outcome.total_steps,
        triples_seen=outcome.position.features_seen,
        train_triples=len(data.triples),
        train_seconds=outcome.position.train_seconds,
        final_loss=outcome.final_loss,
        losses=outcome.losses,
        ranker=ranker,
    )
