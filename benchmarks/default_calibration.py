"""The default time model's calibration record: its held-out errors on published measurements.

The roofline's fitted defaults (``aisim/config/keys.py``) were fitted on some sources of
``benchmarks/data/published_vllm.csv`` and held out the others
(``benchmarks/timing_accuracy.py``, ``benchmarks/data/README.md``).  This script replays the
held-out rows with the defaults and prints the quantiles of their signed relative errors
(predicted / published - 1) per metric, the ``held_out`` table of
:data:`aisim.config.calibration.DEFAULT_CALIBRATION`; rerun it after a refit and write what it
prints there.

    python benchmarks/default_calibration.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def held_out_errors(progress=None) -> tuple[list, dict]:
    """The held-out rows and, per metric, the signed relative errors (predicted / published - 1) of
    the defaults on them; ``progress(i, n, point)`` after each row."""
    import timing_accuracy as ta

    from aisim.config.keys import TIME_MODEL_KEYS, defaults
    from aisim.perf import frontend

    d = defaults(TIME_MODEL_KEYS)
    eff = {k: d[k] for k in ta.FREE_ROOFLINE}
    eff.update(frontend_per_request_s=frontend.PER_REQUEST_S, frontend_per_token_s=frontend.PER_TOKEN_S)
    held = [p for p in ta.load_points() if p["split"] == "held-out"]
    rel = {m: [] for m in ta.METRICS}
    for i, p in enumerate(held):
        q, pub = ta.predict(p, eff), ta.published(p)
        for m in ta.METRICS:
            if pub[m]:
                rel[m].append(q[m] / pub[m] - 1.0)
        if progress is not None:
            progress(i, len(held), p)
    return held, rel


def record_quantiles(errors: list) -> list:
    """The :data:`aisim.config.calibration.QUANTILES` of ``errors``, rounded as the record keeps them."""
    from aisim.config.calibration import QUANTILES

    return [round(float(x), 3) for x in np.percentile(np.array(errors), [100 * q for q in QUANTILES])]


def main() -> int:
    from aisim.config.calibration import QUANTILES

    held, rel = held_out_errors(lambda i, n, p: print(f"  {i + 1}/{n} {p['point']}", file=sys.stderr, flush=True))
    print(f"held-out rows: {len(held)} of sources {', '.join(sorted({p['source'] for p in held}))}")
    print(f"quantiles: {list(QUANTILES)}")
    for m, v in rel.items():
        print(f"{m}: [{', '.join(f'{x:.3f}' for x in record_quantiles(v))}]  ({len(v)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
