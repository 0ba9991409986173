"""The offline half of precompute as plain functions: passages → tokens → offline states → records.

Pipelines call these per shard; nothing here knows about Beam. One code path
serves every store kind; what differs per kind (the model, the token
convention, the offline half) comes from `reader.offline.kinds` (`OFFLINE_KINDS`).

- **Tokenizing.** Each kind's stored unit (`p [SEP]` for dilbert, `d [SEP]`
  for listformer, both through `encode_passage`; `[CLS] d [SEP]` for the EARL
  kinds, `encode_document_windows`) is listed in reader.offline.kinds; either
  way its stored states never depend on a question. Pipelines tokenize before
  grouping by shard, so that each window of a long passage is its own stored
  unit.
- **Long passages (the documented rule).** A passage longer than `max_length`
  tokens in its kind's convention is split into overlapping windows, each at
  most `max_length` tokens in that convention (`p_window [SEP]`, or
  `[CLS] d_window [SEP]` for EARL). Nothing is truncated away: window 0 keeps
  the passage id, window w ≥ 1 gets the id `{passage_id}~{w}`; each window's
  text is the slice of the passage text its tokens cover, and its character
  spans point into that slice. Every such passage is counted (`long_passages`).
- **Batching.** Passages are sorted by token count and cut into batches whose
  padded size stays under a token budget (reader/batching.py), so a batch
  pads only to its own longest passage. Encoding runs under `torch.inference_mode`.
- **Loading.** `load_reader` loads a model afresh and `load_checked_reader`
  also checks it against the run's fingerprint; neither caches. Whoever holds
  the model decides how long it lives: the launcher for the run's setup, and
  in Beam the DoFns, which load it in `setup()` once per worker process
  (pipelines/precompute.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from dilstore.reader.batching import BatchPolicy, length_batches, pad_id, pad_token_ids
from dilstore.reader.modeling.checkpoints import BASE_MODEL_REF as BASE_MODEL_REF  # re-exported: model references
from dilstore.reader.modeling.fingerprint import model_fingerprint
from dilstore.reader.offline.kinds import OfflineModel, load_offline_model, offline_kind
from dilstore.reader.offline.model_refs import resolve_model_dir
from dilstore.reader.text.tokenization import TokenizedText
from dilstore.reader.threads import start_thread_pool
from dilstore.storage.errors import DilstoreError
from dilstore.storage.fingerprint import Fingerprint
from dilstore.storage.passage_files import WINDOW_ID_SEPARATOR, PassageRow
from dilstore.storage.records import PassageRecord

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

@dataclass(frozen=True)
class TokenizedPassage:
    """One stored unit: a passage, or one window of a long passage (`window_id`), with its tokens."""

    id: str
    doc_id: str
    title: str
    text: str
    tokens: TokenizedText

    @property
    def length(self) -> int:
        return int(self.tokens.token_ids.shape[0])


def load_reader(model: str, kind: str, layers: int | None) -> OfflineModel:
    """The model that makes `kind` stores from (model reference, split), loaded from disk.

    `layers` is k for dilbert and N for the EARL kinds (None: the
    checkpoint's own); `reader.offline.kinds.load_offline_model` refuses a
    checkpoint of the wrong kind before loading any weight.
    """
    return load_offline_model(resolve_model_dir(model), kind, layers)


# The model a run's launch loaded and fingerprinted, by that fingerprint, while the run lasts (`launched_models`):
# in the launcher's own process (one worker, a codebook's sample) the run takes that very object, where it loaded
# and fingerprinted the model again (perf49 F5; a profile put that at 0.7 s, though a 300-passage run's time did not
# move beyond noise). Other processes load their own.
_LAUNCHED: dict[Fingerprint, OfflineModel] | None = None  # None outside a run's block


@contextmanager
def launched_models() -> Iterator[None]:
    """A run's block: the model its launch fingerprints (`keep_launched`) is the one `load_checked_reader` gives in
    this process; none outlives the block."""
    global _LAUNCHED
    _LAUNCHED = {}
    try:
        yield
    finally:
        _LAUNCHED = None


def keep_launched(reader: OfflineModel, fingerprint: Fingerprint) -> None:
    """Keep the model a launch fingerprinted for the run's own loads in this process, inside a `launched_models`
    block (elsewhere nothing is kept)."""
    if _LAUNCHED is not None:
        _LAUNCHED[fingerprint] = reader


def load_checked_reader(model: str, layers: int, expected: Fingerprint) -> OfflineModel:
    """`load_reader` for the run's kind, refusing a model whose fingerprint differs from the run's; in the process
    that launched the run, the model it fingerprinted (`launched_models`).

    Guards a long run against a model that changed on disk, or a worker that
    resolved a different copy, between the launch and this worker's start.
    """
    if _LAUNCHED is not None and expected in _LAUNCHED:
        return _LAUNCHED[expected]
    reader = load_reader(model, expected.kind, layers)
    actual = model_fingerprint(reader, expected.kind, expected.encoding, expected.max_length)
    if actual != expected:
        raise DilstoreError(
            f"the model at {resolve_model_dir(model)} does not match the fingerprint this run started with; "
            "was it replaced during the run?"
        )
    return reader


def set_threads(threads: int) -> None:
    """Use `threads` intra-op threads for torch in this process, started now (`start_thread_pool`), before the
    worker's model loads."""
    if threads < 1:
        raise DilstoreError(f"threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)
    start_thread_pool()


def window_id(passage_id: str, window: int) -> str:
    """The stored id of window `window` of a long passage (window 0 keeps the passage id)."""
    return passage_id if window == 0 else f"{passage_id}{WINDOW_ID_SEPARATOR}{window}"


def _window_text(text: str, tokens: TokenizedText) -> tuple[str, TokenizedText]:
    """The slice of `text` a window's tokens cover, and the window with spans into that slice."""
    spans = tokens.char_spans  # (n, 2)
    real = spans[:, 0] >= 0  # (n,) special tokens have (-1, -1)
    if not real.any():
        return "", tokens
    start, end = int(spans[real, 0].min()), int(spans[real, 1].max())
    shifted = np.where(real[:, None], spans - start, spans).astype(np.int32)  # (n, 2)
    return text[start:end], TokenizedText(token_ids=tokens.token_ids, char_spans=shifted)


def tokenize_passage(
    tokenizer: PreTrainedTokenizerBase, passage: PassageRow, max_length: int, kind: str
) -> list[TokenizedPassage]:
    """One passage in `kind`'s token convention, split into windows when longer than `max_length` (module rule).

    Raises DilstoreError when the text has no word piece at all (the caller dead-letters it).
    """
    windows = offline_kind(kind).windows(tokenizer, passage.text, max_length)
    if len(windows) == 1:
        return [TokenizedPassage(passage.id, passage.doc_id, passage.title, passage.text, windows[0])]
    pieces = []
    for number, window in enumerate(windows):
        text, tokens = _window_text(passage.text, window)
        pieces.append(
            TokenizedPassage(window_id(passage.id, number), passage.doc_id, passage.title, text, tokens)
        )
    return pieces


def encode_batch(
    reader: OfflineModel, kind: str, sequences: Sequence[np.ndarray]
) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """`kind`'s offline states for a batch of token id arrays, each (n_i, *state_shape) float32 without padding,
    and each passage's float32 vector (d,) when the model stores them (an EARL prior ranker), else None.

    The state shape is the model's: (d,) for dilbert and earl-s1, (M, 2, d) for earl-s2.
    """
    ids, mask = pad_token_ids(sequences, pad_id(reader.tokenizer))  # (b, n), (b, n)
    with torch.inference_mode():
        states, vectors = offline_kind(kind).states(reader, ids, mask)  # (b, n, *S), (b, d) or None
    states = states.to(torch.float32).numpy()  # (b, n, *S)
    per_passage = [np.ascontiguousarray(states[row, : sequence.shape[0]]) for row, sequence in enumerate(sequences)]
    return per_passage, None if vectors is None else list(vectors.to(torch.float32).numpy())


def encode_tokenized(
    reader: OfflineModel,
    kind: str,
    pieces: Sequence[TokenizedPassage],
    policy: BatchPolicy = BatchPolicy(),
    on_batch: Callable[[int], None] | None = None,
) -> list[PassageRecord]:
    """Encode tokenized passages into `kind` states in length-bucketed batches; `PassageRecord`s in the order given.

    `on_batch(n)` is called after each batch with the number of passages
    finished so far, for progress reporting.
    """
    states: list[np.ndarray | None] = [None] * len(pieces)
    vectors: list[np.ndarray | None] = [None] * len(pieces)
    finished = 0
    for batch in length_batches([piece.length for piece in pieces], policy):
        outputs, batch_vectors = encode_batch(reader, kind, [pieces[index].tokens.token_ids for index in batch])
        for position, (index, output) in enumerate(zip(batch, outputs, strict=True)):
            states[index] = output
            vectors[index] = None if batch_vectors is None else batch_vectors[position]
        finished += len(batch)
        if on_batch is not None:
            on_batch(finished)
    return [
        PassageRecord(
            id=piece.id,
            title=piece.title,
            text=piece.text,
            token_ids=piece.tokens.token_ids,
            char_spans=piece.tokens.char_spans,
            states=state,
            vector=vector,
        )
        for piece, state, vector in zip(pieces, states, vectors, strict=True)
    ]
