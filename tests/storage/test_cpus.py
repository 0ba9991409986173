"""The CPUs a process may use (storage/cpus.py): its affinity, and a cgroup CPU quota where that allows fewer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dilstore.storage import cpus


@pytest.mark.parametrize(
    ("proc", "files", "quota"),
    [
        ("0::/\n", {"cpu.max": "200000 100000\n"}, 2),  # cgroup v2 in a cgroup namespace: `docker run --cpus 2`
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs: rounded up
        ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # no quota
        ("0::/kubepods/pod1/c\n", {"kubepods/pod1/c/cpu.max": "max 100000", "kubepods/pod1/cpu.max": "300000 100000",
                                   "kubepods/cpu.max": "max 100000"}, 3),  # the pod's limit, above the container's
        ("0::/a\n", {"unified/a/cpu.max": "100000 100000"}, 1),  # a hybrid system's unified hierarchy
        ("4:cpu,cpuacct:/docker/abc\n", {"cpu,cpuacct/cpu.cfs_quota_us": "400000\n",  # v1, no namespace: the mount's
                                          "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, 4),  # root is the container's
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),  # v1, no quota
        ("0::/\n", {"cpu.max": "garbage"}, None),
        # (mut57c) the least of a cgroup's and its parent's; "QUOTA" alone is per 100 ms; the alias a v1 cpu
        # controller is mounted under; a quota or period of 0 is none; a cpuset line is no cpu controller's.
        ("0::/a/b\n", {"a/b/cpu.max": "100000 100000", "a/cpu.max": "400000 100000"}, 1),
        ("0::/\n", {"cpu.max": "200000\n"}, 2),
        ("4:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2),
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "0\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
        ("1:cpu:/\n", {"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "0\n"}, None),
        ("3:cpuset:/a\n", {"cpu/a/cpu.cfs_quota_us": "100000\n", "cpu/a/cpu.cfs_period_us": "100000\n"}, None),
        ("not a cgroup line\n", {}, None),
    ],
)
def test_a_cgroup_quota_is_read(tmp_path: Path, proc: str, files: dict[str, str], quota: int | None) -> None:
    """A quota (docker --cpus, a Kubernetes CPU limit) leaves the affinity at the host's count; `precompute` sized its
    workers by the host's count (env57 F1)."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="ascii")
    (tmp_path / "proc").write_text(proc, encoding="utf-8")
    assert cpus.cgroup_cpu_quota(tmp_path, tmp_path / "proc") == quota
    assert cpus.cgroup_cpu_quota(tmp_path, tmp_path / "missing") is None


def test_a_cgroup_path_above_the_namespace_root_is_not_read_outside_the_mount(tmp_path: Path) -> None:
    """(mut57c) In a cgroup namespace, /proc/self/cgroup names a cgroup outside it as "/../NAME": its ".." parts are
    dropped, so no `cpu.max` beside the mount is taken for this process's quota."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "cpu.max").write_text("100000 100000", encoding="ascii")
    (tmp_path / "mount").mkdir()
    (tmp_path / "proc").write_text("0::/../x\n", encoding="utf-8")
    assert cpus.cgroup_cpu_quota(tmp_path / "mount", tmp_path / "proc") is None


def test_the_usable_cpus_are_the_affinity_and_the_quota_where_less(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container held to 2 CPUs of a 64-core host counted 64 (os.cpu_count) (env57 F1)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: None)
    assert cpus.usable_cpu_count() == 2
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: 1)
    assert cpus.usable_cpu_count() == 1
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda *where: 8)
    assert cpus.usable_cpu_count() == 2
    monkeypatch.delattr(os, "sched_getaffinity")
    assert cpus.usable_cpu_count() == 8
