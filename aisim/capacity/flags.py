"""``aisim capacity`` from flags: the same spec as a file, written on the command line.

Each flag is a key of the spec file (:mod:`aisim.capacity.spec`), so the flags build the very
mapping a file would hold and the one validator reads it::

    --name N --db FILE --engine FILE --deployment FILE --price-per-gpu-hour P
    --trace PATH [--trace-format F]               [trace] path, format
    --slo KEY=VALUE ...                           [slo]   e.g. ttft_p99_s=0.5 attainment=0.95
    --rate KEY=VALUE ...  (or --rate alone)       [rate]  e.g. by=poisson_rate start=4
    --fleet KEY=VALUE ...                         [fleet] e.g. max_replicas=8 grid={"max_num_seqs":[64,128]}

Values are read as TOML would type them (numbers, ``true``/``false``, JSON lists and tables, else
text).  ``--model M --gpu G [--tp N]`` instead of ``--engine`` plans the engine as ``aisim plan`` does
and reads the plan back as the spec's engine file (``aisim.capacity.cli``).  ``--write-spec FILE`` writes the spec the flags make, to run again from the file.
"""

from __future__ import annotations

import json
import os

from aisim.errors import ConfigError


def _value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _pairs(items, option: str) -> dict:
    out = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"{option} {item!r}: give KEY=VALUE")
        if key in out:
            raise ConfigError(f"{option} {key} is given twice")
        out[key] = _value(text.strip())
    return out


def spec_dict(*, name, database, engine, deployment, trace, trace_format, slo, rate, fleet, price) -> dict:
    """The capacity spec the flags make, as its TOML file would hold it (relative paths as given).

    ``rate`` is None when ``--rate`` was not given, else its ``KEY=VALUE`` items (possibly none).
    """
    raw = {"name": name, "database": database}
    if engine is not None:
        raw["engine"] = engine
    if deployment is not None:
        raw["deployment"] = deployment
    if price is not None:
        raw["price_per_gpu_hour"] = price
    raw["trace"] = {"path": trace, **({"format": trace_format} if trace_format else {})}
    raw["slo"] = _pairs(slo, "--slo")
    if rate is not None:
        raw["rate"] = _pairs(rate, "--rate")
    if fleet:
        raw["fleet"] = _pairs(fleet, "--fleet")
    return raw


def spec_from_flags(raw: dict):
    """Validate :func:`spec_dict`'s mapping as a file's, paths relative to the working directory."""
    from aisim.capacity.spec import capacity_from_dict

    return capacity_from_dict(raw)


def write_spec(path: str, raw: dict) -> None:
    """Write the spec the flags made as a TOML file, paths relative to it."""
    from aisim.config.toml_out import dumps
    from aisim.files import write_text

    base = os.path.dirname(os.path.abspath(path))

    def rel(p):
        return os.path.relpath(os.path.abspath(p), base)

    doc = dict(raw)
    doc["database"] = rel(raw["database"])
    doc["engine"] = rel(raw["engine"])
    if isinstance(raw.get("deployment"), str):
        doc["deployment"] = rel(raw["deployment"])
    doc["trace"] = {**raw["trace"], "path": rel(raw["trace"]["path"])}
    order = ["name", "database", "engine", "deployment", "price_per_gpu_hour", "trace", "slo", "rate", "fleet"]
    write_text(path, [dumps({k: doc[k] for k in order if k in doc},
                            header_comments=["Capacity spec written by aisim capacity --write-spec."])],
               "--write-spec", inputs={"the engine": raw["engine"], "the trace": raw["trace"]["path"]})
