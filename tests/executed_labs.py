"""The labs as nbval runs them, kept as executed notebooks, so CI runs each lab once, not twice.

nbval reads every kernel message of a cell but keeps only its own view of the outputs (no
``clear_output``, no widget state). ``Recorder`` listens to the same messages (nbval's pinned
0.11.0 reads them through ``IPyNbFile.get_kernel_message`` and sends cells through
``RunningKernel.execute_cell_input``) and hands each one of the cell being run to nbclient's own
``NotebookClient.process_message``, the code ``site/build.py`` executes the labs with: the cell
gets the outputs, and the notebook the widget state, a full nbclient run would give. A lab whose
cells all passed is written to ``MPKIT_EXECUTED_LABS`` (a folder made for the session);
``tests/test_site.py`` builds the website from those (``site/build.py --executed``).

``plot_problem`` checks a cell that draws shows its figures: one image output at least per call
of a function of ``mpkit.plot`` or of ``plt.subplots``/``plt.figure`` in its source.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete

CACHE_ENV = "MPKIT_EXECUTED_LABS"
NOT_FIGURES = {"save", "LANGS"}  # mpkit.plot's names that draw nothing


def figure_calls(source: str) -> int:
    """Calls in ``source`` that make a figure (``mpkit.plot.*`` functions, ``plt.subplots``/``plt.figure``)."""
    from mpkit import plot

    drawing = "|".join(sorted(set(plot.__all__) - NOT_FIGURES))
    return len(re.findall(rf"\bplot\.(?:{drawing})\(|\bplt\.(?:subplots|figure)\(", source))


def images(cell) -> int:
    return sum(1 for out in cell.get("outputs", []) if any(k.startswith("image/") for k in out.get("data", {})))


def plot_problem(cell) -> str | None:
    """Why an executed cell does not show the figures its source draws, or None."""
    wanted, shown = figure_calls(cell.source), images(cell)
    if shown < wanted:
        return f"the cell draws {wanted} figure(s) but shows {shown} image(s): a figure the notebook never displays"
    return None


class Recorder:
    """The executed copy of one lab that nbval is running (``file``: nbval's ``IPyNbFile``)."""

    def __init__(self, file):
        self.path = Path(str(file.fspath))
        self.nb = nbformat.read(self.path, as_version=4)
        self.code = [i for i, cell in enumerate(self.nb.cells) if cell.cell_type == "code"]
        self.client = NotebookClient(self.nb, km=file.kernel.km, record_timing=False)
        self.client.kc = file.kernel.kc  # the Output widget mimic sends its state back to this kernel
        self.failed = False
        self.current = None  # (notebook index, execute request id) of the cell being run
        execute, receive = file.kernel.execute_cell_input, file.get_kernel_message

        def execute_cell_input(source, allow_stdin=None):
            msg_id = execute(source, allow_stdin=allow_stdin)
            if self.current is not None:
                self.current = (self.current[0], msg_id)
            return msg_id

        def get_kernel_message(timeout=None, stream="iopub"):
            msg = receive(timeout=timeout, stream=stream)
            if stream == "iopub" and self.current and msg["parent_header"].get("msg_id") == self.current[1]:
                index = self.current[0]
                try:
                    self.client.process_message(msg, self.nb.cells[index], index)
                except CellExecutionComplete:
                    pass
            return msg

        file.kernel.execute_cell_input = execute_cell_input
        file.get_kernel_message = get_kernel_message

    def begin(self, cell_num: int) -> None:
        """nbval is about to run its code cell ``cell_num``."""
        index = self.code[cell_num]
        self.nb.cells[index].outputs, self.nb.cells[index].execution_count = [], None
        self.client.clear_before_next_output = False  # as NotebookClient.execute_cell starts a cell
        self.current = (index, None)

    def cell(self, cell_num: int):
        return self.nb.cells[self.code[cell_num]]

    def save(self, folder: Path) -> Path | None:
        """Write the executed lab into ``folder`` unless a cell failed; returns its path."""
        self.current = None
        if self.failed:
            return None
        self.client.set_widgets_metadata()
        # nbval runs cells with store_history=False, so the kernel numbers each one 1: number them
        # as a notebook run top to bottom does
        for count, index in enumerate(self.code, 1):
            cell = self.nb.cells[index]
            cell.execution_count = count
            for out in cell.outputs:
                if out.output_type == "execute_result":
                    out.execution_count = count
        out = folder / self.path.name
        nbformat.write(self.nb, out)
        return out
