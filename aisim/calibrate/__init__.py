"""Calibration: fitting the time model's constants to a user's own ``vllm bench serve`` results.

:mod:`aisim.calibrate.benchserve` reads the result JSON files ``vllm bench serve
--save-result`` writes (one run per JSON object; ``--append-result`` files hold one a line),
and :mod:`aisim.calibrate.aiperf` AIPerf's summary export;
:mod:`aisim.calibrate.workload` rebuilds each run's requests and send times;
:mod:`aisim.calibrate.predict` replays a run and takes the statistics ``vllm bench serve``
reports; :mod:`aisim.calibrate.optimize` is a small deterministic least-squares solver
(Levenberg-Marquardt);
:mod:`aisim.calibrate.fit` fits the time model's fitted constants
(:data:`aisim.config.keys.TIME_MODEL_KEYS` entries with ``fitted=True``) by least squares on
log errors and cross-validates leaving one file out; :mod:`aisim.config.calibration` is the
``calibration`` record a time model carries (which fit made it, its held-out errors) and the
uncertainty band capacity answers take from it; :mod:`aisim.calibrate.measured` lands the
measured runs in DuckDB; :mod:`aisim.calibrate.output` writes the calibrated engine;
:mod:`aisim.calibrate.cli` is ``aisim calibrate``.
"""
