"""The trainable rankers by kind: start one from a base encoder, or load a trained one by its dilstore.json.

    earl           reader/modeling/earl.py          EARL (MORES): query module, judger blocks, offline document module
    cross-encoder  reader/modeling/cross_encoder.py the BERT ranker baseline over `[CLS] q [SEP] d [SEP]`
    siamese        reader/modeling/siamese.py       the BERT-Siamese baseline: mean-pooled embeddings, dot product
    listformer     reader/modeling/listformer.py    the listwise Listformer: a query and its whole list in one pass
"""

from __future__ import annotations

from pathlib import Path

from dilstore.reader.modeling.checkpoints import require_checkpoint_dir, trained_metadata
from dilstore.reader.modeling.cross_encoder import CrossEncoderRanker
from dilstore.reader.modeling.earl import EarlConfig, EarlRanker
from dilstore.reader.modeling.listformer import ListformerConfig, ListformerRanker
from dilstore.reader.modeling.ranker_base import RankerBase
from dilstore.reader.modeling.ranking_inputs import RANKER_KINDS
from dilstore.reader.modeling.siamese import SiameseRanker
from dilstore.storage.errors import DilstoreError

_CLASSES = {
    "earl": EarlRanker,
    "cross-encoder": CrossEncoderRanker,
    "siamese": SiameseRanker,
    "listformer": ListformerRanker,
}


def require_kind(kind: str) -> None:
    """A DilstoreError naming the ranker kinds unless `kind` is one of them."""
    if kind not in RANKER_KINDS:
        raise DilstoreError(f"unknown ranker kind {kind!r}; the kinds are {', '.join(RANKER_KINDS)}")


def new_ranker(
    kind: str,
    base: str | Path,
    earl: EarlConfig = EarlConfig(),
    listformer: ListformerConfig = ListformerConfig(),
) -> RankerBase:
    """A ranker of `kind` initialised from the plain encoder directory `base` (EARL: the paper's initialisation).

    `earl` is the EARL variant and `listformer` the Listformer's (its
    delayed layers k); every other kind ignores them.
    """
    require_kind(kind)
    if kind == "earl":
        return EarlRanker.from_base(base, earl)
    if kind == "listformer":
        return ListformerRanker.from_base(base, listformer)
    return _CLASSES[kind].from_base(base)


def load_ranker(path: str | Path) -> RankerBase:
    """A trained ranker of whichever kind the checkpoint's dilstore.json names (eval mode)."""
    return _CLASSES[checkpoint_kind(path)].from_pretrained(path)


def checkpoint_kind(path: str | Path) -> str:
    """The ranker kind a checkpoint directory holds; a DilstoreError for a base encoder or another kind."""
    directory = require_checkpoint_dir(Path(path))
    kinds = ", ".join(RANKER_KINDS)
    return trained_metadata(
        directory, RANKER_KINDS, f", not a ranker ({kinds})", f", not a trained ranker (kinds: {kinds})"
    ).kind
