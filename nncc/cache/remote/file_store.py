"""file:///path: a remote tier on a shared file system (NFS, SMB, a mounted volume).

Objects are files written to a unique temp name in their folder and renamed into place,
so a reader opens the old file or the complete new one. A lease is a file created with
O_EXCL holding its owner and deadline; an expired one is taken over by renaming it aside
first, so that two machines breaking the same dead lease cannot both win.
"""

from __future__ import annotations

import os
import time

from nncc.cache.remote.backend import Listed, RecordedLeases, RemoteStore, lease_record, parse_lease
from nncc.cache.remote.errors import RemoteFault
from nncc.util.atomic import default_mode, synced_temp, unique_suffix


class FileStore(RecordedLeases, RemoteStore):
    def __init__(self, url: str, root: str):
        self.url = url
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, *key.split("/"))

    def _fault(self, exc: OSError, what: str) -> RemoteFault:
        return RemoteFault(f"{what} in {self.root}: {exc.strerror or exc}")

    def _check_root(self) -> None:
        if not os.path.isdir(self.root):
            raise RemoteFault(f"{self.root} is not a folder (is the shared file system mounted?)")

    def get(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            self._check_root()
            return None
        except OSError as exc:
            raise self._fault(exc, f"cannot read {key}") from None

    def put(self, key: str, data) -> None:
        self._check_root()
        path = self._path(key)
        tmp = None
        try:
            tmp = _written_beside(path, data)
            os.replace(tmp, path)
        except OSError as exc:
            _remove(tmp)
            raise self._fault(exc, f"cannot write {key}") from None

    def create(self, key: str, data) -> bool:
        """The complete file is linked into place (link fails where a name exists), so a
        reader sees no object or the whole one, and an existing one is never replaced."""
        self._check_root()
        path = self._path(key)
        tmp = None
        try:
            tmp = _written_beside(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        except OSError as exc:
            raise self._fault(exc, f"cannot create {key}") from None
        finally:
            _remove(tmp)

    def exists(self, key: str) -> bool:
        if os.path.exists(self._path(key)):
            return True
        self._check_root()
        return False

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self._fault(exc, f"cannot delete {key}") from None

    def list(self, prefix: str) -> list[Listed]:
        self._check_root()
        folder = self._path(prefix.rstrip("/"))
        found = []
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return found
        except OSError as exc:
            raise self._fault(exc, f"cannot list {prefix}") from None
        for name in names:
            if name.endswith(".tmp"):
                continue  # an upload in progress is not an object yet
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:
                continue
            found.append(Listed(f"{prefix.rstrip('/')}/{name}", st.st_size, st.st_mtime))
        return found

    def acquire_lease(self, key: str, owner: str, seconds: float) -> bool:
        self._check_root()
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            for _ in (0, 1):
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    if not self._break_expired(path):
                        return False
                    continue
                try:
                    os.write(fd, lease_record(owner, time.time() + seconds))
                finally:
                    os.close(fd)
                return True
            return False
        except OSError as exc:
            raise self._fault(exc, f"cannot take the lease {key}") from None

    def _break_expired(self, path: str) -> bool:
        """Remove an expired lease; True when the caller may try to create it again."""
        try:
            with open(path, "rb") as f:
                seen = f.read()
        except FileNotFoundError:
            return True
        record = parse_lease(seen)
        if record is not None and record[1] > time.time():
            return False
        if record is None and time.time() - os.stat(path).st_mtime < 5:
            return False  # being written just now
        aside = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.broken"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True  # someone else broke it first
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != seen:  # a live lease was created in between: put it back
            try:
                os.link(aside, path)
            except FileExistsError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True


def _written_beside(path: str, data) -> str:
    """A complete, synced temporary file next to ``path`` holding ``data``: its name."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return synced_temp(path, lambda f: f.write(data), f"{os.path.basename(path)}.{unique_suffix()}.tmp",
                       default_mode())


def _remove(path: str | None) -> None:
    if path is None:
        return
    try:
        os.unlink(path)
    except OSError:
        pass
