"""Resumable training state without pickle: tensors in safetensors, the rest in JSON.

A periodic checkpoint is a model directory (the model core's save_pretrained)
plus two files written here: `training_state.safetensors` (AdamW moments and
step counters, and the torch RNG state, with each CUDA device's on a GPU, so
dropout continues where it left off)
and `training_state.json` (optimizer hyperparameters per group, the learning
rate scheduler's state, the loop position, and the SHA-256 of every other file
of the checkpoint, checked before a resume). Restoring both gives the same
weights as a run that was never interrupted.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE
from dilstore.reader.text.files import read_json_object
from dilstore.reader.training.checkpoint_files import STATE_JSON, STATE_TENSORS, STEP_DIR
from dilstore.storage.digests import sha256_file
from dilstore.storage.errors import DilstoreError
from dilstore.storage.file_errors import remove_tree

PARTIAL_SUFFIX = ".partial"  # a checkpoint being written, renamed to its step's name once complete
_RNG_KEY = "rng.torch"
_CUDA_RNG_PREFIX = "rng.cuda."  # then the device index: dropout on a GPU draws from that device's own generator
_CHECKSUMS_KEY = "sha256"
# training_state.json's mark of a checkpoint at a multiple of its run's --save-every: a learning curve's point.
_CURVE_POINT_KEY = "curve_point"


@dataclass(frozen=True)
class LoopPosition:
    """Where the loop stands: optimizer steps done, and the data seen so far."""

    step: int
    features_seen: int
    train_seconds: float


def save_training_state(
    directory: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    position: LoopPosition,
    *,
    curve_point: bool = False,
) -> None:
    """Write optimizer, scheduler, RNG and loop position into `directory` (which must exist).

    `curve_point` marks a checkpoint taken at a multiple of --save-every, so that pruning keeps it as one after a
    resume changed --save-every (prune_checkpoints).
    """
    state = optimizer.state_dict()
    tensors = _rng_states()
    for index, per_param in state["state"].items():
        for name, value in per_param.items():
            tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
    save_file(tensors, Path(directory) / STATE_TENSORS)
    document = {
        "param_groups": state["param_groups"],
        "scheduler": scheduler.state_dict(),
        "position": asdict(position),
        _CURVE_POINT_KEY: curve_point,
        _CHECKSUMS_KEY: _checksums(Path(directory)),
    }
    (Path(directory) / STATE_JSON).write_text(json.dumps(document, indent=1), encoding="utf-8")


def verify_checkpoint(directory: Path) -> None:
    """Raise DilstoreError when a file of the checkpoint no longer has the SHA-256 recorded when it was saved.

    A weight file damaged on disk still loads (safetensors checks only its
    header), and a resumed run would go on from the damaged weights. Checkpoints
    saved before checksums were recorded pass unchecked.
    """
    directory = Path(directory)
    try:
        recorded = json.loads((directory / STATE_JSON).read_text(encoding="utf-8")).get(_CHECKSUMS_KEY, {})
    except (OSError, ValueError, AttributeError):
        return  # load_training_state names a missing or damaged training_state.json
    if not isinstance(recorded, dict):
        raise DilstoreError(f"{directory / STATE_JSON}: its {_CHECKSUMS_KEY!r} entry is not a mapping of file names "
                            "to checksums; move the checkpoint aside to resume from the one before it")  # fmt: skip
    for name, digest in sorted(recorded.items()):
        path = directory / name
        found = sha256_file(path) if path.is_file() else None
        if found != digest:
            what = "is missing" if found is None else "does not match the SHA-256 recorded when it was saved"
            raise DilstoreError(f"{path} {what}: the checkpoint changed or was damaged since; move {directory} "
                                "aside to resume from the checkpoint before it")  # fmt: skip


def _checksums(directory: Path) -> dict[str, str]:
    """{relative path: SHA-256} of every file under `directory` but training_state.json, which records them."""
    return {
        path.relative_to(directory).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != STATE_JSON
    }


def load_training_state(
    directory: Path,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> LoopPosition:
    """Restore what save_training_state wrote into fresh `optimizer` and `scheduler`; returns the position.

    The optimizer must have been built over the same parameters in the same
    order. The torch RNG state is restored last, so call this after every
    module has been built. A file that is missing, cut or edited raises
    DilstoreError naming the checkpoint (an older one may still resume).
    """
    directory = Path(directory)
    try:
        return _restore_training_state(directory, optimizer, scheduler)
    except FileNotFoundError as error:
        raise DilstoreError(f"{directory} is not a resumable training checkpoint ({error.filename} missing)") from error
    except (ValueError, KeyError, TypeError, IndexError, SafetensorError) as error:  # JSONDecodeError is a ValueError
        raise DilstoreError(
            f"{directory} is a damaged training checkpoint ({type(error).__name__}: {error}); "
            "move it aside to resume from the checkpoint before it"
        ) from None


def _restore_training_state(
    directory: Path, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> LoopPosition:
    """load_training_state's work, letting a damaged file's own exception through."""
    document = json.loads((directory / STATE_JSON).read_text(encoding="utf-8"))
    tensors = load_file(directory / STATE_TENSORS)
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key == _RNG_KEY or key.startswith(_CUDA_RNG_PREFIX):
            continue
        _, index, name = key.split(".", 2)
        per_param.setdefault(int(index), {})[name] = value
    groups = [_restore_group(group) for group in document["param_groups"]]
    if len(groups) != len(optimizer.param_groups):
        raise DilstoreError(
            f"{directory / STATE_JSON}: {len(groups)} parameter groups saved, the optimizer has "
            f"{len(optimizer.param_groups)}"
        )
    optimizer.load_state_dict({"state": per_param, "param_groups": groups})
    scheduler.load_state_dict(document["scheduler"])
    _restore_rng_states(tensors)
    return LoopPosition(**document["position"])


def _rng_states() -> dict[str, torch.Tensor]:
    """The torch RNG state, and each CUDA device's while CUDA is in use: a run resumed on a GPU drew other dropout
    masks than one never stopped when only the CPU generator was saved (train52)."""
    states = {_RNG_KEY: torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        devices = torch.cuda.get_rng_state_all()  # one state per device
        states.update({f"{_CUDA_RNG_PREFIX}{index}": state for index, state in enumerate(devices)})
    return states


def _restore_rng_states(tensors: dict[str, torch.Tensor]) -> None:
    """Put back what _rng_states saved. CUDA states are put back where the machine has as many devices; a run
    resumed on a CPU, or on fewer GPUs, draws afresh there, as a change of device changes its arithmetic anyway."""
    torch.set_rng_state(tensors[_RNG_KEY])
    cuda = sorted((int(key.removeprefix(_CUDA_RNG_PREFIX)), value) for key, value in tensors.items()
                  if key.startswith(_CUDA_RNG_PREFIX))  # fmt: skip
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() >= len(cuda):
        torch.cuda.set_rng_state_all([state for _, state in cuda])


def _restore_group(group: dict[str, Any]) -> dict[str, Any]:
    """JSON turned AdamW's `betas` tuple into a list; give it back its type."""
    restored = dict(group)
    if isinstance(restored.get("betas"), list):
        restored["betas"] = tuple(restored["betas"])
    return restored


def remove_partial_checkpoints(checkpoints: Path) -> None:
    """Delete the `step-N.partial` folders a killed checkpoint write left (call it holding the run's lock): each
    holds a model and its optimizer state, and only one of the same step was ever removed."""
    if Path(checkpoints).is_dir():
        for path in Path(checkpoints).iterdir():
            if path.name.endswith(PARTIAL_SUFFIX) and STEP_DIR.match(path.name.removesuffix(PARTIAL_SUFFIX)):
                remove_tree(path, "the unfinished checkpoint a stopped run left")


def prune_checkpoints(checkpoints: Path, keep: int, every: int = 0) -> None:
    """Delete all but the `keep` newest complete periodic checkpoints.

    With `every` > 0, only checkpoints at multiples of `every` steps count
    towards `keep` (they are a learning curve's points), and so do those
    marked as at a multiple of the --save-every of the run's part before a
    resume that changed it; one taken off that grid (by time, to bound what
    a kill loses) is deleted as soon as a newer checkpoint exists, so a long
    run's time checkpoints never push its curve points out.
    """
    complete = sorted(
        (int(match.group(1)), path)
        for path in Path(checkpoints).iterdir()
        if (match := STEP_DIR.match(path.name)) and (path / STATE_JSON).is_file()
    )
    if every <= 0:
        doomed = complete[: max(0, len(complete) - keep)]
    else:
        grid = {step for step, path in complete if step % every == 0 or _marked_curve_point(path, step)}
        on_grid = [entry for entry in complete if entry[0] in grid]
        off_grid = [entry for entry in complete[:-1] if entry[0] not in grid]
        doomed = on_grid[: max(0, len(on_grid) - keep)] + off_grid
    for _, path in doomed:
        remove_tree(path, "an old checkpoint", then="go on with `--resume`")


def _marked_curve_point(checkpoint: Path, step: int) -> bool:
    """Whether the checkpoint's training_state.json marks it as at a multiple of its run's --save-every. One saved
    before checkpoints were marked (no mark) is one where the --save-every its dilstore_training.json records divides
    its step: without that, a resume that changed --save-every deleted them all (review52 F2). False when neither
    file can be read (its step's multiple decides then)."""
    document = _json_object(Path(checkpoint) / STATE_JSON)
    if _CURVE_POINT_KEY in document:
        return document[_CURVE_POINT_KEY] is True
    config = _json_object(Path(checkpoint) / TRAINING_METADATA_FILE).get("config")
    every = config.get("save_every") if isinstance(config, dict) else None
    return type(every) is int and every > 0 and step % every == 0


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; empty when it cannot be read or holds no object (pruning goes on regardless)."""
    try:
        return read_json_object(path)
    except DilstoreError:
        return {}
