"""What makes a pipeline run the run it is: its input files, fingerprinted, and the run key.

The same spec over the same files (and engine files) is the same run, whatever the database,
the scheduler or the number of workers; :func:`canonical_json` is the one serialisation the key
and the shards' descriptions are hashed and compared in.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass

from aisim.errors import SpecError
from aisim.pipeline.spec import PipelineSpec, _accepts


@dataclass(frozen=True)
class InputFile:
    """One trace file a source matched, with its fingerprint."""

    source: int  # index into spec.sources
    path: str  # absolute
    display: str  # relative to the spec's directory when inside it
    format: str
    size: int
    sha256: str

    def fingerprint(self) -> dict:
        return {"source": self.source, "path": self.display, "format": self.format,
                "size": self.size, "sha256": self.sha256}


def file_sha256(path: str) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_inputs(spec: PipelineSpec) -> list:
    """Expand every source's paths and globs and fingerprint the files.

    Returns
    -------
    list of InputFile
        In source order, each source's files sorted by path.

    Raises
    ------
    SpecError
        A path that does not exist, a glob that matches nothing, a file
        matched by two sources, or a format no reader handles.
    """
    from aisim.traces import READERS, guess_format

    out, seen = [], {}
    for i, src in enumerate(spec.sources):
        files = []
        for pattern in src.paths:
            full = os.path.join(spec.base_dir, os.path.expanduser(pattern))
            if glob.has_magic(full):
                matched = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
                if not matched:
                    raise SpecError(f"source '{src.name}': no file matches '{pattern}' (in {spec.base_dir})")
            elif os.path.isfile(full):
                matched = [full]
            else:
                raise SpecError(f"source '{src.name}': trace file '{pattern}' does not exist (in {spec.base_dir})")
            files.extend(os.path.abspath(p) for p in matched)
        for path in sorted(dict.fromkeys(files)):
            if path in seen:
                raise SpecError(f"trace file {path} is matched by both source '{spec.sources[seen[path]].name}' "
                                f"and source '{src.name}'")
            seen[path] = i
            fmt = src.format or guess_format(path)
            if fmt not in READERS:
                raise SpecError(f"source '{src.name}': {path}: no reader for format '{fmt}'; "
                                f"set 'format' to one of {', '.join(sorted(READERS))}")
            for k, _ in src.options:
                if src.format is None and not _accepts(READERS[fmt], k):
                    raise SpecError(f"source '{src.name}': {path} is read as '{fmt}', whose reader takes no "
                                    f"option '{k}'; set the source's 'format'")
            out.append(InputFile(source=i, path=path, display=os.path.relpath(path, spec.base_dir), format=fmt,
                                 size=os.path.getsize(path), sha256=file_sha256(path)))
    return out


def run_key(spec: PipelineSpec, inputs: list) -> str:
    """The run's identity: 16 hex digits of SHA-256 over the canonical spec,
    the fingerprints of its input and engine files, and aisim's version.

    The same spec over the same files is the same run, whatever the database,
    the scheduler or the number of workers.
    """
    from aisim import __version__

    engines = {}
    for d in spec.deployments:
        for e in d.engines:
            if e.path is not None:
                engines[f"{d.model}/{e.name}"] = {"path": e.path, "size": os.path.getsize(e.source),
                                                 "sha256": file_sha256(e.source)}
            if e.deployment_path is not None:
                engines[f"{d.model}/{e.name}/deployment"] = {
                    "path": e.deployment_path, "size": os.path.getsize(e.deployment_source),
                    "sha256": file_sha256(e.deployment_source)}
            fleet = e.deployment
            for pool in ((fleet.prefill, fleet.decode) if fleet is not None and fleet.disaggregated else ()):
                if isinstance(pool.engine, str):  # a pool's own engine file
                    engines[f"{d.model}/{e.name}/deployment/{pool.engine}"] = {
                        "size": os.path.getsize(pool.engine), "sha256": file_sha256(pool.engine)}
    doc = {"aisim": __version__, "spec": spec.canonical(),
           "inputs": [f.fingerprint() for f in inputs], "engine_files": engines}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()[:16]


def canonical_json(obj) -> str:
    """Deterministic JSON: sorted keys, no whitespace, non-JSON values as strings."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable, allow_nan=True)


def _jsonable(o):
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, tuple):
        return list(o)
    return str(o)
