"""Writing files all or nothing: the one place aisim puts results on disk.

Every file aisim writes for a user (replay outputs, decision logs, Parquet traces, plans,
the best sweep configuration, reports) goes through here: it is written
under a temporary name beside its destination and renamed into place only
when complete, so an interrupted or failed write never leaves a partial
file, and an existing file is replaced in one step.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager


def _ordinary_permissions(path: str) -> None:
    # mkstemp/mkdtemp create private (0600/0700) entries; give the result the
    # permissions an ordinary file would get under the process's umask.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_atomic_text(path: str, lines) -> None:
    """Write ``lines`` (an iterable of str) to ``path`` through a temporary file renamed into place.

    Parameters
    ----------
    path : str
        Destination; its directory is created when missing.
    lines : iterable of str
        Written as given (include the newlines).
    """
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".aisim-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line)
        _ordinary_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def atomic_files(out_dir: str, names):
    """Write the files ``names`` into ``out_dir`` all together or not at all.

    Yields a temporary directory beside ``out_dir``; the caller writes each of
    ``names`` there.  When the block ends without an error, every file is
    moved into ``out_dir`` (created if needed); otherwise nothing is.

    Parameters
    ----------
    out_dir : str
        Destination directory.
    names : sequence of str
        File names the block writes.
    """
    out_dir = os.path.abspath(out_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".aisim-", dir=parent)
    try:
        yield tmp
        os.makedirs(out_dir, exist_ok=True)
        for name in names:
            os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_path(path: str):
    """Yield a temporary path beside ``path`` for a writer that takes a file name; renamed into place
    when the block ends without an error, removed otherwise.

    Parameters
    ----------
    path : str
        Destination; its directory is created when missing.
    """
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".aisim-", dir=os.path.dirname(path))
    os.close(fd)
    try:
        yield tmp
        _ordinary_permissions(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
