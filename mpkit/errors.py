"""Errors a launch can end with (each names the rank so a student knows where to look), and
mpkit's own warning category."""


class LaunchError(RuntimeError):
    """A rank failed: raised, died, or (subclass) did not finish in time.

    ``rank`` is the first failing rank, ``traceback`` the text of its traceback (or exit reason),
    ``output`` what it printed.
    """

    def __init__(self, message, *, rank=None, traceback="", output="", exc_type=""):
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.output = output
        self.exc_type = exc_type

    @property
    def summary(self) -> str:
        """The message without the rank's traceback: what failed and where, in one paragraph."""
        return str(self).split("\n\n--- traceback of rank", 1)[0]


class LaunchTimeout(LaunchError):
    """No result from some ranks within ``timeout`` seconds (deadlock, a rank that never joined)."""

    def __init__(self, message, *, ranks=(), **kwargs):
        super().__init__(message, rank=ranks[0] if ranks else None, **kwargs)
        self.ranks = list(ranks)


class DeviceOutOfMemory(RuntimeError):
    """A simulated device's tracked tensors exceeded its capacity (what a GPU does at its limit)."""


class RankOutOfMemory(LaunchError, DeviceOutOfMemory):
    """In the caller: a rank ran out of (simulated) device memory. Catch either base class."""


class MpkitWarning(RuntimeWarning):
    """A warning mpkit itself raises. One raised in a rank is shown to the caller of ``launch``
    (a rank's stderr only reaches ``output``, which nobody reads)."""
