"""A run's staging location: where workers write Parquet and the driver lands from.

A staging location is a local directory or an fsspec URL (``s3://bucket/prefix``
with the ``aisim[s3]`` extra, ``gs://``, ``memory://`` for tests ...).  Every
run has its own directory in it, named by its run key::

    <staging>/<run_id>/
        input/...                      the trace rows, read in blocks and grouped by model
        shards/00003/shards.parquet    one row: the shard
        shards/00003/summaries.parquet one row: its replay summary
        shards/00003/requests-00000.parquet, requests-00001.parquet, ...
        shards/00003/steps-00000.parquet, ...
        run.json                       the manifest: the runs row and every file, in landing order

Workers write the files (:class:`Staging` is plain data, so it pickles to any
worker); a file appears under its name only once it is complete (written
under a temporary name and renamed on a local file system; one upload on an
object store), so a worker killed mid-write leaves no partial file under a
final name, and a retried task rewrites the same names with the same bytes.
The driver writes ``run.json`` last: a run directory without it is an
unfinished run, which :func:`aisim.pipeline.landing.land_staged` refuses.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid

from aisim.errors import PipelineError

MANIFEST = "run.json"
# Parquet compression of staged files: fast to write and to land (they live until landing).
STAGED_COMPRESSION = "lz4"
MANIFEST_FORMAT = 1
# Suffix of files being written; never part of a manifest.
_PARTIAL = ".partial-"


def default_staging(database: str) -> str:
    """The staging location of a database without one configured: ``<database>.staging`` beside it."""
    return os.path.abspath(database) + ".staging"


def _is_url(location: str) -> bool:
    return "://" in location


class Staging:
    """A staging location (a local directory or an fsspec URL).

    Parameters
    ----------
    location : str
        A path (made absolute) or a URL.

    Notes
    -----
    The fsspec file system is made on first use in each process; the object
    itself holds only the location, so it travels to workers as plain data.
    """

    def __init__(self, location: str):
        location = os.fspath(location)
        if not location:
            raise PipelineError("the staging location is empty")
        if location.startswith("file://"):
            location = location[len("file://"):]
        self.location = location if _is_url(location) else os.path.abspath(os.path.expanduser(location))
        self.local = not _is_url(self.location)
        self._fs = None

    def __getstate__(self):
        return {"location": self.location, "local": self.local}

    def __setstate__(self, state):
        self.location, self.local, self._fs = state["location"], state["local"], None

    def __repr__(self):
        return f"Staging({self.location!r})"

    # ------------------------------------------------------------------ the file system

    @property
    def fs(self):
        """The fsspec file system of the location (errors name the location)."""
        if self._fs is None:
            self._fs = filesystem(self.location)
        return self._fs

    @property
    def protocol(self) -> str:
        """``"file"`` for a local directory, else the URL's scheme."""
        return "file" if self.local else self.location.split("://", 1)[0]

    def path(self, *parts: str) -> str:
        """The location of ``parts`` below the staging root (a path, or a URL)."""
        join = os.path.join if self.local else posixpath.join
        return join(self.location, *parts)

    def run_path(self, run_id: str, *parts: str) -> str:
        """The location of ``parts`` inside the run's directory."""
        return self.path(run_id, *parts)

    # ------------------------------------------------------------------ checks

    def check_writable(self) -> None:
        """Write and remove a probe file, before any work is done.

        Raises
        ------
        PipelineError
            The location's scheme is unknown, its package missing, or it
            cannot be written; the message names the location.
        """
        probe = self.path(f".aisim-probe-{uuid.uuid4().hex}")
        try:
            if self.local:
                os.makedirs(self.location, exist_ok=True)
            else:
                self.fs.makedirs(self.location, exist_ok=True)
            with self.fs.open(probe, "wb") as fh:
                fh.write(b"aisim")
            self.fs.rm(probe)
        except PipelineError:
            raise
        except (OSError, ValueError, PermissionError) as exc:
            raise PipelineError(f"cannot write to the staging location {self.location}: "
                                f"{getattr(exc, 'strerror', None) or exc}") from None

    # ------------------------------------------------------------------ writing

    def write_bytes(self, target: str, data: bytes) -> None:
        """Write ``data`` to ``target`` (a location from :meth:`path`) all at once."""
        with self.open_atomic(target) as fh:
            fh.write(data)

    def open_atomic(self, target: str):
        """A binary file object whose contents appear at ``target`` only when it is closed without error."""
        return _AtomicFile(self, target)

    def write_parquet(self, target: str, table) -> None:
        """Write an Arrow table as one Parquet file at ``target`` (atomically)."""
        import pyarrow.parquet as pq

        with self.open_atomic(target) as fh:
            pq.write_table(table, fh, compression=STAGED_COMPRESSION)

    def write_json(self, target: str, obj) -> None:
        self.write_bytes(target, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())

    # ------------------------------------------------------------------ reading

    def read_json(self, target: str):
        with self.fs.open(target, "rb") as fh:
            return json.loads(fh.read().decode())

    def exists(self, target: str) -> bool:
        return self.fs.exists(target)

    def runs(self) -> list:
        """Run ids with a complete manifest in this location, sorted."""
        try:
            names = self.fs.ls(self.location, detail=False)
        except (FileNotFoundError, OSError):
            return []
        out = []
        for name in names:
            base = posixpath.basename(name.rstrip("/"))
            if not base.startswith(".") and self.fs.exists(self.path(base, MANIFEST)):
                out.append(base)
        return sorted(out)

    # ------------------------------------------------------------------ removing

    def remove_run(self, run_id: str) -> None:
        """Remove the run's directory (missing is fine); the staging root stays."""
        target = self.run_path(run_id)
        try:
            if self.fs.exists(target):
                self.fs.rm(target, recursive=True)
        except FileNotFoundError:
            pass
        self.remove_if_empty()

    def remove_if_empty(self) -> None:
        """Remove a local staging root that holds nothing (the default location goes away with its last run,
        and a run that staged nothing leaves none behind)."""
        if self.local:
            try:
                os.rmdir(self.location)  # only when empty
            except OSError:
                pass


class _AtomicFile:
    """Write to a temporary name beside the target, rename it into place on close."""

    def __init__(self, staging: Staging, target: str):
        self.staging, self.target = staging, target
        self.tmp = f"{target}{_PARTIAL}{uuid.uuid4().hex[:12]}"
        from aisim.files import step

        step("create")
        fs = staging.fs
        parent = os.path.dirname(target) if staging.local else posixpath.dirname(target)
        fs.makedirs(parent, exist_ok=True)
        # An object store has no rename worth the name: one upload is already all or nothing.
        self.fh = fs.open(self.tmp if staging.local else target, "wb")

    def write(self, data):
        return self.fh.write(data)

    def tell(self):
        return self.fh.tell()

    def flush(self):
        return self.fh.flush()

    def seek(self, *args):
        return self.fh.seek(*args)

    @property
    def closed(self):
        return self.fh.closed

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None:
            from aisim.files import step

            try:
                step("write")
                self.fh.close()
                if self.staging.local:
                    step("rename")
                    os.replace(self.tmp, self.target)
                return False
            except BaseException:
                self.__exit__(OSError, None, None)  # the partial file goes
                raise
        try:
            if self.staging.local:
                self.fh.close()
                os.unlink(self.tmp)
            else:
                discard = getattr(self.fh, "discard", None)  # fsspec buffered uploads
                if discard is not None:
                    discard()
                else:
                    self.fh.close()
                    self.staging.fs.rm(self.target)
        except Exception:
            pass
        return False


def filesystem(location: str):
    """The fsspec file system of ``location``; a clear error for an unknown scheme or a missing package.

    Raises
    ------
    PipelineError
        Naming the location, and the extra to install when fsspec names one.
    """
    import fsspec

    if not _is_url(location):
        return fsspec.filesystem("file")
    scheme = location.split("://", 1)[0]
    try:
        fs, _ = fsspec.core.url_to_fs(location)
    except ImportError as exc:
        hint = " (pip install 'aisim[s3]')" if scheme in ("s3", "s3a") else ""
        raise PipelineError(f"cannot use the staging location {location}: {exc}{hint}") from None
    except ValueError as exc:
        raise PipelineError(f"cannot use the staging location {location}: {exc}") from None
    return fs
