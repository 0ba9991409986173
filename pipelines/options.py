"""Turning a runner name and the user's Beam flags into checked PipelineOptions.

`dilstore precompute` takes `--runner NAME` plus any standard Beam flags
(`--project`, `--region`, `--temp_location`, `--setup_file`,
`--flink_master`, `--environment_type`, ...). This module resolves short
runner names, adds local defaults the user did not set (worker count and
multi-processing for the DirectRunner, the cluster address and partition
count for Dask), and refuses, with a message, flags that no Beam option knows
and remote runs that could not work: missing Dataflow project, region or temp
location, or no way to ship the dilstore package to the workers.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, _BeamArgumentParser
from apache_beam.runners.runner import PipelineRunner

from dilstore.storage.cpus import usable_cpu_count
from dilstore.storage.errors import DilstoreError

DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"

_RUNNER_ALIASES = {
    "direct": "DirectRunner",
    "directrunner": "DirectRunner",
    "dask": DASK_RUNNER,
    "daskrunner": DASK_RUNNER,
    DASK_RUNNER.lower(): DASK_RUNNER,
    "dataflow": "DataflowRunner",
    "dataflowrunner": "DataflowRunner",
    "flink": "FlinkRunner",
    "flinkrunner": "FlinkRunner",
    "portable": "PortableRunner",
    "portablerunner": "PortableRunner",
    "fnapi": "FnApiRunner",
    "fnapirunner": "FnApiRunner",
}
# Runners whose workers run on this machine: they get a progress bar and local defaults (and so does a
# PortableRunner with its embedded job server and LOOPBACK workers: `runs_here`).
LOCAL_RUNNERS = frozenset({"DirectRunner", "FnApiRunner", DASK_RUNNER})
# Runners whose job ends with this process: no worker of theirs runs on once it stops (as with Dask on the
# LocalCluster the launcher starts; not with a cluster given by --dask_client_address, maybe another machine's).
IN_PROCESS_RUNNERS = frozenset({"DirectRunner", "FnApiRunner"})
# Runners whose workers run elsewhere and need the dilstore package shipped to them.
REMOTE_RUNNERS = frozenset({"DataflowRunner", "FlinkRunner", "PortableRunner"})
_DATAFLOW_REQUIRED = ("project", "region", "temp_location")
_SHIPPING_OPTIONS = ("setup_file", "requirements_file", "extra_packages", "sdk_container_image")


def canonical_runner(name: str) -> str:
    """The Beam runner name for a short or full name ("dask" → the DaskRunner's import path).

    Raises DilstoreError naming the choices for an unknown runner.
    """
    runner = _RUNNER_ALIASES.get(name.strip().lower())
    if runner is None:
        choices = ("direct, dask, dataflow, flink, portable, fnapi (or by Beam's names: DirectRunner, DaskRunner, "
                   "DataflowRunner, FlinkRunner, PortableRunner, FnApiRunner)")
        raise DilstoreError(f"unknown runner {name!r}; expected one of: {choices}")
    return runner


@dataclass(frozen=True)
class LocalDefaults:
    """Settings the launcher chooses for local runners, used only where the user set nothing.

    workers: DirectRunner worker processes (multi-processing when > 1; the
    workers' own log level defaults to ERROR, since their INFO lines would
    break up the progress bar);
    dask_address: scheduler of the LocalCluster the launcher started, if any;
    dask_partitions: Dask bag partitions for Create (at least the shard count,
    so that shards spread over the Dask workers).
    """

    workers: int = 1
    dask_address: str | None = None
    dask_partitions: int | None = None


def has_flag(flags: Sequence[str], name: str) -> bool:
    """Whether `--name` is among the flags, as `--name VALUE` or `--name=VALUE`."""
    return any(flag == f"--{name}" or flag.startswith(f"--{name}=") for flag in flags)


def flag_value(flags: Sequence[str], name: str) -> str | None:
    """The value of the last `--name VALUE` or `--name=VALUE` among the flags; None without one."""
    value = None
    for index, flag in enumerate(flags):
        if flag == f"--{name}" and index + 1 < len(flags):
            value = flags[index + 1]
        elif flag.startswith(f"--{name}="):
            value = flag.partition("=")[2]
    return value


def _is_zero(value: str | None) -> bool:
    """Whether a flag's `value` is the integer 0 ("0", "00", "+0"); a value Beam refuses is left to its parser."""
    try:
        return value is not None and int(value) == 0
    except ValueError:
        return False


def assemble_beam_flags(runner: str, beam_args: Sequence[str], defaults: LocalDefaults) -> list[str]:
    """`--runner` plus the user's Beam flags, with local defaults added where the user gave none."""
    flags = ["--runner", runner, *beam_args]
    if runner in ("DirectRunner", "FnApiRunner"):  # both run --direct_num_workers workers (--workers was ignored)
        if not has_flag(beam_args, "direct_num_workers"):
            flags += ["--direct_num_workers", str(defaults.workers)]
        elif _is_zero(flag_value(beam_args, "direct_num_workers")):
            # Beam's "one per core" is the host's count (multiprocessing.cpu_count): in a container held to 2 CPUs of
            # 64, 64 worker processes, each loading torch and the model; the CPUs this process may use, as --workers
            # counts them (env57 F1), unlike Beam's (left58 F2). The last value of a flag is the one Beam reads.
            flags += ["--direct_num_workers", str(usable_cpu_count())]
        if not has_flag(beam_args, "direct_running_mode"):
            mode = "multi_processing" if defaults.workers > 1 else "in_memory"
            flags += ["--direct_running_mode", mode]
        if not has_flag(beam_args, "default_sdk_harness_log_level"):
            flags += ["--default_sdk_harness_log_level", "ERROR"]
    elif runner == DASK_RUNNER:
        if defaults.dask_address and not has_flag(beam_args, "dask_client_address"):
            flags += ["--dask_client_address", defaults.dask_address]
        if (
            defaults.dask_partitions
            and not has_flag(beam_args, "dask_npartitions")
            and not has_flag(beam_args, "dask_partition_size")
        ):
            flags += ["--dask_npartitions", str(defaults.dask_partitions)]
    return flags


def _register_runner_options(runner: str, flags: Sequence[str]) -> None:
    """Import the module that defines the Dask options, so that they parse (and are not unknown)."""
    if runner == DASK_RUNNER or any(flag.startswith(("--dask_", "--dask-")) for flag in flags):
        importlib.import_module("apache_beam.runners.dask.dask_runner")


def unparsed_words(flags: Sequence[str]) -> tuple[list[str], list[str]]:
    """What Beam's own parser leaves of `flags`, which Beam only logs and drops: the flags no registered option class
    defines, and the words that are neither an option nor an option's value.

    Unknown flags are named as given, each with the spelling Beam knows when only its dashes differ (`--temp-location
    (Beam spells it --temp_location)`): a misspelt one was lost without a word, and a dashed spelling of a known
    option was named back with underscores, as if that spelling were the unknown one. A stray word is one no
    unknown flag before it takes as its value (a word after an on/off flag is no value of it): `--input a.jsonl
    b.jsonl` read a.jsonl alone (review45b, review45c F2).
    """
    parser = _beam_parser()
    leftover = parser.parse_known_args(flags)[1]
    unknown, stray, after_unknown_flag = [], [], False
    for word in leftover:
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            known = "--" + flag.lstrip("-").replace("-", "_")
            unknown.append(f"{flag} (Beam spells it {known})" if known in parser._option_string_actions else flag)
            after_unknown_flag = "=" not in word
            continue
        if not after_unknown_flag:
            stray.append(word)
        after_unknown_flag = False
    return unknown, stray


def _beam_parser() -> argparse.ArgumentParser:
    """A parser of every registered Beam option class, as PipelineOptions builds one to read its flags: once per
    class name, the first class of a name as Beam takes it (a class defined again, as a notebook cell re-run does,
    is a subclass twice, and its flags conflicted).

    It rests on two private Beam names, `_BeamArgumentParser` and `_option_string_actions`: held by the pinned
    apache-beam.
    """
    parser = _RaisingParser(allow_abbrev=False)
    classes: dict[str, type[PipelineOptions]] = {}
    for options_class in PipelineOptions.__subclasses__():
        classes.setdefault(str(options_class), options_class)
    for options_class in classes.values():
        options_class._add_argparse_args(parser)
    return parser


def _parsed(options: PipelineOptions) -> dict[str, object]:
    """The values of options whose flags `unparsed_words` has read (so that Beam's own parser meets no bad value)."""
    return options.get_all_options()


class _RaisingParser(_BeamArgumentParser):
    """Beam's argument parser, but a value it refuses is one DilstoreError: Beam's printed its whole usage (129
    lines under the name `dilstore`) and exited the process. Raised, not caught around a redirected stderr, which
    a second thread's precompute could leave redirected for good."""

    def error(self, message: str) -> NoReturn:
        raise DilstoreError(f"bad Beam option value: {message}")


def embedded_portable(options: PipelineOptions) -> bool:
    """Whether the run is a PortableRunner with the job server in this process (`--job_endpoint embed`) and its
    workers in this process too (`--environment_type LOOPBACK`): a local run, whatever the runner's name."""
    values = _parsed(options)
    return (options.view_as(StandardOptions).runner == "PortableRunner" and values.get("job_endpoint") == "embed"
            and values.get("environment_type") == "LOOPBACK")  # fmt: skip


def runs_here(options: PipelineOptions) -> bool:
    """Whether the run's workers run on this machine, so that it shows a progress bar and keeps Beam's logs quiet."""
    return options.view_as(StandardOptions).runner in LOCAL_RUNNERS or embedded_portable(options)


def ends_with_this_process(options: PipelineOptions) -> bool:
    """Whether no worker of the run goes on once this process stops (not so with Dask: see IN_PROCESS_RUNNERS)."""
    return options.view_as(StandardOptions).runner in IN_PROCESS_RUNNERS or embedded_portable(options)


def in_process_runner(options: PipelineOptions) -> PipelineRunner | None:
    """The FnApiRunner a DirectRunner (or FnApiRunner) run goes to, set up as the DirectRunner sets up its own;
    None for other runners, which Beam makes by name.

    Beam's DirectRunner first tries its Prism runner, which downloads a binary from GitHub. Offline that fails,
    leaving three empty folders in $TMPDIR every run, before it falls back to this FnApiRunner; online the job ran
    on Prism, whose workers --workers does not set. So local runs go to the FnApiRunner directly, wherever they run.
    """
    if options.view_as(StandardOptions).runner not in IN_PROCESS_RUNNERS:
        return None
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())  # the workers' options
    provision = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=provision)


# Local worker processes allowed per CPU: more only wait for a core, and each loads torch and the model (dask50 F2).
WORKERS_PER_CPU = 4


def local_worker_limit() -> int:
    """The most local worker processes a run may start: WORKERS_PER_CPU for each CPU this process may use (the host's
    count let a container held to 2 CPUs of 64 start 256 workers, env57 F1)."""
    return WORKERS_PER_CPU * usable_cpu_count()


def starts_local_workers(runner: str, beam_args: Sequence[str]) -> bool:
    """Whether --workers sets how many processes the run starts on this machine: the DirectRunner's and FnApiRunner's
    (unless --direct_num_workers is given, or a --direct_running_mode other than multi_processing, which runs
    threads), or a Dask LocalCluster's (when no scheduler is given). Elsewhere, a remote runner's own options size
    its workers, and --workers is not used."""
    if runner in IN_PROCESS_RUNNERS:
        mode = flag_value(beam_args, "direct_running_mode")
        return not has_flag(beam_args, "direct_num_workers") and mode in (None, "multi_processing")
    if runner == DASK_RUNNER:
        return not (has_flag(beam_args, "dask_client_address") or has_flag(beam_args, "dask_scheduler_file"))
    return False


def refuse_too_many_workers(flag: str, workers: int) -> None:
    """Refuse more local worker processes than `local_worker_limit`: `--workers 100000` forked workers, each loading
    torch and the model, until the machine ran out of memory (DirectRunner), or hung building a LocalCluster
    (Dask) (dask50 F2)."""
    limit = local_worker_limit()
    if workers > limit:
        raise DilstoreError(
            f"{flag} {workers} is more than {limit} ({WORKERS_PER_CPU} per CPU of the {usable_cpu_count()} this "
            "process may use): each local worker is a process that loads torch and the model, and more only wait for "
            "a core while they fill the memory"
        )


# The Dask runner's partitioning flags, by the name Beam parses them to: 0 is Beam's "unset" (its own guess).
_DASK_PARTITION_FLAGS = {"npartitions": "--dask_npartitions", "partition_size": "--dask_partition_size"}


def refuse_negative_partitions(values: dict[str, object]) -> None:
    """Refuse a negative --dask_npartitions or --dask_partition_size: Beam's Dask bag then had no partitions, every
    step ran on nothing, and the run exited 0 with nothing stored (dask50 F1). 0 stays Beam's "unset"."""
    for name, flag in _DASK_PARTITION_FLAGS.items():
        value = values.get(name)
        if isinstance(value, int) and value < 0:
            raise DilstoreError(f"{flag} must be 1 or more (or 0 for Beam's own guess), got {value}")


def refuse_negative_connection_timeout(values: dict[str, object]) -> None:
    """Refuse a negative --dask_connection_timeout (Beam parses it to `timeout`): dask.distributed failed on it inside
    the run as "could not convert string to float: '1-1'", naming no option (multi53 F4)."""
    timeout = values.get("timeout")
    if isinstance(timeout, int) and timeout < 0:
        raise DilstoreError(f"--dask_connection_timeout must be 0 or more seconds, got {timeout}")


def pipeline_options(flags: Sequence[str]) -> PipelineOptions:
    """Checked PipelineOptions from assembled flags (see `assemble_beam_flags`).

    Raises DilstoreError for flags Beam does not know, a Dataflow run without
    project, region or temp location, a Portable run without a job endpoint,
    a negative or too large worker count, a negative Dask partition count or
    connection timeout, and a remote run with no way
    to ship the dilstore package (`--setup_file`, `--requirements_file`,
    `--extra_package` or `--sdk_container_image`; LOOPBACK workers excepted).
    """
    flags = list(flags)
    runner = flags[flags.index("--runner") + 1] if "--runner" in flags else "DirectRunner"
    _register_runner_options(runner, flags)
    options = PipelineOptions(flags)
    unknown, stray = unparsed_words(flags)
    if unknown:
        raise DilstoreError(f"unknown Beam option(s): {', '.join(unknown)}")
    if stray:
        raise DilstoreError(f"{stray[0]!r} is neither an option nor an option's value: each corpus file takes an "
                            "--input of its own (--input a.jsonl --input b.jsonl)")  # fmt: skip
    values = _parsed(options)
    workers = values.get("direct_num_workers") or 0
    if workers < 0:  # 0 is Beam's "one per core"
        raise DilstoreError(f"--direct_num_workers must be 0 (one per core) or more, got {workers}")
    if runner in IN_PROCESS_RUNNERS and values.get("direct_running_mode") == "multi_processing":  # threads otherwise
        refuse_too_many_workers("--direct_num_workers", workers)
    refuse_negative_partitions(values)
    refuse_negative_connection_timeout(values)
    if runner == "DataflowRunner":
        missing = [f"--{name}" for name in _DATAFLOW_REQUIRED if not values.get(name)]
        if missing:
            raise DilstoreError(f"--runner DataflowRunner needs {', '.join(missing)}")
    if runner == "PortableRunner" and not values.get("job_endpoint"):
        raise DilstoreError(
            "--runner PortableRunner needs --job_endpoint: a job server's HOST:PORT, or embed to start one in this "
            "process (with --environment_type LOOPBACK its workers run here too)"
        )
    if runner in REMOTE_RUNNERS and values.get("environment_type") != "LOOPBACK":
        if not any(values.get(name) for name in _SHIPPING_OPTIONS):
            raise DilstoreError(
                f"--runner {runner} runs workers elsewhere: ship dilstore to them with "
                "--setup_file ./setup.py (or --requirements_file, --extra_package, "
                "--sdk_container_image), or use --environment_type LOOPBACK"
            )
    return options
