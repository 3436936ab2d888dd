"""An advisory lock that ends with the process holding it (a run folder, a store writer's rank)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no advisory locks
    fcntl = None  # type: ignore[assignment]


class ExclusiveLock:
    """An exclusive, non-blocking ``flock`` on ``path``: a folder, or a file (created if missing).

    No stale lock files: the kernel drops the lock when the holder closes it or ends, killed or
    not.  A forked child (a DataLoader worker) closes its copy at once, so the lock ends with its
    holder and not with the holder's last worker.  Where the platform or the filesystem has no
    ``flock``, ``acquire`` succeeds without protection.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Hold the lock; False when another open of ``path`` (another process) holds it."""
        if fcntl is None:
            return True
        flags = os.O_RDONLY if self.path.is_dir() else os.O_RDWR | os.O_CREAT
        fd = os.open(self.path, flags, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            return True  # no locks on this filesystem: go on unprotected
        self._fd = fd
        # a forked child closes its inherited descriptor at once; the parent keeps the lock
        os.register_at_fork(after_in_child=self.release)
        return True

    def release(self) -> None:
        """Let go (idempotent): closing the descriptor drops the ``flock``."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
