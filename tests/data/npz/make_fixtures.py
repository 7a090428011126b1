#!/usr/bin/env python3
"""Makes the .npy/.npz fixtures for tests/test_npy.cpp, once; the outputs are
committed so that the tests never need Python or numpy.

Run from anywhere:  /usr/bin/python3 tests/data/npz/make_fixtures.py
(Debian's python3-numpy; a pyenv python may lack numpy.)
"""
import pathlib
import shutil
import zipfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
NPY = HERE.parent / "npy"


def arrays():
    return {
        "a": np.arange(6, dtype=np.float64).reshape(2, 3) / 7,
        "b": np.array([0.5, -1.25, 3.0, 1e-3], dtype=np.float32),
        "m": np.array([[True, False], [False, True]]),
    }


def make_npz():
    np.savez(HERE / "stored.npz", **arrays())
    np.savez_compressed(HERE / "deflated.npz", **arrays())

    # corrupt.npz: deflated.npz with one byte of member a.npy's compressed data
    # flipped, so decompression or its CRC check fails.
    shutil.copy(HERE / "deflated.npz", HERE / "corrupt.npz")
    with zipfile.ZipFile(HERE / "corrupt.npz") as z:
        info = z.getinfo("a.npy")
    with open(HERE / "corrupt.npz", "r+b") as f:
        f.seek(info.header_offset)
        local = f.read(30)
        name_len = int.from_bytes(local[26:28], "little")
        extra_len = int.from_bytes(local[28:30], "little")
        pos = info.header_offset + 30 + name_len + extra_len + info.compress_size // 2
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0xFF]))

    # bad_member.npz: a member named .npy whose bytes are not a .npy image, and
    # a non-array member that read_npz skips.
    with zipfile.ZipFile(HERE / "bad_member.npz", "w") as z:
        z.writestr("good.npy", npy_bytes(np.ones(3)))
        z.writestr("bad.npy", b"this is not an npy file")
        z.writestr("README.txt", b"not an array")


def npy_bytes(a):
    import io
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def make_npy():
    NPY.mkdir(exist_ok=True)
    np.save(NPY / "numpy_f8.npy", np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 7)
    np.save(NPY / "numpy_f4.npy", (np.arange(6, dtype=np.float32) - 2.5).reshape(3, 2))
    np.save(NPY / "numpy_bool.npy", np.array([[True, False, True], [False, False, True]]))
    np.save(NPY / "numpy_scalar.npy", np.float64(2.5))
    np.save(NPY / "numpy_f4_fortran.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    np.save(NPY / "numpy_f8_bigendian.npy", np.arange(4, dtype=">f8"))
    np.save(NPY / "numpy_i4.npy", np.arange(4, dtype="<i4"))


if __name__ == "__main__":
    make_npz()
    make_npy()
