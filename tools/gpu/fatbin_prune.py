#!/usr/bin/env python3
"""Blank the device code of other GPU architectures in a shared library's fat binary.

CUDA libraries (torch's ``libtorch_cuda.so``, NCCL, vLLM's kernels) embed one compiled
image per GPU architecture in their ``.nv_fatbin`` section (sm_75 ... sm_120), each
compressed: most of the file, and nothing a compressor can shrink. The lent H200 is
sm_90 only, and one call of the device tool carries at most 64 MiB, so the GPU kit
carries these libraries with every other architecture's image overwritten by zeros
(which compress to nothing). Entry headers, offsets and sizes stay as they are, so the
file keeps its layout and the CUDA runtime still finds (and loads, lazily) the sm_90
image; an image blanked here would only be read on another GPU, where the library is
not meant to run.

    python3 tools/gpu/fatbin_prune.py --keep 90 LIB [LIB ...]      # in place
"""

from __future__ import annotations

import argparse
import mmap
import struct
import sys
from collections import Counter

FATBIN_MAGIC = 0xBA55ED50
CUBIN = 2


def _fatbin_section(buf) -> tuple[int, int] | None:
    """(offset, size) of ``.nv_fatbin`` in a 64-bit little-endian ELF, or None."""
    if buf[:4] != b"\x7fELF" or buf[4] != 2 or buf[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", buf, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", buf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name, _typ, _flags, _addr, off, size in headers:
        end = buf.find(b"\0", strtab + name)
        if bytes(buf[strtab + name:end]) == b".nv_fatbin":
            return off, size
    return None


def prune_buffer(buf, keep: set[int], dry_run: bool = False) -> Counter:
    """Zero, in ``buf`` (a writable buffer holding an ELF library), every cubin entry whose
    architecture is not in ``keep``; returns bytes kept / blanked per architecture.
    PTX entries are never touched (another GPU could still JIT them)."""
    kept, blanked = Counter(), Counter()
    sec = _fatbin_section(buf)
    if sec is None:
        return Counter()
    pos, end = sec[0], sec[0] + sec[1]
    while pos + 16 <= end:
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", buf, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned
            continue
        p, pe = pos + hsize, pos + hsize + fsize
        while p + 36 <= pe:
            kind, _unk, ehsize, psize = struct.unpack_from("<HHIQ", buf, p)
            arch = struct.unpack_from("<I", buf, p + 28)[0]
            body = p + ehsize
            if kind == CUBIN and arch not in keep:
                blanked[arch] += psize
                if not dry_run:
                    buf[body:body + psize] = bytes(psize)
            else:
                kept[arch] += psize
            p = body + psize
        pos = pe
    return Counter({f"kept sm_{a}": n for a, n in kept.items()}
                   | {f"blanked sm_{a}": n for a, n in blanked.items()})


def blanked_bytes(stats: Counter) -> int:
    return sum(n for k, n in stats.items() if k.startswith("blanked"))


def prune(path: str, keep: set[int], dry_run: bool = False) -> Counter:
    """:func:`prune_buffer` on a file, in place."""
    with open(path, "r+b" if not dry_run else "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ if dry_run else mmap.ACCESS_WRITE)
        try:
            return prune_buffer(buf, keep, dry_run)
        finally:
            buf.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", default="90", help="architectures to keep, e.g. 90 or 90,100")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args()
    keep = {int(x) for x in a.keep.split(",")}
    for lib in a.libs:
        stats = prune(lib, keep, a.dry_run)
        total = {k: round(v / 1e6, 1) for k, v in sorted(stats.items())}
        print(f"{lib}: {total or 'no fat binary'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
