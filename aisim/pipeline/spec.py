"""Pipeline specs: a strict TOML file -> :class:`PipelineSpec`.

A spec names where traces come from, how each row gets its model, which
engine configurations each model is deployed on, where results land and
under which run name.  ``pipelines/README.md`` documents every key; the
shape is::

    name = "demo"                     # run name
    database = "demo.duckdb"          # DuckDB file, relative to the spec

    [replay]                          # optional
    closed_loop = false               # send a session's next turn when the previous finishes
    think_time_s = 1.0                # ... plus this (default: the trace's gap between turns)
    reject_too_long = false           # reject prompts of max_model_len tokens or more, as vLLM's server does
    # rate_scale = 2.0                # load: arrivals divided by this (aisim.traces.load), or
    # poisson_rate = 5.0              # ... requests re-timed as a Poisson process of this rate
    # seed = 0                        # ... with this seed
    # max_concurrency = 16            # the client sends at most this many requests at a time

    [landing]                         # optional
    staging = "s3://bucket/aisim"     # where workers write Parquet (default: <database>.staging)
    lock_timeout_s = 60.0             # how long landing waits for another writer's lock
    keep_parquet = false              # true: requests/steps stay Parquet files, the database has views
    parquet_dir = "demo.parquet"      # ... kept here (default: <database>.parquet)

    [window]                          # optional
    start_s = 0.0                     # timed traces: keep [start_s, end_s)
    end_s = 600.0
    start_step = 0                    # stepped traces: keep [start_step, end_step)
    end_step = 5000

    [[sources]]
    name = "chat"                     # optional, unique
    paths = ["../examples/*.jsonl"]   # paths or globs, relative to the spec
    format = "oracle"                 # optional: guessed from the file name
    model = "llama-3.1-8b"            # a fixed model, or:
    # model_column = "model"          # the trace's model column, and/or
    # model_map = { "meta-llama/Llama-3.1-8B" = "llama-3.1-8b" }
    request_id_prefix = ""            # optional, keeps ids unique across sources
    options = {}                      # reader options

    [[deployments]]
    model = "llama-3.1-8b"
    engines = { base = "../examples/engine.json" }   # name -> file or inline table
    # or replicas of an engine behind a router (aisim.deploy), one shard:
    # engines.fleet = { engine = "../examples/engine.json", deployment = "fleet.toml" }

Loading is strict: an unknown key, a wrong type or a missing required key is
a :class:`SpecError` naming the key and the file.  Relative paths are relative
to the spec file's directory.  Globs are expanded and files fingerprinted by
:func:`resolve_inputs`, at run time, so a spec can be checked without its data.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
import re
from dataclasses import dataclass, field

from aisim.errors import ConfigError, SpecError
from aisim.textin import decode_utf8, read_bytes
from aisim.traces.load import LOAD_KEYS


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_TOP_KEYS = ("name", "description", "database", "landing", "window", "replay", "sources", "deployments")
_LANDING_KEYS = ("staging", "lock_timeout_s", "keep_parquet", "parquet_dir")
# How long landing waits for another process's database lock, unless the spec says.
LOCK_TIMEOUT_S = 60.0
_REPLAY_KEYS = ("closed_loop", "think_time_s", "reject_too_long") + LOAD_KEYS
_SOURCE_KEYS = ("name", "paths", "format", "model", "model_column", "model_map", "request_id_prefix", "options")
_DEPLOYMENT_KEYS = ("model", "engines")
# An engine entry that replays a deployment: the engine (file or inline table) and the deployment
# (a deployment file, or the inline mapping of replicas and router).
_ENGINE_ENTRY_KEYS = ("engine", "deployment")
_WINDOW_KEYS = ("start_s", "end_s", "start_step", "end_step")


@dataclass(frozen=True)
class Window:
    """Arrival window; ``None`` bounds are open.

    Timed traces keep rows with ``start_s <= arrival_s < end_s`` and stepped
    traces rows with ``start_step <= arrival_step < end_step``; arrivals are
    then shifted so that the window's start is the trace's time zero.
    """

    start_s: float | None = None
    end_s: float | None = None
    start_step: int | None = None
    end_step: int | None = None

    def to_dict(self) -> dict:
        return {"start_s": self.start_s, "end_s": self.end_s,
                "start_step": self.start_step, "end_step": self.end_step}

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.to_dict().values())


@dataclass(frozen=True)
class Landing:
    """Where a run's results go on their way to the database, and how they land.

    Attributes
    ----------
    staging : str or None
        Directory or fsspec URL the workers write Parquet to; None: beside
        the database (:func:`aisim.pipeline.staging.default_staging`).
    lock_timeout_s : float
        How long landing waits for another process's database lock.
    keep_parquet : bool
        Keep ``requests`` and ``steps`` as Parquet files (under
        ``parquet_dir``) with views over them in the database.
    parquet_dir : str or None
        Where ``keep_parquet`` keeps them; None: ``<database>.parquet``.
    """

    staging: str | None = None
    lock_timeout_s: float = LOCK_TIMEOUT_S
    keep_parquet: bool = False
    parquet_dir: str | None = None


@dataclass(frozen=True)
class Source:
    """Where trace rows come from and how each row gets its model.

    Exactly one way of naming the model: ``model`` (every row), or
    ``model_column`` and/or ``model_map`` (the column's value, renamed through
    the map when the map has it; ``model_column`` defaults to ``"model"``).
    """

    name: str
    paths: tuple
    format: str | None = None
    model: str | None = None
    model_column: str | None = None
    model_map: tuple = ()  # sorted (trace value, model) pairs
    request_id_prefix: str = ""
    options: tuple = ()  # sorted (key, value) pairs of reader options

    def to_dict(self) -> dict:
        return {"name": self.name, "paths": list(self.paths), "format": self.format, "model": self.model,
                "model_column": self.model_column, "model_map": dict(self.model_map),
                "request_id_prefix": self.request_id_prefix, "options": dict(self.options)}


@dataclass(frozen=True)
class Engine:
    """One engine configuration of a deployment.

    ``config`` is the raw dictionary (vLLM key names) as the file or the inline
    table gives it (the run key hashes it); ``engine`` is the
    :class:`~aisim.config.engine.EngineConfig` validated from it once, when the
    spec loads, and handed to the shard task as it is.  With ``deployment``
    (a :class:`~aisim.config.deployment.DeploymentConfig`) the shard replays
    that many replicas of the engine behind its router (:func:`aisim.deploy.deploy`).
    """

    name: str
    config: dict = field(hash=False)
    path: str | None = None  # as written in the spec; None for an inline table
    source: str = ""  # where the configuration came from, for messages
    engine: object = field(default=None, hash=False, compare=False, repr=False)  # the EngineConfig
    deployment: object = field(default=None, hash=False)  # the DeploymentConfig, or None: one engine
    deployment_path: str | None = None  # the deployment file as written; None when inline or absent
    deployment_source: str = ""  # the deployment file (absolute), for the run key

    def to_dict(self) -> dict:
        out = {"name": self.name, "path": self.path, "config": self.config}
        if self.deployment is not None:  # absent otherwise: a spec without deployments keeps its run key
            out["deployment"] = self.deployment.to_dict()
            out["deployment_path"] = self.deployment_path
        return out


@dataclass(frozen=True)
class Deployment:
    """A model and the engine configurations it is replayed on (one shard each)."""

    model: str
    engines: tuple


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline spec.

    Attributes
    ----------
    name : str
        Run name; runs of the same spec share it.
    database : str
        DuckDB file, absolute.
    sources : tuple of Source
    deployments : tuple of Deployment
        Sorted by model.
    window : Window
    description : str
    path : str or None
        The spec file (absolute), None for a spec built from a dictionary.
    base_dir : str
        Directory relative paths are resolved against.
    sections : dict
        Key -> validated section, for the sections other rooms plug in
        (:mod:`aisim.pipeline.sections`; ``capacity``).
    overrides : tuple
        The ``--set`` changes every engine (and deployment) carries (:func:`with_overrides`), in
        order; part of the run's identity.
    """

    name: str
    database: str
    sources: tuple
    deployments: tuple
    window: Window = field(default_factory=Window)
    description: str = ""
    path: str | None = None
    base_dir: str = "."
    replay: dict = field(default_factory=lambda: {"closed_loop": False, "think_time_s": None})
    landing: Landing = field(default_factory=lambda: Landing())
    sections: dict = field(default_factory=dict)
    overrides: tuple = ()  # ``--set`` (key, value) pairs applied to every engine (with_overrides)

    @property
    def models(self) -> tuple:
        """Deployed models, sorted."""
        return tuple(d.model for d in self.deployments)

    def shards(self) -> list:
        """``(model, engine)`` pairs in shard order: by model, then engine name."""
        return [(d.model, e) for d in self.deployments for e in d.engines]

    def canonical(self) -> dict:
        """The spec as plain data, independent of key order and of the database path.

        The run key hashes this together with the input fingerprints; the
        description and the database are left out (they do not change results).
        """
        out = {
            "name": self.name,
            "window": self.window.to_dict(),
            "replay": dict(self.replay),
            "sources": [s.to_dict() for s in self.sources],
            "deployments": [{"model": d.model, "engines": [e.to_dict() for e in d.engines]}
                            for d in self.deployments],
        }
        if self.sections:  # a spec without them keeps the run key it had before sections existed
            out["sections"] = {k: self.sections[k].to_dict() for k in sorted(self.sections)}
        if self.overrides:  # likewise a run without --set
            out["overrides"] = [[k, v] for k, v in self.overrides]
        return out


def with_overrides(spec: PipelineSpec, sets: list) -> PipelineSpec:
    """``spec`` with ``--set``'s changes (:func:`aisim.config.overrides.parse_sets`' pairs) made to every
    engine and deployment, each validated again; the changes join the canonical spec, so the run key
    of a run with them differs from the run without.

    Raises
    ------
    ConfigError
        A value an engine or a deployment refuses (named with the shard's engine).
    """
    from dataclasses import replace

    from aisim.config.overrides import apply_deployment, apply_engine, changed_raw
    from aisim.errors import ConfigError

    if not sets:
        return spec
    deployments = []
    for d in spec.deployments:
        engines = []
        for e in d.engines:
            config = changed_raw(e.config, sets)
            try:
                engine = apply_engine(e.engine, sets)
                deployment = apply_deployment(e.deployment, sets, e.deployment_source or None)
            except ConfigError as exc:
                raise ConfigError(f"--set on model '{d.model}', engine '{e.name}': {exc}") from None
            engines.append(replace(e, config=config, engine=engine, deployment=deployment))
        deployments.append(replace(d, engines=tuple(engines)))
    return replace(spec, deployments=tuple(deployments), overrides=spec.overrides + tuple(sets))


# ---------------------------------------------------------------------------- loading


def load_spec(path: str | os.PathLike) -> PipelineSpec:
    """Read and validate a pipeline spec (TOML).

    Parameters
    ----------
    path : path-like
        The ``.toml`` file.

    Returns
    -------
    PipelineSpec

    Raises
    ------
    SpecError
        Unreadable or invalid TOML, an unknown key, a wrong type, a missing
        required key; the message names the key and the file.
    ConfigError
        An engine configuration is invalid (named by its file and key).
    """
    path = os.path.abspath(os.fspath(path))
    raw = read_toml(path, "pipeline spec", SpecError)
    return spec_from_dict(raw, source=path, base_dir=os.path.dirname(path))


def read_toml(path: str, what: str, error=None) -> dict:
    """A TOML file as a dict; unreadable or invalid files raise ``error`` naming ``what`` and the path."""
    import tomllib

    error = error or SpecError
    data = read_bytes(path, error, what)
    try:
        return tomllib.loads(decode_utf8(data, path, error))
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None


def spec_from_dict(raw: dict, source: str | None = None, base_dir: str | None = None) -> PipelineSpec:
    """Validate ``raw`` (a parsed spec) strictly and build a :class:`PipelineSpec`.

    Parameters
    ----------
    raw : dict
        The spec's keys.
    source : str, optional
        The file it came from, named in error messages.
    base_dir : str, optional
        Directory relative paths are resolved against (default: the current one).
    """
    from aisim.pipeline import sections as plugged

    base_dir = os.path.abspath(base_dir or os.getcwd())
    v = _Validator(source)
    if isinstance(raw, dict):
        for k in raw:
            if k in plugged.KNOWN and plugged.section(k) is None:
                raise plugged.unplugged(k, v.where)
    v.mapping(raw, "", _TOP_KEYS + plugged.keys())
    name = v.name(raw, "name", required=True)
    description = v.string(raw, "description", default="")
    database = v.string(raw, "database", required=True)
    if not database:
        raise v.error("database", "must be a non-empty path")
    database = os.path.abspath(os.path.join(base_dir, os.path.expanduser(database)))
    landing = _landing(v, raw.get("landing"), base_dir)
    window = _window(v, raw.get("window"))
    replay = _replay_options(v, raw.get("replay"))
    sources = _sources(v, raw.get("sources"))
    deployments = _deployments(v, raw.get("deployments"), base_dir)
    for d in deployments:
        for e in d.engines:
            if e.deployment is None:
                continue
            if replay.get("reject_too_long"):
                raise v.error("replay.reject_too_long", f"applies to a single engine's replay, not to deployment "
                              f"'{d.model}/{e.name}'")
    _check_routing(v, sources, deployments)
    extra = {k: plugged.section(k).parse(raw[k], v.where, {"replay": replay, "deployments": deployments})
             for k in plugged.keys() if k in raw}
    return PipelineSpec(name=name, database=database, sources=sources, deployments=deployments,
                        window=window, description=description, replay=replay, landing=landing,
                        path=os.path.abspath(source) if source else None, base_dir=base_dir, sections=extra)


class _Validator:
    """Type checks whose errors name ``key`` and the file."""

    def __init__(self, source):
        self.where = f" in {source}" if source else ""

    def error(self, key, message) -> SpecError:
        return SpecError(f"'{key}'{self.where} {message}")

    def mapping(self, obj, prefix, known):
        if not isinstance(obj, dict):
            raise self.error(prefix.rstrip(".") or "spec", "must be a table")
        for k in obj:
            if k not in known:
                raise SpecError(f"unknown key '{prefix}{k}'{self.where}; known keys: {', '.join(known)}")

    def string(self, obj, key, prefix="", required=False, default=None):
        if key not in obj:
            if required:
                raise SpecError(f"missing required key '{prefix}{key}'{self.where}")
            return default
        val = obj[key]
        if not isinstance(val, str):
            raise self.error(prefix + key, f"must be a string, got {val!r}")
        return val

    def name(self, obj, key, prefix="", required=False, default=None):
        val = self.string(obj, key, prefix, required, default)
        if val is not None and not _NAME_RE.match(val):
            raise self.error(prefix + key, f"must be a name of letters, digits, '_', '.' and '-', got {val!r}")
        return val

    def model(self, obj, key, prefix=""):
        val = self.string(obj, key, prefix)
        if val is not None and not val.strip():
            raise self.error(prefix + key, "must be a non-empty model name")
        return val

    def number(self, obj, key, prefix, integer):
        if key not in obj:
            return None
        val = obj[key]
        ok = isinstance(val, int) if integer else isinstance(val, (int, float)) and math.isfinite(val)
        if isinstance(val, bool) or not ok or val < 0:
            kind = "a non-negative integer" if integer else "a non-negative number"
            raise self.error(prefix + key, f"must be {kind}, got {val!r}")
        return int(val) if integer else float(val)


def _replay_options(v: _Validator, raw) -> dict:
    """``[replay]``: how sessions are driven (``closed_loop``, ``think_time_s``)."""
    out = {"closed_loop": False, "think_time_s": None}
    if raw is None:
        return out
    v.mapping(raw, "replay.", _REPLAY_KEYS)
    closed = raw.get("closed_loop", False)
    if not isinstance(closed, bool):
        raise v.error("replay.closed_loop", "must be true or false")
    think = raw.get("think_time_s")
    if think is not None and (isinstance(think, bool) or not isinstance(think, (int, float))
                              or not math.isfinite(think) or think < 0):
        raise v.error("replay.think_time_s", f"must be a finite non-negative number of seconds, got {think!r}")
    if think is not None and not closed:
        raise v.error("replay.think_time_s", "applies to closed-loop replays; set 'replay.closed_loop = true'")
    out.update(closed_loop=closed, think_time_s=None if think is None else float(think))
    reject = raw.get("reject_too_long", False)
    if not isinstance(reject, bool):
        raise v.error("replay.reject_too_long", "must be true or false")
    if reject and closed:
        raise v.error("replay.reject_too_long", "does not apply to closed-loop replays")
    if reject:  # only when set: a spec without it keeps its run key
        out["reject_too_long"] = True
    from aisim.traces.load import check_load

    try:
        load = check_load({k: raw[k] for k in LOAD_KEYS if k in raw}, v.where, "replay.")
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
    if load and closed:
        key = next(k for k in ("rate_scale", "poisson_rate", "max_concurrency") if k in load)
        raise v.error(f"replay.{key}", "shapes open-loop replays; a closed loop paces each turn by the previous one")
    out.update(load)  # likewise only when set
    return out


def _landing(v: _Validator, raw, base_dir) -> Landing:
    """``[landing]``: staging location, lock timeout, Parquet store (none of it changes results)."""
    if raw is None:
        return Landing()
    v.mapping(raw, "landing.", _LANDING_KEYS)

    def place(key):
        val = v.string(raw, key, "landing.")
        if val is None:
            return None
        if not val:
            raise v.error(f"landing.{key}", "must be a non-empty path or URL")
        return val if "://" in val else os.path.abspath(os.path.join(base_dir, os.path.expanduser(val)))

    keep = raw.get("keep_parquet", False)
    if not isinstance(keep, bool):
        raise v.error("landing.keep_parquet", f"must be true or false, got {keep!r}")
    timeout = v.number(raw, "lock_timeout_s", "landing.", False)
    parquet_dir = place("parquet_dir")
    if parquet_dir is not None and not keep:
        raise v.error("landing.parquet_dir", "applies with 'landing.keep_parquet = true'")
    return Landing(staging=place("staging"), lock_timeout_s=LOCK_TIMEOUT_S if timeout is None else timeout,
                   keep_parquet=keep, parquet_dir=parquet_dir)


def _window(v: _Validator, raw) -> Window:
    if raw is None:
        return Window()
    v.mapping(raw, "window.", _WINDOW_KEYS)
    w = Window(start_s=v.number(raw, "start_s", "window.", False), end_s=v.number(raw, "end_s", "window.", False),
               start_step=v.number(raw, "start_step", "window.", True),
               end_step=v.number(raw, "end_step", "window.", True))
    for lo, hi in (("start_s", "end_s"), ("start_step", "end_step")):
        a, b = getattr(w, lo), getattr(w, hi)
        if a is not None and b is not None and b <= a:
            raise v.error(f"window.{hi}", f"({b}) must be greater than 'window.{lo}' ({a})")
    return w


def check_reader_options(fmt, options, prefix: str, where: str) -> None:
    """Refuse an unknown format or a reader option its format's reader does not take.

    Without a format (guessed per file) an option must be one some reader
    takes; :func:`resolve_inputs` checks it again against each file's format.

    Raises
    ------
    SpecError
        Naming ``{prefix}format`` or ``{prefix}options.KEY`` and ``where`` (`` in FILE``).
    """
    from aisim.traces import READERS

    if fmt is not None and (not isinstance(fmt, str) or fmt not in READERS):
        raise SpecError(f"'{prefix}format'{where} must be one of {', '.join(sorted(READERS))}, got {fmt!r}")
    if not options:
        return
    readers = [READERS[fmt]] if fmt is not None else list(READERS.values())
    for k in options:
        if not any(_accepts(r, k) for r in readers):
            raise SpecError(f"unknown key '{prefix}options.{k}'{where}: the "
                            f"{repr(fmt) + ' ' if fmt else ''}trace reader takes no option '{k}'")


def _reader_options(v: _Validator, fmt, options, prefix):
    check_reader_options(fmt, options, prefix, v.where)


def _accepts(reader, key) -> bool:
    try:
        params = inspect.signature(reader).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return key in params and key != "path"


def _sources(v: _Validator, raw) -> tuple:
    if raw is None:
        raise SpecError(f"missing required key 'sources'{v.where}: give at least one [[sources]] table")
    if not isinstance(raw, list) or not raw:
        raise v.error("sources", "must be a non-empty array of tables ([[sources]])")
    out, names = [], set()
    for i, s in enumerate(raw):
        p = f"sources[{i}]."
        v.mapping(s, p, _SOURCE_KEYS)
        paths = s.get("paths")
        if paths is None:
            raise SpecError(f"missing required key '{p}paths'{v.where}")
        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not paths or not all(isinstance(x, str) and x for x in paths):
            raise v.error(p + "paths", "must be a path or a non-empty array of paths (globs allowed)")
        name = v.name(s, "name", p, default=f"source-{i}")
        if name in names:
            raise v.error(p + "name", f"repeats source name {name!r}")
        names.add(name)
        fmt = v.string(s, "format", p)
        model = v.model(s, "model", p)
        column = v.string(s, "model_column", p)
        mapping = s.get("model_map")
        if mapping is not None:
            if not isinstance(mapping, dict) or not all(isinstance(x, str) and x for x in mapping.values()):
                raise v.error(p + "model_map", "must be a table of trace model names to model names")
        if model is not None and (column is not None or mapping is not None):
            raise v.error(p + "model", "excludes 'model_column' and 'model_map': give a fixed model or a column")
        if model is None and column is None and mapping is None:
            raise SpecError(f"missing key{v.where}: source '{name}' ({p.rstrip('.')}) needs 'model' (a fixed "
                            "model), 'model_column' (the trace's column) or 'model_map' (a renaming of it)")
        if model is None and column is None:
            column = "model"
        if column is not None and not column:
            raise v.error(p + "model_column", "must be a column name")
        prefix = v.string(s, "request_id_prefix", p, default="")
        options = s.get("options", {})
        if not isinstance(options, dict):
            raise v.error(p + "options", "must be a table of reader options")
        _reader_options(v, fmt, options, p)
        out.append(Source(name=name, paths=tuple(paths), format=fmt, model=model, model_column=column,
                          model_map=tuple(sorted((mapping or {}).items())), request_id_prefix=prefix,
                          options=tuple(sorted(options.items()))))
    return tuple(out)


def _deployments(v: _Validator, raw, base_dir) -> tuple:
    from aisim.config.engine import EngineConfig, engine_config_from_dict

    if raw is None:
        raise SpecError(f"missing required key 'deployments'{v.where}: give at least one [[deployments]] table")
    if not isinstance(raw, list) or not raw:
        raise v.error("deployments", "must be a non-empty array of tables ([[deployments]])")
    out = {}
    for i, d in enumerate(raw):
        p = f"deployments[{i}]."
        v.mapping(d, p, _DEPLOYMENT_KEYS)
        model = v.model(d, "model", p)
        if model is None:
            raise SpecError(f"missing required key '{p}model'{v.where}")
        if model in out:
            raise v.error(p + "model", f"repeats model {model!r}; give one deployment per model with several engines")
        engines = d.get("engines")
        if engines is None:
            raise SpecError(f"missing required key '{p}engines'{v.where}")
        if isinstance(engines, list):  # a list of files: each named by its file stem
            if not all(isinstance(x, str) for x in engines):
                raise v.error(p + "engines", "must be a table of name = file or inline table, or a list of files")
            named = {}
            for x in engines:
                stem = os.path.splitext(os.path.basename(x))[0]
                if stem in named:
                    raise v.error(p + "engines", f"names two files '{stem}'; use a table of names to files")
                named[stem] = x
            engines = named
        if not isinstance(engines, dict) or not engines:
            raise v.error(p + "engines", "must be a non-empty table of name = file or inline table")
        built = []
        for ename in sorted(engines):
            spec = engines[ename]
            key = f"{p}engines.{ename}"
            if not _NAME_RE.match(ename):
                raise v.error(key, "is not a valid engine name (letters, digits, '_', '.', '-')")
            fleet = {}
            if isinstance(spec, dict) and "deployment" in spec:  # replicas of the engine behind a router
                fleet = _deployment_entry(v, spec, key, base_dir)
                spec = spec["engine"]
            # Each engine is validated here, once; shard tasks receive the EngineConfig.
            if isinstance(spec, str):
                file = os.path.abspath(os.path.join(base_dir, os.path.expanduser(spec)))
                cfg = read_config_file(file, f"'{key}'{v.where}")
                built.append(Engine(name=ename, config=cfg, path=spec, source=file,
                                    engine=engine_config_from_dict(cfg, source=file), **fleet))
            elif isinstance(spec, dict):
                where = f"{v.where.removeprefix(' in ')} [{key}]" if v.where else f"[{key}]"
                built.append(Engine(name=ename, config=dict(spec), path=None, source=where,
                                    engine=engine_config_from_dict(spec, source=where), **fleet))
            elif isinstance(spec, EngineConfig):  # validated already (a sweep candidate)
                where = f"{v.where.removeprefix(' in ')} [{key}]" if v.where else f"[{key}]"
                built.append(Engine(name=ename, config=copy.deepcopy(spec.raw), path=None, source=where,
                                    engine=spec, **fleet))
            else:
                raise v.error(key, "must be a file name or an inline table of engine keys")
        out[model] = Deployment(model=model, engines=tuple(built))
    return tuple(out[m] for m in sorted(out))


def _deployment_entry(v: _Validator, entry: dict, key: str, base_dir: str) -> dict:
    """An engine entry ``{ engine = ..., deployment = ... }``: the :class:`Engine` fields of its deployment.

    ``deployment`` is a deployment file (JSON, TOML or YAML holding one mapping, ``deployment``)
    or the inline mapping itself (``{ replicas = 4, router = "kv_aware" }``); both are validated
    by :mod:`aisim.config.deployment`, whose errors name the key.
    """
    from aisim.config.deployment import DeploymentConfig, load_deployment_config, parse_deployment
    from aisim.config.engine import EngineConfig, load_engine_config

    v.mapping(entry, f"{key}.", _ENGINE_ENTRY_KEYS)
    if "engine" not in entry:
        raise SpecError(f"missing required key '{key}.engine'{v.where}: a deployment entry names its engine "
                        "(a file or an inline table) and its deployment")
    if not isinstance(entry["engine"], (str, dict, EngineConfig)):
        raise v.error(f"{key}.engine", "must be a file name or an inline table of engine keys")
    raw = entry["deployment"]
    if isinstance(raw, DeploymentConfig):  # validated already (a sweep candidate)
        out = {"deployment": raw}
    elif isinstance(raw, str):
        file = os.path.abspath(os.path.join(base_dir, os.path.expanduser(raw)))
        if not os.path.isfile(file):
            raise v.error(f"{key}.deployment", f"names {raw!r}, which is not a file")
        out = {"deployment": load_deployment_config(file), "deployment_path": raw, "deployment_source": file}
    elif isinstance(raw, dict):
        where = f"{v.where.removeprefix(' in ')} [{key}]" if v.where else f"[{key}]"
        raw = dict(raw)
        for name in ("prefill", "decode"):  # a pool's engine file is relative to the spec
            pool = raw.get(name)
            if isinstance(pool, dict) and isinstance(pool.get("engine"), str) and pool["engine"]:
                raw[name] = dict(pool, engine=os.path.join(base_dir, os.path.expanduser(pool["engine"])))
        out = {"deployment": parse_deployment(raw, source=where)}
    else:
        raise v.error(f"{key}.deployment", "must be a deployment file or an inline table (replicas, router)")
    fleet = out["deployment"]
    if fleet.disaggregated:  # a pool's own engine file is validated here, as the spec's engines are
        for name, pool in (("prefill", fleet.prefill), ("decode", fleet.decode)):
            if isinstance(pool.engine, str):
                if not os.path.isfile(pool.engine):
                    raise v.error(f"{key}.deployment.{name}.engine", f"names {pool.engine!r}, which is not a file")
                load_engine_config(pool.engine)
    return out


def _check_routing(v: _Validator, sources, deployments) -> None:
    deployed = {d.model for d in deployments}
    for i, s in enumerate(sources):
        if s.model is not None and s.model not in deployed:
            raise v.error(f"sources[{i}].model", f"names {s.model!r}, which has no [[deployments]] entry; "
                          f"deployed: {', '.join(sorted(deployed))}")
    if all(s.model is not None for s in sources):
        fed = {s.model for s in sources}
        for i, d in enumerate(deployments):
            if d.model not in fed:
                raise v.error("deployments", f"deploy {d.model!r}, but no source gives it rows (no source has "
                              "model = this name, and none takes models from a column)")


def read_config_file(path: str, named_by: str = "") -> dict:
    """An engine configuration file as a raw dictionary (errors as :class:`SpecError`)."""
    from aisim.config.engine import read_config_file as read_engine_file

    try:
        return read_engine_file(path, named_by)
    except ConfigError as exc:
        raise SpecError(str(exc)) from None
