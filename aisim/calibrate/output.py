"""Writing a calibrated engine: the engine file the runs ran, its time model refitted, as TOML."""

from __future__ import annotations


def engine_document(engine) -> dict:
    """The engine's configuration as given, its ``time_model`` the fitted one with its ``calibration``."""
    import copy

    return copy.deepcopy(engine.raw)


def write_engine(path: str, result, inputs: dict | None = None) -> None:
    """Write ``result.engine`` (:class:`aisim.calibrate.fit.Calibration`) to ``path`` as an engine file.

    The file reads back (``load_engine_config``) to the calibrated engine: every key of the engine
    the runs ran, and a ``[time_model]`` with the fitted constants and ``[time_model.calibration]``.
    """
    from aisim.config.toml_out import dumps
    from aisim.files import write_text

    rec = result.record
    head = [f"Engine calibrated by aisim calibrate: '{rec['name']}', fitted on {', '.join(rec['sources'])}.",
            "Held-out errors (predicted / measured - 1) at quantiles "
            f"{', '.join(str(q) for q in rec['quantiles'])}, each file predicted by a fit on the others:"]
    head += [f"  {m}: {', '.join(f'{100 * e:+.1f}%' for e in v)}" for m, v in rec["held_out"].items()]
    write_text(path, [dumps(engine_document(result.engine), header_comments=head)], "--out", inputs=inputs)
