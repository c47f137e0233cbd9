"""Write a file so that a reader (or a crash) never sees it half-written.

Why: a report written in place is truncated first; a process killed during the write,
or a reader that looks at the same moment, gets an empty or partial JSON file beside
the data it describes.
How: write a temporary file in the same folder (same filesystem), flush it to disk,
then ``os.replace`` it onto the final name (atomic on POSIX and Windows).
"""

from __future__ import annotations

import os
import uuid


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    # 0o666 less the umask: the permissions an in-place write would have given it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
