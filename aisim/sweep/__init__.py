"""Configuration sweeps ranked by SLO goodput.

:mod:`aisim.sweep.runner` reads a sweep spec, replays its candidates through
the pipeline and ranks them; :mod:`aisim.sweep.cli` is the ``aisim sweep``
command.
"""

from aisim.sweep.runner import Candidate, SweepResult, SweepSpec, load_sweep, run_sweep, sweep_from_dict

__all__ = ["Candidate", "SweepResult", "SweepSpec", "load_sweep", "run_sweep", "sweep_from_dict"]
