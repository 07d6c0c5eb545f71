"""numpy arrays as Arrow arrays, wrapped without a copy and without ``numpy.ma``."""

import numpy as np
import pyarrow as pa


def arrow_array(values, typ: pa.DataType):
    """``values`` as an Arrow array of ``typ``; a numpy array already of that type is wrapped, not copied.

    NaN stays a value, not a null, as with ``pa.array``; wrapping the buffer directly also keeps
    ``numpy.ma`` (which ``pa.array`` consults) out of a short replay's start-up.  An Arrow array
    is returned as it is; anything else goes to Arrow's own conversion, with its checks.
    """
    if (isinstance(values, np.ndarray) and values.ndim == 1
            and (pa.types.is_integer(typ) or pa.types.is_floating(typ))
            and values.dtype == typ.to_pandas_dtype()):
        data = np.ascontiguousarray(values)
        return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(data)])
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    return pa.array(values, typ)
