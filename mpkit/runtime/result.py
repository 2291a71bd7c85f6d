"""What a launch returns: per-rank results plus the merged trace and memory reports."""


class LaunchResult(list):
    """The per-rank return values (a list), plus ``.trace`` (all ranks merged), ``.memory``
    (one MemoryReport per rank) and ``.output`` (what each rank printed). Under torchrun also
    ``.clock_offsets`` and ``.clock_errors`` (per rank: seconds moved onto rank 0's clock, and how
    far that can be off; all 0 on one host)."""

    def __init__(self, results, trace, memory, output, backend):
        super().__init__(results)
        self.trace = trace
        self.memory = memory
        self.output = output
        self.backend = backend
