"""The files a run reads and the folders it writes, checked the same way everywhere.

Inputs (scenario files, traces and goldens, results manifests, waivers, model configs) are read
whole through `read_bytes` / `read_text`: regular files only (a FIFO would block the harness,
/dev/zero would fill its memory; /dev/null is read as empty), no larger than the limit of their
kind, UTF-8 text. Output folders (`--results`, `--reports`, `parity fuzz --out`) are checked
and claimed with `claim_folder` before any engine starts: a file in the way or a folder that
cannot be written is bad input at once, not a traceback after every engine has run, and a second
run given the same folder while one holds it is refused instead of the two overwriting each other.

Standard library only: the scenario reader (floor 0) uses it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
import tomllib
from pathlib import Path

from conformance.formats.errors import InputError
from conformance.formats.pins import REPO_ROOT

MiB = 1024 * 1024
# Largest file of each kind the harness reads, in bytes. Each is far above what a valid file of
# its kind holds (a scenario at the schema's limits, 4096 requests with 1024-entry lists, is
# about 50 MiB; a trace is one run's records, at most protocol.MAX_RUN_BYTES, written indented).
LIMITS = {"scenario": 64 * MiB, "trace": 1024 * MiB, "manifest": 16 * MiB, "waivers": 1 * MiB,
          "model config": 16 * MiB, "tokenizer": 16 * MiB}


DEV_NULL = os.makedev(1, 3)  # Linux's /dev/null: read as an empty file, the one device allowed


class InputFileError(InputError):
    """An input path that is not a regular file, is over its kind's size limit, or cannot be
    read as UTF-8 text. The message names the path, what was expected and what is there."""


class FolderError(InputError):
    """An output folder that cannot be used: a file is in the way, it cannot be written, or
    another run holds it."""


def read_bytes(path: Path, kind: str) -> bytes:
    """The whole of an input file of `kind` (a key of LIMITS). FileNotFoundError passes
    through (callers say what a missing file means); anything else is an InputFileError."""
    limit = LIMITS[kind]
    try:
        # O_NONBLOCK: opening a FIFO that no one writes returns at once instead of blocking;
        # the type is then read from the open file itself, so it cannot change in between.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputFileError(f"{path}: cannot open the {kind} file: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISCHR(info.st_mode) and info.st_rdev == DEV_NULL:
            return b""  # `--waivers /dev/null`: the usual way to say "none"
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"{path}: expected a regular {kind} file, got {_file_type(info.st_mode)}")
        if info.st_size > limit:
            raise InputFileError(f"{path}: the {kind} file is {info.st_size} bytes, above the limit "
                                 f"of {limit} bytes ({limit // MiB} MiB)")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)  # a file that grows meanwhile is still bounded
    except OSError as exc:
        raise InputFileError(f"{path}: cannot read the {kind} file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputFileError(f"{path}: the {kind} file is above the limit of {limit} bytes "
                             f"({limit // MiB} MiB)")
    return data


def read_text(path: Path, kind: str) -> str:
    """read_bytes, decoded as strict UTF-8 whatever the locale."""
    data = read_bytes(path, kind)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"{path}: expected UTF-8 text in the {kind} file, got byte "
                             f"{data[exc.start]:#04x} at offset {exc.start}") from None


def read_toml(path: Path, failed) -> dict:
    """A reviewed TOML file of the checkout as its table, {} where it is missing. `failed(exc)`
    makes the caller's named error from what went wrong (unreadable, not UTF-8, not TOML)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise failed(exc) from None


def _file_type(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


# What a claimed folder is for: who writes it and what, in the words of a refusal. Each has its
# own lock file (`.parity-<purpose>.lock`), so one folder may hold a gate's reports and results.
PURPOSES = {"reports": ("gate", "its reports"), "results": ("gate", "its results"),
            "findings": ("fuzz search", "its findings")}


@contextlib.contextmanager
def claim_folder(folder: Path | None, option: str, purpose: str):
    """Check `folder` (named by `option` in every error) can hold a run's output, create it,
    and hold its lock file for the block: a second run claiming it for the same purpose
    meanwhile gets a FolderError naming the holder's pid. Temporary files that writers killed
    there left are removed once the folder is claimed. None claims nothing."""
    if folder is None:
        yield
        return
    who, what = PURPOSES[purpose]
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{option} {folder}: is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / f".parity-{purpose}.lock", "a+", encoding="utf-8")
    except OSError as exc:
        raise FolderError(f"{option} {folder}: cannot write there: {exc.strerror or exc}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise FolderError(f"{option} {folder}: cannot lock it: {exc.strerror or exc}") from None
            lock.seek(0)
            holder = lock.read().strip()[:20] or "unknown"
            raise FolderError(f"{option} {folder}: another {who} (pid {holder}) is writing {what} "
                              f"there; give each {who} its own folder") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        remove_stale_temporaries(folder)  # what a writer killed here before (kill -9) left
        yield  # the lock ends when the file closes, or when the process ends (kill -9 included)


def check_output_file(path: Path, option: str) -> None:
    """A file the run will write at its end (`parity run --out`), checked before any engine
    starts: not a folder, and its folder can be created and written."""
    if path.is_dir():
        raise FolderError(f"{option} {path}: is a folder; give the path of a file")
    folder = path.parent
    if folder.exists() and not folder.is_dir():
        raise FolderError(f"{option} {path}: {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FolderError(f"{option} {path}: cannot create {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FolderError(f"{option} {path}: cannot write in {folder}")


def write_text_atomic(path: Path, text: str) -> bool:
    """The one durable writer: old file or new file, never half of either, and the new one on
    disk before it takes the old one's name (mkstemp, fsync, rename). The temporary file beside
    it is named by the writer's pid (`.<name>.<pid>.<random>.tmp`), so one left by a writer
    killed meanwhile is known as stale. True when the bytes changed (an equal file is left as
    it is)."""
    try:
        if read_text(path, "trace") == text:  # the largest kind: whatever this writer writes
            return False
    except (FileNotFoundError, InputFileError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_writers_temporaries(path)  # left by a writer killed mid-write (kill -9)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; what the harness writes is a plain file
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


def shown(path: Path | str) -> str:
    """A path as every message shows it: relative to the checkout where it lies inside it."""
    path = Path(path)
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


# what follows `.<name>.` in a temporary file's name: `<pid>.tmp`, or `<pid>.<random>.tmp` (a
# golden's, from mkstemp)
_WRITER = re.compile(r"(?P<pid>\d+)(?:\.[A-Za-z0-9_]+)?\.tmp")


def remove_stale_temporaries(folder: Path, name: str | None = None) -> list[Path]:
    """Remove the temporary files in `folder` (of the file `name` only, when given) whose
    writer no longer runs: what a writer killed mid-write (kill -9) left. A running writer's
    file is left alone. Returns what was removed."""
    removed = []
    for path in sorted(folder.glob(".*.tmp")):
        if name is None:
            match = _writer_anywhere(path.name)
        elif path.name.startswith(f".{name}."):
            match = _WRITER.fullmatch(path.name[len(name) + 2:])
        else:
            continue
        if not match or _running(int(match["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def _writer_anywhere(name: str):
    """The writer of `.<name>.<pid>[.<random>].tmp` when the name is not known: the last
    all-digit part that the pattern accepts."""
    parts = name.split(".")
    for i in range(len(parts) - 2, 1, -1):
        match = _WRITER.fullmatch(".".join(parts[i:]))
        if match:
            return match
    return None


def remove_dead_writers_temporaries(path: Path) -> list[Path]:
    """remove_stale_temporaries for the one file `path`."""
    return remove_stale_temporaries(path.parent, path.name)


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return False  # ours, from an earlier write of this process that was interrupted
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # someone else's process: not ours to judge
    return True
