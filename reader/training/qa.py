"""Fine-tune a DilBert reader on SQuAD-format data, run_squad style.

One code path: the loss is computed on the model core's `forward`, the same
delayed-interaction composition that inference runs offline and online, so a
trained k is exactly the k that `precompute` and `ask` use.

- Data: SQuAD v1.1 JSON → sliding-window features (reader/data/qa_features.py);
  a window without the answer is labelled [CLS] (index 0 of the concatenation).
- Loss: the mean of start and end cross-entropies over `[question ; passage]`.
- The loop is reader/training/loop.py's, shared with ranker training: AdamW
  with linear warm-up and decay, gradient clipping and accumulation, fp32 on
  CPU and bf16 (or fp16) autocast on CUDA, a seeded window order, periodic
  resumable checkpoints under OUTPUT/checkpoints/step-N.
- Windows of similar length are batched together to cut padding; with
  `chunk_windows`, a micro-batch's windows also run in length-sorted chunks
  (reader/training/length_chunks.py), which a shared-normalisation group's
  windows of unrelated lengths need.
- Shared normalisation (Clark & Gardner 2018), when `shared_norm` names the
  triples of `train ranking-data`: each training example is a question group
  of its answer window and the first windows of N BM25 negative paragraphs
  (reader/data/shared_norm.py), and the start and end cross-entropies run
  over one softmax across the passage tokens of the whole group, so span
  scores become comparable across passages (shared_norm_loss).
- Distillation (DeFormer, Cao et al. 2020), when a teacher reader is given:
  loss = CE + alpha * T^2 * KL(teacher || student) on the start and end
  distributions at temperature T, + beta * the mean squared distance between
  the student's and the teacher's outputs of each upper layer k+1..l (the
  layerwise representation similarity). The teacher is usually the k=0
  reader the student was started from; it runs frozen, in eval mode.
- Frozen lower layers (`freeze_lower`, reader/training/frozen_lower.py): the
  embeddings and layers 1..k stay as loaded, each distinct window's layer-k
  states are computed once and cached in fp16 (the store as a training
  cache), and only layers k+1..l and the head train. With `store_encoding`
  (reader/training/store_codec.py) the cached passage states are what a
  store of that encoding returns, so the upper layers learn to read them.
- The final model goes to OUTPUT itself, with dilstore_training.json (k, the
  command, the budget actually run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from dilstore.reader.batching import pad_id
from dilstore.reader.data.qa_batches import QABatch, collate_features
from dilstore.reader.data.qa_features import QAFeature, window_features
from dilstore.reader.data.ranking_data import require_written_together
from dilstore.reader.data.ranking_files import PARAGRAPHS_FILE
from dilstore.reader.data.shared_norm import shared_norm_groups
from dilstore.reader.data.squad import SquadExample, training_questions
from dilstore.reader.modeling.architectures import require_segment_limit
from dilstore.reader.modeling.checkpoints import require_trained_reader
from dilstore.reader.modeling.dilbert import DilBertReader
from dilstore.reader.training.configs import TrainingConfig
from dilstore.reader.training.frozen_lower import LowerStateCache, freeze_lower_layers
from dilstore.reader.training.length_chunks import ChunkForward, default_chunk_windows, forward_in_chunks
from dilstore.reader.training.loop import (
    Throughput,
    accumulate_micro_batches,
    autocast_context,
    optimizer_step_batches,
)
from dilstore.reader.training.runs import RunStart, TrainerRun, finish_run, start_run
from dilstore.storage.errors import DilstoreError


def _throughput(windows_per_example: int) -> Throughput:
    """How `train qa` reports its speed: windows per second (a shared-normalisation example is a group of windows)."""
    return Throughput(
        per_example=windows_per_example, bar_name="win_per_s", log_name="windows/s", log_digits=2, seen_name="seen"
    )


@dataclass(frozen=True)
class TrainingData:
    """The labelled training examples of a file, and how to pad any subset of them into a batch.

    An example is one window, or with shared normalisation a group of
    `group_size` windows (answer window first); `features` holds them
    group by group.
    """

    features: list[QAFeature]
    questions: int
    pad_token_id: int
    group_size: int = 1

    def __post_init__(self) -> None:
        """Shared normalisation's target is in a group's first window: refuse groups whose first has no answer."""
        if self.group_size > 1:
            for index in range(self.examples):
                first = self.windows(index)[0]
                if not first.has_answer:
                    raise DilstoreError(
                        f"shared-normalisation group {index} (question {first.example_id!r}): its first window "
                        "must hold the answer"
                    )

    @property
    def examples(self) -> int:
        """How many training examples (windows, or question groups) there are."""
        return len(self.features) // self.group_size

    def windows(self, index: int) -> list[QAFeature]:
        """The windows of example `index`."""
        return self.features[index * self.group_size : (index + 1) * self.group_size]

    def lengths(self, measure: str = "longest") -> list[int]:
        """Tokens per example for length-grouped batching: question plus window of its longest window, or with
        `measure` "sum" summed over its windows (GROUP_LENGTHS). A one-window example measures the same either way.
        """
        combine = max if measure == "longest" else sum
        return [
            combine(len(feature.question) + len(feature.passage) for feature in self.windows(index))
            for index in range(self.examples)
        ]

    def collate(self, indices: Sequence[int]) -> QABatch:
        """The padded batch of the examples at `indices`, their windows group by group."""
        return collate_features([feature for i in indices for feature in self.windows(i)], self.pad_token_id)


def load_training_data(
    tokenizer: PreTrainedTokenizerBase,
    train_file: Path,
    config: TrainingConfig,
    examples: Sequence[SquadExample] | None = None,
) -> TrainingData:
    """SQuAD training questions (the first `train_limit` when set) as labelled windows or shared-norm groups.

    `examples`: those questions as `training_questions` already read them from `train_file` (`train qa` reads them
    before torch loads), so that a large file is not read twice.
    """
    if examples is None:
        examples = training_questions(train_file, config.train_limit)
    pad = pad_id(tokenizer)
    if config.shared_norm is None:
        return TrainingData(window_features(tokenizer, examples, config), len(examples), pad)
    triples = Path(config.shared_norm)
    require_written_together(triples, triples.parent / PARAGRAPHS_FILE)  # review46 L1
    groups = shared_norm_groups(
        tokenizer, examples, triples, triples.parent / PARAGRAPHS_FILE, config.shared_norm_negatives, config
    )
    features = [feature for group in groups for feature in group]
    return TrainingData(features, len(examples), pad, group_size=1 + config.shared_norm_negatives)


@dataclass(frozen=True)
class TrainingResult:
    """What a run did: the budget actually spent and where the model is."""

    output: Path
    layers: int
    steps: int
    total_steps: int
    features_seen: int
    train_features: int
    train_questions: int
    train_seconds: float
    final_loss: float
    losses: list[float] = field(repr=False)
    reader: DilBertReader = field(repr=False, compare=False)


def qa_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, start_targets: torch.Tensor, end_targets: torch.Tensor
) -> torch.Tensor:
    """Mean of start and end cross-entropies; logits (b, nq+np), targets (b,) indices into the concatenation."""
    start = torch.nn.functional.cross_entropy(start_logits.float(), start_targets)
    end = torch.nn.functional.cross_entropy(end_logits.float(), end_targets)
    return (start + end) / 2


def shared_norm_loss(
    start_logits: torch.Tensor, end_logits: torch.Tensor, batch: QABatch, group_size: int
) -> torch.Tensor:
    """Mean of start and end cross-entropies, each over one softmax across the passage tokens of a whole group.

    Logits (b·g, nq+np) hold b groups of g windows, answer window first;
    only passage tokens (not the question, not padding) compete, and the
    target is the answer's position in the group's first window, which
    must hold the answer (TrainingData checks it once, so that no step
    waits on the device to check it again).
    """
    groups = start_logits.shape[0] // group_size
    passage = torch.cat([torch.zeros_like(batch.question_mask), batch.passage_mask], dim=1).bool()  # (b·g, nq+np)
    targets = (batch.start_targets[::group_size], batch.end_targets[::group_size])  # (b,) each, in window 0
    losses = []
    for logits, target in zip((start_logits, end_logits), targets, strict=True):
        masked = logits.float().masked_fill(~passage, torch.finfo(torch.float32).min)  # (b·g, nq+np)
        losses.append(torch.nn.functional.cross_entropy(masked.reshape(groups, -1), target))  # over (b, g·(nq+np))
    return (losses[0] + losses[1]) / 2


@dataclass(frozen=True)
class Distillation:
    """A frozen teacher and the distillation settings: temperature T, logit weight alpha, layer weight beta."""

    teacher: DilBertReader
    temperature: float
    alpha: float
    beta: float


def distillation_loss(
    student_logits: tuple[torch.Tensor, torch.Tensor],
    teacher_logits: tuple[torch.Tensor, torch.Tensor],
    temperature: float,
) -> torch.Tensor:
    """T^2 * KL(teacher || student) at temperature T, the mean over the start and end distributions.

    Each logits tensor is (b, nq+np) over the same concatenation; padded
    positions hold the dtype's minimum in both, so they carry no mass.
    """
    losses = []
    for student, teacher in zip(student_logits, teacher_logits, strict=True):
        student_log = torch.log_softmax(student.float() / temperature, dim=-1)  # (b, nq + np)
        teacher_log = torch.log_softmax(teacher.float() / temperature, dim=-1)  # (b, nq + np)
        losses.append(
            torch.nn.functional.kl_div(student_log, teacher_log, log_target=True, reduction="batchmean")
        )
    return temperature**2 * (losses[0] + losses[1]) / 2


def representation_loss(
    student_states: Sequence[torch.Tensor], teacher_states: Sequence[torch.Tensor], mask: torch.Tensor
) -> torch.Tensor:
    """Mean over the given layers of the squared distance between matching states, per valid token and dimension.

    States are (b, n, d) each, the same layers in the same order; mask (b, n) is 1 on valid tokens.
    """
    valid = mask.to(torch.float32)[..., None]  # (b, n, 1)
    count = valid.sum() * student_states[0].shape[-1]
    distances = [
        (((student.float() - teacher.float()) ** 2) * valid).sum() / count
        for student, teacher in zip(student_states, teacher_states, strict=True)
    ]
    return torch.stack(distances).mean()


def _other_inputs(config: TrainingConfig) -> dict[str, str]:
    """The files a run reads besides its base and --train, by name: their SHA-256 is recorded, so --resume refuses
    a teacher or shared-norm triples changed in place (the paths alone were compared, and moving them was refused)."""
    inputs = {}
    if config.shared_norm is not None:
        inputs["shared_norm_triples"] = str(Path(config.shared_norm))
        inputs["shared_norm_paragraphs"] = str(Path(config.shared_norm).parent / PARAGRAPHS_FILE)
    if config.teacher is not None:
        inputs["teacher"] = str(Path(config.teacher))
    return inputs


def load_teacher(path: Path, student: DilBertReader, device: torch.device) -> DilBertReader:
    """The frozen teacher reader at `path`, checked to be comparable with `student` (same depth, k no larger), whose
    online layers (k+1..l) distillation matches: a student with none (k = l) is refused."""
    if student.layers >= student.num_layers:
        raise DilstoreError(
            f"--teacher: the student has k={student.layers} of {student.num_layers} layers, none online, and "
            "distillation matches the online layers' states; give --layers below the model's layer count"
        )
    require_trained_reader(path, f"--teacher {path}")
    teacher = DilBertReader.from_pretrained(path)
    if teacher.num_layers != student.num_layers or teacher.hidden_size != student.hidden_size:
        raise DilstoreError(
            f"teacher {path} has {teacher.num_layers} layers of width {teacher.hidden_size}; the student has "
            f"{student.num_layers} of width {student.hidden_size}: distillation needs the same shape"
        )
    if teacher.layers > student.layers:
        raise DilstoreError(
            f"teacher {path} has k={teacher.layers}, more than the student's k={student.layers}; "
            "distil from a reader with at most as many non-interaction layers (usually k=0)"
        )
    if teacher.tokenizer.get_vocab() != student.tokenizer.get_vocab():
        raise DilstoreError(f"teacher {path} has another vocabulary than the student")
    teacher.to(device).eval().requires_grad_(False)
    return teacher


def train_qa(
    model_dir: Path,
    train_file: Path,
    output_dir: Path,
    config: TrainingConfig,
    *,
    command: str,
    resume: bool = False,
    device: str | torch.device | None = None,
    progress: bool = True,
    examples: Sequence[SquadExample] | None = None,
) -> TrainingResult:
    """Fine-tune the reader at `model_dir` (a base model or a reader) with k=config.layers; save to `output_dir`.

    With `resume`, the run continues from its newest checkpoint (runs.start_run). `examples`: the questions of
    `train_file` as `training_questions` read them, when the caller already did (load_training_data).
    """
    start = start_run(output_dir, config, resume=resume, device=device)
    reader = DilBertReader.from_pretrained(start.resume_from or model_dir, layers=config.layers)
    require_segment_limit(reader.model.config, config.max_seq_length, "window", "--max-seq-length")
    data = load_training_data(reader.tokenizer, Path(train_file), config, examples)
    lower_cache = _frozen_lower_layers(reader, data, config, start) if config.freeze_lower else None
    distillation = None
    if config.teacher is not None:
        teacher = load_teacher(Path(config.teacher), reader, start.device)
        distillation = Distillation(
            teacher, config.distillation_temperature, config.distillation_weight, config.representation_weight
        )
    if config.compile:
        reader.compile_layers()
    lengths = data.lengths(config.group_length) if config.group_by_length else None
    run = TrainerRun(
        model=reader,
        num_examples=data.examples,
        step_plan=optimizer_step_batches(data.examples, config, lengths),
        accumulate=partial(
            accumulate_gradients, reader, data, device=start.device, distillation=distillation, lower_cache=lower_cache,
            chunk_windows=default_chunk_windows(start.device) if config.chunk_windows is None else config.chunk_windows,
        ),
        throughput=_throughput(data.group_size),
        identity={"kind": "dilbert-qa", "layers": reader.layers, "num_layers": reader.num_layers},
        inputs={"base_model": str(Path(model_dir)), "train_file": str(Path(train_file)), **_other_inputs(config)},
        counts=lambda position: {
            "features_seen": position.features_seen,
            "train_features": data.examples,
            "train_questions": data.questions,
            "windows_per_example": data.group_size,
            **({} if lower_cache is None else lower_cache.sizes),
        },
    )
    outcome = finish_run(start, run, config, command=command, progress=progress)
    return TrainingResult(
        output=start.output_dir,
        layers=reader.layers,
        steps=outcome.position.step,
        total_steps=outcome.total_steps,
        features_seen=outcome.position.features_seen,
        train_features=data.examples,
        train_questions=data.questions,
        train_seconds=outcome.position.train_seconds,
        final_loss=outcome.final_loss,
        losses=outcome.losses,
        reader=reader,
    )


def _frozen_lower_layers(reader: DilBertReader, data: TrainingData, config: TrainingConfig, start: RunStart
                         ) -> LowerStateCache:  # fmt: skip
    """--freeze-lower: layers 1..k frozen, and the cache of each window's layer-k states; with --store-encoding
    those states make the round trip through the store's encoding (its codebook trained or given)."""
    freeze_lower_layers(reader)
    round_trip = None
    if config.store_encoding is not None:
        # Imported here: the codebook needs zarr, which a training-only machine (the lent GPU) may lack.
        from dilstore.reader.training.store_codec import training_round_trip

        round_trip = training_round_trip(
            reader.to(start.device), [feature.passage.token_ids for feature in data.features],
            config.store_encoding, None if config.codebook is None else Path(config.codebook),
            start.output_dir, start.device, resume=start.resume_from is not None,
        )  # fmt: skip
    return LowerStateCache(reader, round_trip)


def accumulate_gradients(
    reader: DilBertReader,
    data: TrainingData,
    micro_batches: Sequence[Sequence[int]],
    device: torch.device,
    dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
    distillation: Distillation | None = None,
    lower_cache: LowerStateCache | None = None,
    chunk_windows: int = 0,
) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches, adding into `.grad`; returns the mean loss ().

    With `distillation`, the loss adds its terms (module docstring) to the span cross-entropy; with
    shared normalisation (groups of more than one window) that cross-entropy is shared_norm_loss.
    With `lower_cache` (frozen lower layers) the student starts from its cached layer-k states.
    With `chunk_windows` > 0, each micro-batch's windows run in length-sorted chunks of at most that many
    (reader/training/length_chunks.py): the same losses, less padding computed.
    """

    def student(features: Sequence[QAFeature], batch: QABatch) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        if lower_cache is None:
            return reader.forward_with_states(*_inputs(batch))  # (b, nq + np) ×2, states
        question_states, passage_states = lower_cache.states(features, batch)  # (b, nq, d), (b, np, d)
        return reader.forward_from_states(question_states, batch.question_mask, passage_states, batch.passage_mask)

    def run(
        forward: ChunkForward, features: Sequence[QAFeature], batch: QABatch, with_states: bool
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        if chunk_windows == 0:
            return forward(features, batch)
        return forward_in_chunks(forward, features, batch, data.pad_token_id, chunk_windows, with_states)

    def micro_batch_loss(indices: Sequence[int]) -> torch.Tensor:
        batch = data.collate(indices).to(device)
        features = [feature for index in indices for feature in data.windows(index)]
        with autocast_context(device, dtype):
            start_logits, end_logits, states = run(student, features, batch, with_states=distillation is not None)
        if data.group_size > 1:
            loss = shared_norm_loss(start_logits, end_logits, batch, data.group_size)
        else:
            loss = qa_loss(start_logits, end_logits, batch.start_targets, batch.end_targets)
        if distillation is None:
            return loss
        teacher = distillation.teacher
        with torch.no_grad(), autocast_context(device, dtype):
            teacher_start, teacher_end, teacher_states = run(
                lambda _, part: teacher.forward_with_states(*_inputs(part)), features, batch, with_states=True
            )
        mask = torch.cat([batch.question_mask, batch.passage_mask], dim=1)  # (b, nq + np)
        upper = reader.num_layers - reader.layers  # layer outputs k+1..l, the last `upper` states of each
        return (
            loss
            + distillation.alpha
            * distillation_loss((start_logits, end_logits), (teacher_start, teacher_end), distillation.temperature)
            + distillation.beta
            * representation_loss(states[len(states) - upper :], teacher_states[len(teacher_states) - upper :], mask)
        )

    return accumulate_micro_batches(micro_batches, micro_batch_loss, scaler)


def _inputs(batch: QABatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch's question ids and mask, passage ids and mask: the reader's forward arguments."""
    return batch.question_ids, batch.question_mask, batch.passage_ids, batch.passage_mask
