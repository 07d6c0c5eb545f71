"""Writing outputs: the one door every file aisim writes for a user goes through.

Replay folders and decision logs, Parquet traces, plans, the best sweep
configuration and deployment, reports: each is written here, and the rules
are the same for all of them.

- **Never over an input.**  An output that is one of the run's inputs (the
  same file, by :func:`os.path.samefile`, whatever its name) is refused with
  :class:`aisim.errors.OutputError` before anything is written; so are two
  outputs naming the same file.
- **Regular files atomically.**  A file is written under a temporary name
  (``.aisim-*``) in its destination's directory, flushed to disk (``fsync``)
  and renamed into place; a symbolic link's target is what is replaced.
- **Streams as streams.**  ``-`` (standard output), ``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N``, FIFOs, character devices and sockets are
  opened and written directly, never renamed over (a rename would replace
  ``/dev/null`` with a regular file).  A stream cannot be taken back: what
  was written to it stays written.
- **All or nothing.**  Inside :func:`outputs`, every output is staged and
  the renames happen together when the block ends without an error, in the
  order the outputs were staged, with SIGINT and SIGTERM held back until the
  last one; a failing rename puts back what the earlier ones replaced.  An
  error, Ctrl-C or SIGTERM before that removes every staged file: the user's
  files are as they were.  Outside such a block each output is its own
  transaction.

A test injects a fault at the k-th write step (:func:`inject_fault`); every
step (a temporary file made, written, synced; a rename; a database commit)
calls :func:`step`.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import uuid
from contextlib import contextmanager

from aisim.errors import OutputError

# Destinations that are streams by name (whatever they resolve to): standard output and error.
_STREAM_NAMES = ("-", "/dev/stdout", "/dev/stderr")
# Prefix of every temporary name this module makes (staged files, staged folders, backups).
TEMP_PREFIX = ".aisim-"


# ---------------------------------------------------------------- fault injection

class _Fault:
    def __init__(self, at: int, exc):
        self.at, self.exc, self.steps, self.fired = at, exc, 0, None


_FAULT = None
_FAULT_LOCK = threading.Lock()


def step(what: str) -> None:
    """One write step; where a fault injected by :func:`inject_fault` strikes.

    Parameters
    ----------
    what : str
        What the step does (``"create"``, ``"write"``, ``"rename"``, ``"commit"`` ...), for the fault's message.
    """
    fault = _FAULT
    if fault is None:
        return
    with _FAULT_LOCK:
        fault.steps += 1
        if fault.steps != fault.at:
            return
        fault.fired = what
    raise fault.exc(f"injected fault at write step {fault.at} ({what})")


@contextmanager
def inject_fault(at: int, exc=OSError):
    """Raise ``exc`` at the ``at``-th write step (1-based) of the block; for tests.

    Yields an object whose ``steps`` is the number of steps reached and
    ``fired`` the step that raised (None when the block had fewer steps).
    """
    global _FAULT
    fault = _Fault(at, exc)
    _FAULT = fault
    try:
        yield fault
    finally:
        _FAULT = None


# ---------------------------------------------------------------- signals

# The signal that stopped the command, read by the command line for its exit status (128 + signal).
_SIGNALLED = {"signum": None}


class Terminated(KeyboardInterrupt):
    """SIGTERM: raised in the main thread so that every cleanup path Ctrl-C takes runs for it too."""


def _on_sigterm(signum, frame):
    _SIGNALLED["signum"] = signum
    raise Terminated()


def install_signal_handlers() -> None:
    """Make SIGTERM raise :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread."""
    _SIGNALLED["signum"] = None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def interrupt_status() -> tuple:
    """``(exit status, word)`` of the interrupt that stops the command: ``(143, "terminated")`` after
    SIGTERM, else ``(130, "interrupted")`` (Ctrl-C)."""
    if _SIGNALLED["signum"] == signal.SIGTERM:
        return 143, "terminated"
    return 130, "interrupted"


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block ends (a commit's renames, an undo, happen whole)."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---------------------------------------------------------------- what a destination is

def is_stream(path) -> bool:
    """Whether ``path`` is written as a stream: ``-``, standard output or error, a ``/dev/fd`` or
    ``/proc`` entry, or an existing FIFO, character device or socket."""
    path = os.fspath(path)
    if path in _STREAM_NAMES:
        return True
    real = os.path.realpath(path)
    if real.startswith(("/dev/fd/", "/proc/")) or path.startswith(("/dev/fd/", "/proc/self/fd/")):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode) or stat.S_ISBLK(mode)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_outputs(outputs: dict, inputs: dict | None = None) -> None:
    """Refuse an output that is one of the run's inputs, or two outputs that are the same file.

    Parameters
    ----------
    outputs : dict
        ``{label: path}`` of the files the run will write (None values are skipped); the label names
        the option or key (``"--decision-log"``, ``"'best' in sweep.toml"``).
    inputs : dict, optional
        ``{label: path}`` of the files the run reads (None values are skipped; a list of paths is
        several inputs under one label).

    Raises
    ------
    aisim.errors.OutputError
        Naming both.
    """
    ins = []
    for label, paths in (inputs or {}).items():
        for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths or ()):
            if p is not None:
                ins.append((label, os.fspath(p)))
    outs = [(label, os.fspath(p)) for label, p in outputs.items() if p is not None]
    for i, (label, out) in enumerate(outs):
        if out in _STREAM_NAMES:
            continue
        for in_label, inp in ins:
            if _same(out, inp):
                raise OutputError(f"{label} {out} is {in_label} {inp}, an input of this run; aisim never writes "
                                  "over its inputs")
        for other_label, other in outs[:i]:
            if other not in _STREAM_NAMES and (_same(out, other) or os.path.abspath(out) == os.path.abspath(other)) \
                    and not is_stream(out):
                raise OutputError(f"{label} {out} and {other_label} {other} are the same file")


# ---------------------------------------------------------------- the transaction

def _ordinary_permissions(path: str, directory: bool = False) -> None:
    # mkstemp/mkdtemp create private (0600/0700) entries; give the result the
    # permissions an ordinary file would get under the process's umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _StreamFile:
    # A stream's file object as a Parquet writer needs it: tell() counts bytes (a FIFO cannot seek).
    def __init__(self, fh, close: bool):
        self.fh, self._close, self.pos = fh, close, 0

    def write(self, data):
        if isinstance(data, str):
            data = data.encode("utf-8")
        data = bytes(data)
        self.fh.write(data)
        self.pos += len(data)
        return len(data)

    def tell(self):
        return self.pos

    def flush(self):
        self.fh.flush()

    @property
    def closed(self):
        return False

    def finish(self):
        self.fh.flush()
        if self._close:
            self.fh.close()


class Outputs:
    """A run's outputs, staged and committed together (see the module docstring).

    Parameters
    ----------
    inputs : dict, optional
        ``{label: path}`` of the run's inputs: an output that is one of them is refused.
    """

    def __init__(self, inputs: dict | None = None):
        self.inputs = dict(inputs or {})
        self.staged = []   # (temporary path, destination), renamed in this order
        self.dirs = []     # staged folders to remove once committed or discarded
        self.made = []     # destination folders the commit created (removed again on rollback)
        self.labels = {}   # destination -> label, for the check of two outputs in one file
        self.done = False

    # ------------------------------------------------------------ checks

    def _claim(self, path: str, label: str) -> None:
        check_outputs({**{lbl: p for p, lbl in self.labels.items()}, label: path}, self.inputs)
        self.labels[path] = label

    # ------------------------------------------------------------ staging

    @contextmanager
    def open(self, path, label: str = "output", binary: bool = True):
        """A file object for ``path``: a staged temporary file, or the stream itself.

        Parameters
        ----------
        path : path-like
            Destination; its directory is created when missing (at the commit).
        label : str
            The option or key that named it, for messages.
        binary : bool
            Bytes (default) or text (UTF-8).
        """
        path = os.fspath(path)
        self._claim(path, label)
        if is_stream(path):
            if path == "-" or path == "/dev/stdout":
                sys.stdout.flush()
                fh = _StreamFile(sys.stdout.buffer, close=False)
            elif path == "/dev/stderr":
                sys.stderr.flush()
                fh = _StreamFile(sys.stderr.buffer, close=False)
            else:
                step("open")
                fh = _StreamFile(open(path, "wb"), close=True)
            try:
                yield fh  # takes str (as UTF-8) and bytes alike
            finally:
                fh.finish()
            return
        dest = os.path.realpath(path)  # a link's target is replaced, the link stays
        parent = os.path.dirname(dest)
        made = _makedirs(parent)
        self.made.extend(made)
        step("create")
        fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=parent)
        self.staged.append((tmp, dest))
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as fh:
            yield fh
            step("write")
            fh.flush()
            step("fsync")
            os.fsync(fh.fileno())
        _ordinary_permissions(tmp)

    def write_text(self, path, text, label: str = "output") -> None:
        """Stage ``text`` (a str, or an iterable of str written as given) for ``path``."""
        with self.open(path, label, binary=False) as fh:
            if isinstance(text, str):
                fh.write(text)
            else:
                for part in text:
                    fh.write(part)

    @contextmanager
    def directory(self, out_dir, names, label: str = "output"):
        """A staged folder for the files ``names`` of ``out_dir``: the caller writes them there.

        Each becomes ``out_dir/NAME`` at the commit (``out_dir`` is created when missing); other files
        of ``out_dir`` stay as they are.
        """
        out_dir = os.fspath(out_dir)
        if is_stream(out_dir):
            raise OutputError(f"{label} {out_dir} must be a directory, not a stream")
        out_dir = os.path.realpath(out_dir)
        for name in names:
            self._claim(os.path.join(out_dir, name), label)
        parent = os.path.dirname(out_dir)
        self.made.extend(_makedirs(parent))
        step("create")
        tmp = tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=parent)
        self.dirs.append(tmp)
        yield tmp
        for name in names:
            src = os.path.join(tmp, name)
            step("fsync")
            fd = os.open(src, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _ordinary_permissions(src)
            self.staged.append((src, os.path.join(out_dir, name)))

    # ------------------------------------------------------------ the end

    def commit(self) -> None:
        """Rename every staged file into place, in order; on a failure put back what was replaced."""
        if self.done:
            return
        self.done = True
        backups, placed = {}, []
        with signals_held():
            try:
                for tmp, dest in self.staged:
                    parent = os.path.dirname(dest)
                    if not os.path.isdir(parent):
                        self.made.extend(_makedirs(parent))
                    if os.path.isfile(dest):  # kept under a temporary name until every rename is done
                        backup = os.path.join(parent, f"{TEMP_PREFIX}old-{uuid.uuid4().hex[:12]}")
                        try:
                            os.link(dest, backup)
                            backups[dest] = backup
                        except OSError:
                            pass  # a file system without hard links: no way back for this one
                    step("rename")
                    os.replace(tmp, dest)
                    placed.append(dest)
                for parent in sorted({os.path.dirname(d) for _, d in self.staged}):
                    _fsync_dir(parent)
            except BaseException:
                for dest in reversed(placed):
                    try:
                        if dest in backups:
                            os.replace(backups.pop(dest), dest)
                        else:
                            os.unlink(dest)
                    except OSError:
                        pass
                self._remove_staged()
                self._remove_made()
                raise
            finally:
                for backup in backups.values():
                    _unlink(backup)
        self._remove_staged()

    def discard(self) -> None:
        """Remove every staged file; nothing reaches its destination."""
        self.done = True
        self._remove_staged()
        self._remove_made()

    def _remove_staged(self):
        for tmp, _ in self.staged:
            _unlink(tmp)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)

    def _remove_made(self):
        for d in reversed(self.made):
            try:
                os.rmdir(d)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.commit()
        else:
            self.discard()
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _makedirs(path: str) -> list:
    """Create ``path`` and its missing parents; the folders created, outermost first."""
    missing = []
    while path and not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for d in reversed(missing):
        step("mkdir")
        os.makedirs(d, exist_ok=True)
    return list(reversed(missing))


# ---------------------------------------------------------------- the run's transaction

_CURRENT = []


@contextmanager
def outputs(inputs: dict | None = None):
    """The run's outputs as one transaction: every output staged inside the block is committed at its
    end, together, or discarded when the block raises (Ctrl-C and SIGTERM included).

    Blocks nest: an inner block joins the outer one's transaction (its inputs added), and only the
    outermost commits.

    Parameters
    ----------
    inputs : dict, optional
        ``{label: path}`` of the run's inputs (see :func:`check_outputs`).

    Yields
    ------
    Outputs
    """
    if _CURRENT:
        tx = _CURRENT[-1]
        for k, v in (inputs or {}).items():
            tx.inputs.setdefault(k, v)
        yield tx
        return
    tx = Outputs(inputs)
    _CURRENT.append(tx)
    try:
        with tx:
            yield tx
    finally:
        _CURRENT.remove(tx)


def write_text(path, text, label: str = "output", inputs: dict | None = None) -> None:
    """Write ``text`` (a str or an iterable of str) to ``path`` through the run's transaction
    (:func:`outputs`), or as a transaction of its own outside one.

    Parameters
    ----------
    path : path-like
        Destination: a regular file (written atomically) or a stream.
    text : str or iterable of str
    label : str
        The option or key that named ``path``, for messages.
    inputs : dict, optional
        ``{label: path}`` of inputs ``path`` must not be.
    """
    with outputs(inputs) as tx:
        tx.write_text(path, text, label)


@contextmanager
def open_output(path, label: str = "output", inputs: dict | None = None, binary: bool = True):
    """A file object for ``path`` in the run's transaction (as :func:`write_text`)."""
    with outputs(inputs) as tx, tx.open(path, label, binary=binary) as fh:
        yield fh


@contextmanager
def output_directory(out_dir, names, label: str = "output", inputs: dict | None = None):
    """A staged folder for the files ``names`` of ``out_dir`` in the run's transaction (as
    :func:`write_text`); yields the folder to write them in."""
    with outputs(inputs) as tx, tx.directory(out_dir, names, label) as tmp:
        yield tmp
