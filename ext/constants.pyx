"""The codes of the replay core's enums, exported to Python by name.

Every table maps a name to the code the core writes or reads; the Python side
(``aisim.replay``, ``aisim.decisionlog``, ``aisim.config.kvgroups``,
``aisim.perf``) takes its codes from here instead of repeating numbers.  The
values come straight from the ``cdef enum`` declarations in ``ext/*.pxd``, so
a renumbered enum changes them here too; ``tests/test_core_constants.py``
checks them against ``aisim._core.testing`` and checks that every Python-side
name table covers exactly these codes.
"""

from aisim._core.engine cimport (
    EV_ARRIVED, EV_FINISHED, EV_NEW, EV_PREEMPTED, EV_RESUMED, EV_SCHED, EV_SPEC, EV_SPEC_ACCEPTED,
    EV_OFF_DONE, EV_OFF_FLUSH, EV_OFF_LOAD, EV_OFF_LOAD_CHUNKS, EV_OFF_LOAD_TOKENS, EV_OFF_LOOKUP,
    EV_OFF_LOOKUP_EXT, EV_OFF_RECV, EV_OFF_STORE, EV_OFF_STORE_CHUNKS, EV_OFF_WAIT, EV_SPEC_PADDED, LINE_DRAIN,
    LINE_STEP,
)
from aisim._core.scheduler cimport ACC_COUNTS, ACC_HISTOGRAM, ACC_PERMILLE
from aisim._core.deploy cimport RT_KV_AWARE, RT_LEAST_LOADED, RT_RANDOM, RT_ROUND_ROBIN, RT_SESSION
from aisim._core.kvcache cimport GK_CHUNKED, GK_FULL, GK_MAMBA, GK_RING, GK_SWA, MAX_GROUPS as _MAX_GROUPS
from aisim._core.request cimport ST_FINISHED, ST_PENDING, ST_PREEMPTED, ST_RUNNING, ST_WAITING
from aisim._core.steptime cimport AX_BATCH, AX_KV, AX_PREFILL, TM_LINEAR, TM_ROOFLINE, TM_TABLE

# vllm/v1/request.py RequestStatus, as far as the core models it (ReqStatus).
REQUEST_STATUS = {
    "pending": ST_PENDING,
    "waiting": ST_WAITING,
    "running": ST_RUNNING,
    "preempted": ST_PREEMPTED,
    "finished": ST_FINISHED,
}

# The most KV-cache groups one engine may have: the core's fixed-size group arrays (ext/kvcache.pxd).
MAX_GROUPS = _MAX_GROUPS

# Manager kind of a KV-cache group (GroupKind); "state" is vLLM's MambaManager.
GROUP_KINDS = {
    "full": GK_FULL,
    "sliding_window": GK_SWA,
    "chunked_local": GK_CHUNKED,
    "state": GK_MAMBA,
    "ring": GK_RING,
}

# Routers (RouterKind), by the enum's names: aisim.config.routers.ROUTER_TABLE names each row's.
ROUTER_KINDS = {
    "RT_ROUND_ROBIN": RT_ROUND_ROBIN,
    "RT_RANDOM": RT_RANDOM,
    "RT_LEAST_LOADED": RT_LEAST_LOADED,
    "RT_KV_AWARE": RT_KV_AWARE,
    "RT_SESSION": RT_SESSION,
}

# Decision-log event kinds (EventKind).
EVENT_KINDS = {
    "arrived": EV_ARRIVED,
    "sched": EV_SCHED,
    "new": EV_NEW,
    "resumed": EV_RESUMED,
    "preempted": EV_PREEMPTED,
    "finished": EV_FINISHED,
    "spec": EV_SPEC,
    "spec_accepted": EV_SPEC_ACCEPTED,
    "spec_padded": EV_SPEC_PADDED,
    "off_lookup": EV_OFF_LOOKUP,
    "off_lookup_ext": EV_OFF_LOOKUP_EXT,
    "off_load": EV_OFF_LOAD,
    "off_load_tokens": EV_OFF_LOAD_TOKENS,
    "off_load_chunks": EV_OFF_LOAD_CHUNKS,
    "off_store": EV_OFF_STORE,
    "off_store_chunks": EV_OFF_STORE_CHUNKS,
    "off_flush": EV_OFF_FLUSH,
    "off_wait": EV_OFF_WAIT,
    "off_done": EV_OFF_DONE,
    "off_recv": EV_OFF_RECV,
}

# How the fake model decides how many drafts it accepts (AcceptKind).
ACCEPT_KINDS = {
    "permille": ACC_PERMILLE,
    "counts": ACC_COUNTS,
    "histogram": ACC_HISTOGRAM,
}

# Step-time models (TimeKind).
TIME_MODEL_KINDS = {
    "linear": TM_LINEAR,
    "roofline": TM_ROOFLINE,
    "table": TM_TABLE,
}

# Axes of a step-time profile (TableAxis), named as the profile's columns.
TABLE_AXES = {
    "batch_size": AX_BATCH,
    "prefill_tokens": AX_PREFILL,
    "kv_tokens": AX_KV,
}

# Kinds of a step line (LineKind).
STEP_KINDS = {
    "step": LINE_STEP,
    "drain": LINE_DRAIN,
}


def names_by_code(table):
    """The names of ``table`` listed by code: ``names[code] == name``.

    Parameters
    ----------
    table : dict of str to int
        One of this module's tables; its codes must be 0 .. len - 1.

    Returns
    -------
    list of str
    """
    names = sorted(table, key=table.__getitem__)
    if [table[n] for n in names] != list(range(len(names))):
        raise ValueError("codes are not 0 .. n - 1")
    return names
