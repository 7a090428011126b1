#!/usr/bin/env python3
"""Writes the boolean attention masks (True = attend) the suites under configs/ use.

Plain Python, no numpy: a .npy file is a short header and the raw bytes.
Run from anywhere: python3 configs/masks/make_masks.py
"""
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_bool_npy(path, shape, values):
    header = "{'descr': '|b1', 'fortran_order': False, 'shape': (%s), }" % (
        "".join(f"{s}, " for s in shape) if len(shape) == 1 else ", ".join(str(s) for s in shape))
    # magic, version 1.0, header padded with spaces to a multiple of 64, ending in a newline
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    data = bytes(1 if v else 0 for v in values)
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data)


def padding_mask(B, Tq, Tk):
    """[B, 1, Tq, Tk]: batch item b has its last b + 1 keys padded away, and each
    query also skips the keys j with (i + j) % 4 == 3 (never its last valid key),
    so rows differ from each other and from batch to batch."""
    values = []
    for b in range(B):
        valid = Tk - (b + 1)
        for i in range(Tq):
            for j in range(Tk):
                values.append(j < valid and ((i + j) % 4 != 3 or j == valid - 1))
    return [B, 1, Tq, Tk], values


def empty_row_mask(B, Tq, Tk):
    """[B, 1, Tq, Tk]: in batch item b the query row (2 b + 1) % Tq has every key
    masked (its output and gradients must be zeros); the other rows skip the keys
    j with (i + j) % 3 == 2, never all of them."""
    values = []
    for b in range(B):
        empty = (2 * b + 1) % Tq
        for i in range(Tq):
            for j in range(Tk):
                values.append(i != empty and ((i + j) % 3 != 2 or j == 0))
    return [B, 1, Tq, Tk], values


if __name__ == "__main__":
    for name, (shape, values) in {
        "padding_B2_Tq5_Tk7.npy": padding_mask(2, 5, 7),
        "empty_row_B2_Tq4_Tk6.npy": empty_row_mask(2, 4, 6),
    }.items():
        write_bool_npy(HERE / name, shape, values)
        print("wrote", HERE / name, shape)
