"""Reading JSON that someone else wrote (a student's results file, a submitted notebook).

A folder being graded may hold anything: a FIFO that would block ``open`` forever, a device, a
folder named ``x.json``, a link to elsewhere, a file of gigabytes, bytes that are not UTF-8, or
JSON nested deeply enough to exhaust the parser's recursion. :func:`read_json` turns each of those
into an :class:`UnreadableFile` that names the file and the reason, and never executes anything.
"""
import json
import os
import stat

MAX_BYTES = 16 * 1024 * 1024  # an assignment notebook or a year of answers is well under 1 MiB
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


class UnreadableFile(ValueError):
    """A file that cannot be taken as JSON; the message is ``<path>: <reason>``."""


def read_json(path, max_bytes=MAX_BYTES):
    """The parsed JSON in the regular file ``path``.

    Opened with ``O_NONBLOCK`` (a FIFO cannot block) and ``O_NOFOLLOW`` (a link is refused), and
    the kind and size are checked on the open descriptor, so nothing can change between the check
    and the read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISLNK(mode):
            raise UnreadableFile(f"{path}: a symbolic link (copy the file itself in)") from None
        if mode is not None and not stat.S_ISREG(mode):   # a socket cannot even be opened
            raise UnreadableFile(f"{path}: {_kind(mode)}, not a regular file") from None
        raise UnreadableFile(f"{path}: cannot open ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableFile(f"{path}: {_kind(info.st_mode)}, not a regular file")
        if info.st_size > max_bytes:
            raise UnreadableFile(f"{path}: too large ({info.st_size} bytes; the limit is {max_bytes})")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise UnreadableFile(f"{path}: too large (over {max_bytes} bytes)")
    finally:
        os.close(fd)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableFile(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise UnreadableFile(f"{path}: JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        raise UnreadableFile(f"{path}: not valid JSON ({exc})") from None


def _kind(mode):
    return next((name for test, name in _KINDS if test(mode)), "a special file")
