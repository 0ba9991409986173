"""Command-line options shared by `train qa` and `train earl|cross-encoder|siamese`, and what they become.

The two commands add them at different places among their own options (the
order shows in --help and in the recorded command), hence one function per group.
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dilstore.runners.arg_types import option_words
from dilstore.runners.outputs import check_output_folder, is_store, refuse_store_inside_store
from dilstore.runners.reading_options import add_runtime_arguments
from dilstore.runners.stop_signals import interrupt_number, interrupt_words
from dilstore.storage.errors import DilstoreError, StoppedBySignal
from dilstore.storage.write_lock import write_lock

# Options that describe how the command was launched, not what it computes; --resume too: the recorded command (a
# model card's) is the one that trains the run from its start, which --resume would refuse for want of a checkpoint.
_NOT_IN_COMMAND = {"command", "train_command", "run", "run_name", "resume"}


def add_optimizer_arguments(
    parser: argparse.ArgumentParser, *, passes_over: str, epochs: int, batch_of: str, batch_size: int
) -> None:
    """--epochs to --weight-decay: the budget, the batches and the AdamW schedule.

    `passes_over` and `batch_of` name what the command trains on (e.g.
    "training windows" and "windows"); `epochs` and `batch_size` are its defaults.
    """
    parser.add_argument("--epochs", type=int, default=epochs, help=f"passes over the {passes_over} (default {epochs})")
    parser.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (at most --epochs passes)")
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help=f"{batch_of} per micro-batch (default {batch_size})"
    )
    parser.add_argument(
        "--gradient-accumulation-steps", type=int, default=1, help="micro-batches per optimizer step (default 1)"
    )
    parser.add_argument("--learning-rate", type=float, default=3e-5, help="peak AdamW learning rate (default 3e-5)")
    parser.add_argument("--warmup-ratio", type=float, default=0.1, help="share of steps warming up (default 0.1)")
    parser.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (default 0.01)")


def add_run_arguments(parser: argparse.ArgumentParser, *, seeded: str, limit_of: str) -> None:
    """--seed to --train-limit: the seed, periodic checkpoints, logging, precision, and a cap on the data.

    `seeded` says what the seed decides; `limit_of` names what --train-limit counts.
    """
    parser.add_argument("--seed", type=int, default=42, help=f"seed of {seeded} (default 42)")
    parser.add_argument(
        "--save-every", type=int, default=0, help="resumable checkpoint every N steps (default 0: none by steps)"
    )
    parser.add_argument(
        "--save-every-minutes", type=float, default=10.0,
        help="also a resumable checkpoint whenever M minutes of training passed since the last (0: not by time; "
        "default 10), so a killed run loses at most M minutes",
    )  # fmt: skip
    parser.add_argument(
        "--keep-checkpoints", type=int, default=2,
        help="periodic checkpoints kept (default 2); with --save-every, those at its multiples, and a checkpoint "
        "taken by time only until a newer one exists",
    )  # fmt: skip
    parser.add_argument("--log-every", type=int, default=10, help="log a progress line every N steps (default 10)")
    parser.add_argument(
        "--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
        help="auto: fp32 on CPU, bf16 (else fp16) autocast on CUDA; bf16 autocast on a CPU too when asked (faster "
        "where it has AVX512-BF16 or AMX); fp16 needs CUDA",
    )  # fmt: skip
    parser.add_argument("--train-limit", type=int, help=f"use only the first N {limit_of}")


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """--device to --json, the last options of every training command: where it runs and how it reports."""
    add_runtime_arguments(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    parser.add_argument("--json", action="store_true", help="print the run summary as JSON (no progress bar)")


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The training-config fields the options of add_optimizer_arguments and add_run_arguments set."""
    return {
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "batch_size": args.batch_size,
        "gradient_accumulation": args.gradient_accumulation_steps,
        "learning_rate": args.learning_rate,
        "warmup_ratio": args.warmup_ratio,
        "weight_decay": args.weight_decay,
        "seed": args.seed,
        "save_every": args.save_every,
        "save_every_minutes": args.save_every_minutes,
        "keep_checkpoints": args.keep_checkpoints,
        "log_every": args.log_every,
        "precision": args.precision,
        "train_limit": args.train_limit,
    }


def require_start_model(model: Path | None, resume: bool) -> None:
    """A DilstoreError naming the model folder a new run starts from (--model, --base-model) unless it is a checkpoint
    folder: named before torch and transformers load, where `train qa --model MISSING` waited 5-6 s for them (left61
    F1). A resumed run starts from its own checkpoint and reads no such folder, so `resume` checks nothing."""
    if model is not None and not resume:
        from dilstore.reader.modeling.checkpoints import require_checkpoint_dir

        require_checkpoint_dir(model)


RUNS_ENV = "DILSTORE_RUNS"  # where runs go without --output (default_runs_dir)


def add_output_argument(parser: argparse.ArgumentParser, run_name: str, shown_as: str) -> None:
    """--output: the run folder, by default RUNS/`run_name` outside the work tree (see default_runs_dir).

    `run_name` is formatted with the parsed options (e.g. "qa-k{layers}"); `shown_as` is how --help writes it.
    """
    parser.add_argument(
        "--output",
        type=Path,
        help=f"run folder: the trained model, its record and periodic checkpoints (default: "
        f"$DILSTORE_RUNS/{shown_as}, with $DILSTORE_RUNS defaulting to ~/.cache/dilstore/runs)",
    )
    parser.set_defaults(run_name=run_name)


def default_runs_dir() -> Path:
    """Where runs go without --output: $DILSTORE_RUNS, else ~/.cache/dilstore/runs, outside any work tree.

    Long runs outlive a checkout and its cleaning, and checkpoints never land in a repository.
    """
    configured = os.environ.get(RUNS_ENV)
    try:
        return Path(configured).expanduser() if configured else Path.home() / ".cache" / "dilstore" / "runs"
    except RuntimeError:  # ~USER of no user; no HOME and no user entry (a container's uid): a traceback (env57 F3)
        why = (f"{RUNS_ENV}={configured}: {configured.split('/')[0]} is no user's home folder" if configured else
               "there is no home folder for the default run folder ($HOME is unset and this user has none)")
        raise DilstoreError(f"{why}; give --output DIR, or set {RUNS_ENV} to a folder") from None


def output_dir(args: argparse.Namespace) -> Path:
    """The run folder: --output, or the default one named by the command and its k or kind."""
    return args.output if args.output is not None else default_runs_dir() / args.run_name.format(**vars(args))


def duration(seconds: float) -> str:
    """Seconds as a summary line shows them: `2.8 s` under a minute (a short run read `0.0 min`), else `12.3 min`."""
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def resume_hint(args: argparse.Namespace, output: Path) -> str:
    """Where a stopped training run goes on from: its newest checkpoint, or the start when it saved none, or
    nowhere when the final model was saved (each was told "--resume goes on", which --resume then refused); a
    reader whose --dev evaluation the stop cut is told the evaluate-rc command that scores it as that would."""
    from dilstore.reader.modeling.checkpoints import TRAINING_METADATA_FILE, read_metadata
    from dilstore.reader.training.checkpoint_files import CHECKPOINTS_DIR, latest_checkpoint

    if (output / TRAINING_METADATA_FILE).is_file():  # the stop cut what comes after the final save
        metadata = read_metadata(output)
        dev = getattr(args, "dev", None)
        scored = (f" (`{dev_evaluation(args, output)}` scores it)"
                  if dev is not None and metadata is not None and metadata.kind == "dilbert" else "")  # fmt: skip
        return f"the trained model is saved in {output}; only what comes after it was cut{scored}"
    if latest_checkpoint(output / CHECKPOINTS_DIR) is None:
        return "no checkpoint was saved yet: run the command again, without --resume"
    return "the run folder keeps what was saved before it (--resume goes on from its newest checkpoint)"


def dev_evaluation(args: argparse.Namespace, output: Path) -> str:
    """The `dilstore evaluate-rc` command that scores the reader in `output` as `train qa`'s --dev evaluation does:
    its dev file, reading windows, answer length and subset (train46 F1: the hint left out --max-answer-length
    and the subset, and said DEV.json)."""
    reading = {name: getattr(args, name) for name in
               ("max_seq_length", "doc_stride", "max_question_length", "max_answer_length")}  # fmt: skip
    subset = {"limit": args.eval_limit, "seed": args.eval_seed if args.eval_limit is not None else None}
    words = ["dilstore", "evaluate-rc", "--model", str(output), "--data", str(args.dev)]
    return shlex.join([*words, *option_words(reading), *option_words(subset)])


def holding_the_output(
    run: Callable[[argparse.Namespace], int], on_stop: Callable[[argparse.Namespace, Path], str] = resume_hint
) -> Callable[[argparse.Namespace], int]:
    """`run` with the run folder's write lock held throughout: a second training into it stops at once.

    An --output that is a file is refused first, by name (the lock and mkdir
    said only "File exists"), and so is one that is or lies in a store (its
    files showed in the store's `verify` as untracked). Ctrl-C, SIGTERM or SIGHUP outside the training
    loop's steps (which finish their step and checkpoint it), while the data
    loads or the --dev evaluation runs, stops the command with one line that
    adds `on_stop(args, output)`: where the run goes on from.
    """

    @functools.wraps(run)
    def locked(args: argparse.Namespace) -> int:
        output = output_dir(args)
        started = False
        try:
            flag = "--output" if args.output is not None else "run folder"
            check_output_folder(output, flag)
            if is_store(output):
                raise DilstoreError(f"{flag} {output} is a store; put the run folder elsewhere")
            refuse_store_inside_store(output, flag, "the run folder")
            with write_lock(output):
                started = True
                return run(args)
        except KeyboardInterrupt as stop:
            raise StoppedBySignal(f"{interrupt_words(stop)}{_hint(on_stop, args, output)}",
                                  interrupt_number(stop)) from None  # fmt: skip
        except (DilstoreError, OSError) as error:
            if started or args.output is not None:
                raise
            raise default_folder_error(error) from None

    return locked


def default_folder_error(error: DilstoreError | OSError) -> DilstoreError:
    """`error`, met in making the default run folder (no --output) or taking its lock, with where that folder comes
    from and how to choose another: under a read-only or missing HOME (a container, a batch job), `train` said only
    that ~/.cache/dilstore/runs must be writable, a folder the user never named, and with DILSTORE_RUNS set to a file
    it blamed an `--output` that was not given (env57 F3)."""
    source = f"${RUNS_ENV}" if os.environ.get(RUNS_ENV) else f"~/.cache/dilstore/runs (${RUNS_ENV} is unset)"
    words = str(error) if isinstance(error, DilstoreError) else f"{error.strerror or error}: {error.filename}"
    return DilstoreError(f"{words} (the default run folder, in {source}: give --output DIR, or set {RUNS_ENV} to a "
                         "writable folder)")  # fmt: skip


def _hint(on_stop: Callable[[argparse.Namespace, Path], str], args: argparse.Namespace, output: Path) -> str:
    """`; on_stop(args, output)`, or nothing when it fails: the stop's own line comes first."""
    try:
        return f"; {on_stop(args, output)}"
    except Exception:  # noqa: BLE001 (a stop mid-import can leave any module half-made)
        return ""


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments train_qa and train_ranker take from the command line besides data and config."""
    return {
        "command": canonical_command(args),
        "resume": args.resume,
        "device": args.device,
        "progress": shows_progress(args),
    }


def shows_progress(args: argparse.Namespace) -> bool:
    """Whether a training command draws progress bars on stderr: not with --no-progress, nor with --json, as for
    every other command (tail61 F3: `train ... --json` drew them, where index, compact, verify and evaluate-* did
    not)."""
    return not (args.no_progress or args.json)


def canonical_command(args: argparse.Namespace) -> str:
    """The full command with every option spelled out, defaults included, so the run can be repeated."""
    options = {name: value for name, value in vars(args).items() if name not in _NOT_IN_COMMAND}
    return shlex.join(["dilstore", "train", args.train_command, *option_words(options)])
