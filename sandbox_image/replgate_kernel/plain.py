"""Arrays of plain Python values (a pandas column of strings, say) in a variables snapshot:
pickled whole by the C pickler, not value by value by dill's pickler (see ``snapshot``)."""

import pickle
import sys
from collections.abc import Callable
from typing import Any

PLAIN_TYPES = frozenset({str, int, float, bool, type(None), bytes, complex})
"""What an array of Python objects may hold to be pickled by the C pickler: values that it
pickles exactly as dill does (no reference to a module, a class or ``__main__``)."""
PLAIN_MIN_ITEMS = 1024
"""Smaller arrays of objects are not worth the look at every item's type."""
PLAIN_SAMPLE = 1024
"""Items whose size gives the estimate of an array of plain values' pickle."""


def reduced(array: Any, memory_free: Callable[[], int | None], min_free: int) -> Any:
    """How an array of Python objects is pickled when each is a plain value (a pandas column
    of strings, say), or None: whole by the C pickler, its bytes out of band, if that leaves
    ``min_free`` bytes of the sandbox's ``memory_free()``.

    dill's pickler is written in Python: it takes about 2 µs an item, 2 s for a million
    strings, where the C pickler takes 0.16 s. The bytes are a copy of the values (not of
    the array's other memory), made and written one array at a time. An array that holds
    anything else (an instance of a class of the session, a function) is left to dill,
    which keeps such values by value.
    """
    if array.size < PLAIN_MIN_ITEMS or array.dtype.fields is not None:
        return None
    items = array.ravel(order="K")
    if not set(map(type, items)) <= PLAIN_TYPES:
        return None
    # The pickle's bytes are at most the values' own size (a sample's, for the whole): where
    # the sandbox has no room for them, dill writes the values one by one instead.
    sample = items[::max(1, items.size // PLAIN_SAMPLE)]
    estimate = sum(map(sys.getsizeof, sample)) * items.size // max(1, sample.size)
    free = memory_free()
    if free is not None and free - estimate < min_free:
        return None
    return loads, (pickle.PickleBuffer(pickle.dumps(array, protocol=5)),)


def loads(data: Any) -> Any:
    """An array of plain objects, from what :func:`reduced` wrote."""
    return pickle.loads(data)
