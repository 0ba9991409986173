"""Stores on another setup: folders whose names URL parsers read more into, written and read at the folder the name
says; stores handed to processes that are started, not forked."""

from __future__ import annotations

import os
import pickle
import re
import shutil
from pathlib import Path

import pytest

from dilstore.storage.errors import DilstoreError
from dilstore.storage.format import StoreChangedError, StoreFormatError
from dilstore.storage.location import StoreLocation, is_url
from dilstore.storage.reader import open_store
from dilstore.storage.verify import verify_store
from tests.fixtures.store_fixtures import build_store, random_shards


@pytest.mark.parametrize("name", ["run::2", "data:v1", "~/st"])
def test_a_store_named_like_a_url_is_written_and_read_at_that_folder(tmp_path: Path, monkeypatch, name: str) -> None:
    """(port58 F1) zarr wrote `run::2`'s shards into `run:` (an fsspec chain), failing a whole precompute at its first
    shard's write, and the readers took `data:v1` for a data URL and `~/st` for $HOME's `st`: `info`, `verify`,
    `ask` and `serve` said "no store", or read another store, at the folder precompute had filled."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    build_store(home / "st", random_shards([1], seed=1))  # the store `~/st` read before: another one
    monkeypatch.setenv("HOME", str(home))
    shards = random_shards([2, 1])
    build_store(Path(name), shards)
    with open_store(name) as store:
        assert len(store) == 3
        assert store.fetch([shards[1][0].id])[0].text == shards[1][0].text
    assert verify_store(name).ok


def test_a_store_pickled_for_a_spawned_process_is_opened_again_there(tmp_path: Path) -> None:
    """(port58 F2) A process pool's spawn or forkserver workers (macOS; Linux's default from Python 3.14) get their
    arguments pickled: a Store failed with "cannot pickle '_thread.lock' object". It is opened again where it is
    unpickled, as it was opened, and a store rebuilt in between is refused, not read as the other build."""
    shards = random_shards([2, 1])
    root = build_store(tmp_path / "store", shards)
    with open_store(root, read_path="zarr", max_open_shards=1) as store:
        pickled = pickle.dumps(store)
        with pickle.loads(pickled) as copy:
            assert (copy.url, copy.read_path, len(copy)) == (store.url, "zarr", 3)
            assert copy.fetch([shards[1][0].id])[0].text == shards[1][0].text
        shutil.rmtree(root)
        build_store(root, random_shards([1], seed=3))
        with pytest.raises(StoreChangedError, match="rebuilt or appended to since .* pickled"):
            pickle.loads(pickled)


def test_a_file_url_with_one_slash_is_still_the_folder_it_names(tmp_path: Path, monkeypatch) -> None:
    """(read58 F1) port58 F1 took only `scheme://...` for a URL: `file:/abs/store` (RFC 8089's form, what
    str(Path("file:///abs/store")) and Hadoop's tools give), read until then as /abs/store, became the folder
    `file:` here, "no store at file:/abs/store", though precompute refuses it as a URL. A known fsspec protocol
    before ':/' is a URL again; a folder name with a colon elsewhere (`data:v1`, `C:/x`) stays a folder."""
    monkeypatch.chdir(tmp_path)
    build_store(tmp_path / "st", random_shards([2]))
    assert is_url(f"file:{tmp_path}/st") and is_url(f"local:{tmp_path}/st")
    assert not is_url("C:/st") and not is_url("data:v1") and not is_url("run::2")
    with open_store(f"file:{tmp_path}/st") as store:
        assert len(store) == 2 and store.location.local_root == tmp_path / "st"


def test_a_store_path_of_an_unexpanded_home_names_the_home_s_store(tmp_path: Path, monkeypatch) -> None:
    """(read58 F4) Since port58 F1 a store path is taken as written, `~` too: a program's `open_store("~/st")` (no
    shell expands it there), which read $HOME/st until then, said only "no store at ~/st", of a store the user could
    see at ~/st. Where the home's store is there, the refusal says that `~` is no home here and names it."""
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    build_store(home / "st", random_shards([1]))
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(StoreFormatError, match=f"no store at ~/st: .*'~'.* {home / 'st'}"):
        open_store("~/st")


def test_a_store_path_of_a_user_without_a_home_is_no_store_not_a_runtime_error(tmp_path: Path, monkeypatch) -> None:
    """(fuzz60 F9) `dilstore info ~nosuchuser/st`, which a shell leaves as typed: the hint's look for the home that
    `~` names raised Python's RuntimeError ("Could not determine home directory."), a traceback."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreFormatError, match="^no store at ~dilstore-no-such-user/st$"):
        open_store("~dilstore-no-such-user/st")


@pytest.mark.parametrize("given", ["memory://[st", "file://[x/st", "//[st", "simplecache::file://[x"])
def test_a_store_url_python_cannot_split_is_named(given: str) -> None:
    """(fuzz60 F10) A '[' after '//' opens an IPv6 host: Python's URL parser raised ValueError ("Invalid IPv6 URL")
    through every command given such a store."""
    with pytest.raises(DilstoreError, match=rf"^cannot open store {re.escape(given)}: Invalid IPv6 URL"):
        open_store(given)


@pytest.mark.parametrize(
    "given", ["http://[::1]:8000/st", "https://u:pw@[2001:db8::1]/st", "simplecache::http://[::1]/st"]
)
def test_an_ipv6_host_holding_a_double_colon_is_named_as_fsspec_s_chain_separator(given: str) -> None:
    """(read60b F1) '::' separates the URLs of an fsspec chain, so fsspec and the store's parser cut a valid
    `http://[::1]:8000/st` there; the refusal (fuzz60 F10) said "Invalid IPv6 URL (a '[' after '//' opens an IPv6
    host address)", which the address is, not why it fails nor how to write it."""
    with pytest.raises(DilstoreError, match=r"IPv6 host holds '::', which separates .* fsspec chain") as raised:
        open_store(given)
    assert "pw" not in str(raised.value)


def test_an_ipv6_host_written_without_a_double_colon_opens_as_a_remote_store() -> None:
    """(read60b F1) The spelling the refusal above gives is taken: a remote store with no local folder."""
    location = StoreLocation.parse("http://[0:0:0:0:0:0:0:1]:8000/st")
    assert (location.url, location.local_root) == ("http://[0:0:0:0:0:0:0:1]:8000/st", None)


@pytest.mark.parametrize(
    "given", ["https://user:p[ss@host/st", "https://user:p]ss@host/st", "simplecache::s3://k[y:ss@b/st"]
)
def test_a_bracket_in_a_url_s_user_part_is_named_with_its_percent_escape(given: str) -> None:
    """(read60b F2) Python's URL parser takes any '[' or ']' before the host, a password's too, for an IPv6 host's:
    the refusal (fuzz60 F10) spoke of an IPv6 host the URL does not have. It says to write %5B or %5D there (which
    the password then means), and shows no password."""
    with pytest.raises(DilstoreError, match=r"a '\[' or '\]' in a URL's user name or password is written %5B or %5D"
                       ) as raised:  # fmt: skip
        open_store(given)
    assert "ss@" not in str(raised.value)


def test_a_file_url_with_one_slash_is_served_with_the_store_s_own_index(tmp_path: Path, monkeypatch) -> None:
    """(left58b F1) `serve file:/abs/st` (and `ask`, `verify`) took the BM25 index folder from the argument as a
    Path: ./file:/abs/st/bm25, relative to the current folder. A store indexed at /abs/st/bm25 was refused with
    "no Lucene index at file:/abs/st/bm25". Each spelling of the store now finds the same bm25/ folder inside it."""
    from dilstore.reader.retrieval import bm25_index_dir
    from dilstore.runners.cmd_serve import served_index

    monkeypatch.chdir(tmp_path)
    build_store(tmp_path / "st", random_shards([2]))
    index = tmp_path / "st" / "bm25"
    for spelling in (f"file:{tmp_path}/st", f"file://{tmp_path}/st", str(tmp_path / "st")):
        assert bm25_index_dir(spelling) == index
    with pytest.raises(DilstoreError, match=f"^no Lucene index at {index}: build it with"):
        served_index("st", f"file:{tmp_path}/st", "dilbert", None)


@pytest.mark.parametrize("chain", ["simplecache::file://{folder}", "filecache::{folder}"])
def test_a_cache_chain_over_a_local_folder_is_sent_to_that_folder_s_index(tmp_path: Path, chain: str) -> None:
    """(left61 F5) `ask simplecache::file:///abs/st` said the store "is not on the local filesystem" and asked for "a
    local copy of the store's bm25/ folder", which is /abs/st/bm25 already; an index of another build given to it
    was to be rebuilt by "`dilstore index` of a local copy of" the chain, where `dilstore index /abs/st` does it.
    Both now name the folder under the chain."""
    from dilstore.reader.retrieval import INDEX_RECORD, bm25_index_dir, check_index_covers
    from dilstore.storage.manifest import read_manifest

    folder = tmp_path / "st"
    build_store(folder, random_shards([1]))
    store = chain.format(folder=folder)
    with pytest.raises(DilstoreError, match=rf"^store {re.escape(store)} is read through an fsspec chain, and its BM25 "
                       rf"index is not looked for in the folder under it: give that folder's \(--index "
                       rf"{re.escape(str(folder / 'bm25'))}; index= in Python\)$"):  # fmt: skip
        bm25_index_dir(store)
    other = tmp_path / "other-bm25"
    other.mkdir()
    (other / INDEX_RECORD).write_text('{"generation": "another"}')
    with pytest.raises(DilstoreError, match=rf"which `dilstore index {re.escape(str(folder))}` builds \(it writes "
                       rf"{re.escape(str(folder / 'bm25'))}: give that"):  # fmt: skip
        check_index_covers(other, read_manifest(StoreLocation.parse(str(folder))), store)


def test_a_rerun_hint_quotes_a_store_path_with_a_space(tmp_path: Path) -> None:
    """(left58b F2) The hints `dilstore index STORE` (ask, serve, index under a compaction) and `dilstore verify
    STORE` (a changed codebook) printed the path as it is: pasted back, `/data/my store` ran `dilstore index
    /data/my` with a stray argument. They are quoted as a shell takes them, as precompute's and compact's are."""
    from dilstore.reader.retrieval import require_index_files

    store = tmp_path / "my store"
    build_store(store, random_shards([1]))
    with pytest.raises(DilstoreError, match=r"build it with `dilstore index '[^`]*/my store'`$"):
        require_index_files(store / "bm25", store, given=False, local_root=store)
    from dilstore.storage.messages import command_text

    assert command_text("dilstore", "verify", "it's") == """dilstore verify 'it'"'"'s'"""


@pytest.mark.parametrize("slashes", ["", "//"])
def test_a_store_given_as_a_file_url_is_sent_to_index_its_folder(tmp_path: Path, slashes: str) -> None:
    """(left58b F6) `serve file:/abs/st` without an index said "build it with `dilstore index file:/abs/st`", and
    that said "no store at file:/abs/st" (the folder ./file:/abs/st); `dilstore index file:///abs/st` was told to
    index "a local copy" of a local store. The hint names the folder, and index and compact refuse a `file:` URL
    naming it."""
    from dilstore.runners.cmd_index import local_store
    from dilstore.runners.cmd_serve import served_index

    build_store(tmp_path / "st", random_shards([1]))
    url = f"file:{slashes}{tmp_path}/st"
    with pytest.raises(DilstoreError, match=f"build it with `dilstore index {tmp_path / 'st'}`$"):
        served_index("st", url, "dilbert", None)
    with pytest.raises(DilstoreError, match=f"^{url} is a URL: give the store's folder, {tmp_path / 'st'}$"):
        local_store(url)
    with pytest.raises(DilstoreError, match="^s3://b/st is a URL, and Lucene writes only local files"):
        local_store("s3://b/st")


@pytest.mark.parametrize("cause", ["loop", "long name", "link to a long name"])
def test_a_store_path_that_cannot_be_reached_says_why_not_which_file(tmp_path: Path, cause: str) -> None:
    """(url59 F5) A store path in a loop of symbolic links, or with a name over NAME_MAX, was "cannot read
    PATH/manifest.json: File name too long …; every file of a store must be a readable file" in `info`, `ask` and
    `serve`, and `verify` stopped on a `PATH/bm25` the user never gave. Each says there is no store, and why. (read59
    F3) Through a link to a name over NAME_MAX, it said "its path is 20 bytes long, and a path here may have at most
    4095"."""
    from dilstore.runners.cmd_store import verify_with_index

    name_max, path_max = os.pathconf(tmp_path, "PC_NAME_MAX"), os.pathconf(tmp_path, "PC_PATH_MAX") - 1
    if cause == "loop":
        path = tmp_path / "loop"
        path.symlink_to("loop")
        why = "its path runs into a loop of symbolic links"
    elif cause == "long name":
        path = tmp_path / ("x" * 300) / "st"
        why = f"its name {'x' * 40}… is 300 bytes long, and a file name here may have at most {name_max}"
    else:
        (tmp_path / "link").symlink_to("x" * 300)
        path = tmp_path / "link" / "st"
        why = (f"a symbolic link on its path leads to a name or path longer than this filesystem takes (a name of at "
               f"most {name_max} bytes, a path of {path_max})")
    refusal = f"no store at {path}: {why}"
    with pytest.raises(StoreFormatError, match=f"^{re.escape(refusal)}$"):
        open_store(path)
    assert verify_with_index(str(path)).problems == [refusal]


def test_a_store_path_with_a_null_byte_is_a_store_error(tmp_path: Path) -> None:
    """(read59 F2) url59 F5's check of the store's folder stat()ed a path with a null byte, and `open_store` (and
    `verify_with_index`) raised a bare ValueError, where the manifest's read had named the path as a store error."""
    from dilstore.runners.cmd_store import verify_with_index

    path = f"{tmp_path}/st\0x"
    refusal = f"cannot read {path}/manifest.json: ValueError: embedded null byte; every file of a store must be"
    with pytest.raises(StoreFormatError, match=f"^{re.escape(refusal)}"):
        open_store(path)
    assert [problem[:len(refusal)] for problem in verify_with_index(path).problems] == [refusal]


@pytest.mark.parametrize(("given", "folder"), [("{tmp}/a::b", "a::b"),
                                               ("simplecache::filecache::file://{tmp}/st", "st"),
                                               ("blockcache::simplecache::{tmp}/st", "st")])  # fmt: skip
def test_the_local_folder_of_a_chain_is_its_last_link_s_and_of_a_path_with_colons_the_path(
    given: str, folder: str, tmp_path: Path
) -> None:
    """(mut60 M7) `local_folder`, which refuses an output written into a store (left60 F2), takes a chain's last
    link, however many come before it, and a plain path holding `::` as the path: only two-link chains were
    tested, so the first link after `::`, or `b` in the current folder for the folder `a::b`, could be taken and an
    output inside such a store let through."""
    from dilstore.storage.location import local_folder

    assert local_folder(given.format(tmp=tmp_path)) == tmp_path / folder


def test_a_chain_under_the_local_filesystem_is_refused_with_its_urls_redacted() -> None:
    """(mut60 M4) `local::URL` is refused (left60 F2), naming the URL to give in its place: redacted, as the store's
    own URL is. The command's line is scrubbed again, so only a library caller (open_store, serve's reopen) would
    have seen the password, and no test gave one."""
    from dilstore.storage.location import StoreLocation

    with pytest.raises(DilstoreError) as raised:
        StoreLocation.parse("local::https://u:pw@127.0.0.1:9/store")
    assert str(raised.value) == (
        "cannot open store local::https://u:***@127.0.0.1:9/store: local:: is the local filesystem, which reads no "
        "other filesystem under it; give https://u:***@127.0.0.1:9/store itself")
    with pytest.raises(DilstoreError) as raised:  # the first link is the one named, the rest given back whole
        StoreLocation.parse("local::simplecache::https://u:pw@127.0.0.1:9/store")
    assert str(raised.value).endswith(
        ": local:: is the local filesystem, which reads no other filesystem under it; give "
        "simplecache::https://u:***@127.0.0.1:9/store itself")


def test_only_a_plain_url_of_the_local_filesystem_names_a_folder(tmp_path: Path, monkeypatch) -> None:
    """(mut59b M1) file_url_folder's refusals went untested: a `::` chain through a `file:` URL could be named a
    folder, an ftp:// URL could have its filesystem made (its host reached to say no), and an unknown protocol could
    end in fsspec's ValueError, and no test noticed."""
    from dilstore.storage import location

    assert location.file_url_folder(f"file://{tmp_path}/st") == location.file_url_folder(f"local:{tmp_path}/st")
    assert location.file_url_folder(f"file://{tmp_path}/st") == tmp_path / "st"

    def made(*args: object, **kwargs: object) -> None:
        raise AssertionError("a filesystem was made")

    monkeypatch.setattr(location.StoreLocation, "parse", made)
    for url in (f"file://{tmp_path}/st::simplecache", "ftp://127.0.0.1:9/st", "nosuch://host/st", "st"):
        assert location.file_url_folder(url) is None, url


def test_a_store_path_over_path_max_is_measured_on_the_filesystem_it_would_be_on(tmp_path: Path, monkeypatch) -> None:
    """(mut59b M2) Only a name over NAME_MAX was tried: the whole path over PATH_MAX (which counts the final null
    byte) could be said to fit one byte more, and the limits could be read from any folder (`/`), not from the
    folder the path would be made in, and no test noticed."""
    from dilstore.storage import manifest

    def path_limit(folder: Path, name: str, default: int) -> int:
        return {"PC_NAME_MAX": 255, "PC_PATH_MAX": 4096}[name] if folder == tmp_path else 8

    monkeypatch.setattr(manifest, "path_limit", path_limit)
    path = tmp_path.joinpath(*["y" * 200] * 21, "st")
    size = len(os.fsencode(path))
    refusal = f"no store at {path}: its path is {size} bytes long, and a path here may have at most 4095"
    with pytest.raises(StoreFormatError, match=f"^{re.escape(refusal)}$"):
        open_store(path)
