"""Writes the .sht reference files the engine's tests read (format: models/README.md;
reader: src/engine/test_util.cc ReadTensorFile). Imported by the generate_*.py scripts."""
import struct

import numpy as np

# shoal's DataType numbers.
DTYPES = {np.float32: 11, np.float16: 10, np.int64: 9, np.int32: 8, np.bool_: 1}


def write_sht(path, tensors):
    """Writes (name, array) pairs to `path`."""
    with open(path, "wb") as f:
        f.write(b"SHT1" + struct.pack("<I", len(tensors)))
        for name, arr in tensors:
            arr = np.asarray(arr, order="C")  # ascontiguousarray would make 0-d 1-d
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", DTYPES[arr.dtype.type], arr.ndim))
            f.write(struct.pack("<%dq" % arr.ndim, *arr.shape))
            data = arr.tobytes()
            f.write(struct.pack("<Q", len(data)) + data)
