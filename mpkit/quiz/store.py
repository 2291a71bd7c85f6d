"""Per-student quiz results: one JSON file per student, written atomically.

A killed kernel must never leave a half-written file (temp file in the same folder + fsync +
``os.replace``), a re-run cell must keep earlier answers (every write re-reads the file and
appends), and a file we cannot read is moved aside to ``<name>.corrupt-<time>.json`` with a
warning, never overwritten. Each answer also moves its item between Leitner boxes 1..5, which
:func:`mpkit.quiz.review` uses to drill missed items.

File layout (``FORMAT``/``VERSION`` tag it; readers refuse anything else)::

    {"format": "mpkit-quiz-results", "version": 1, "student": "kim",
     "created": "2025-01-01T09:00:00.000+00:00", "updated": "...",
     "items": {"pp-001": {"answer": "X", "correct": false, "at": "...", "box": 1,
                          "history": [{"answer": "X", "correct": false, "at": "...",
                                       "lang": "ko", "mode": "drill", "session": "3f2a..."}]}}}

``answer``/``correct``/``at`` repeat the latest history entry. ``correct`` is what the widget
showed the student; graders recompute it from the bank's answer key.
"""
import contextlib
import getpass
import json
import os
import re
import tempfile
import unicodedata
import uuid
import warnings
from datetime import datetime, timezone
from pathlib import Path

FORMAT = "mpkit-quiz-results"
VERSION = 1
BOXES = 5
ANSWERS = ("O", "X")


class ResultsFileError(ValueError):
    """A results file that is not valid JSON, not ours, or not in the expected shape."""


def resolve_results_dir(results_dir=None):
    """``results_dir`` argument, else ``$MPKIT_RESULTS_DIR``, else ``./quiz_results``."""
    return Path(results_dir if results_dir is not None
                else os.environ.get("MPKIT_RESULTS_DIR") or "quiz_results")


def resolve_student(student=None):
    """``student`` argument, else ``$MPKIT_STUDENT``, else the login name."""
    if student is None:
        return os.environ.get("MPKIT_STUDENT") or getpass.getuser()
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty name like 'kim-2024001', got {student!r}")
    return student.strip()


def safe_filename(name):
    """A file stem for ``name``: letters (Hangul too), digits, '.', '-', '_' only; NFC-normalised."""
    safe = re.sub(r"[^\w.-]+", "_", unicodedata.normalize("NFC", name)).strip("._")[:64]
    return safe or "student"


def results_path(student=None, results_dir=None):
    """Where ``student``'s results file lives (same resolution rules as :class:`ResultStore`)."""
    return resolve_results_dir(results_dir) / f"{safe_filename(resolve_student(student))}.json"


def now():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def read_results(path):
    """The parsed results file at ``path``; :class:`ResultsFileError` names the file and the defect."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsFileError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsFileError(f"{path}: not an mpkit quiz results file (no \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ResultsFileError(f"{path}: results format version {data.get('version')!r}; "
                               f"this mpkit reads version {VERSION}")
    if not isinstance(data.get("student"), str) or not isinstance(data.get("items"), dict):
        raise ResultsFileError(f"{path}: needs a \"student\" name and an \"items\" mapping")
    for item_id, entry in data["items"].items():
        if (not isinstance(entry, dict) or entry.get("answer") not in ANSWERS
                or entry.get("box") not in range(1, BOXES + 1) or not isinstance(entry.get("at"), str)
                or not isinstance(entry.get("history"), list)):
            raise ResultsFileError(f"{path}: item {item_id!r} needs answer O/X, box 1-{BOXES}, "
                                   "an \"at\" time and a history list")
    return data


def atomic_write_text(path, text):
    """Replace ``path`` with ``text`` all at once: readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are shared with the instructor
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (POSIX only)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


class ResultStore:
    """One student's results file. Every :meth:`record` re-reads the file, appends and rewrites it,
    so several quizzes open for the same student (in one kernel) never drop each other's answers."""

    def __init__(self, student=None, results_dir=None):
        self.student = resolve_student(student)
        self.path = results_path(self.student, results_dir)
        self.session = uuid.uuid4().hex[:12]  # groups the answers given in one quiz widget
        self.data = self._load()

    def _load(self):
        if not self.path.exists():
            stamp = now()
            return {"format": FORMAT, "version": VERSION, "student": self.student,
                    "created": stamp, "updated": stamp, "items": {}}
        try:
            return read_results(self.path)
        except ResultsFileError as exc:
            aside = self._move_aside()
            warnings.warn(f"{exc}. Moved it to {aside} (nothing deleted) and started a new results file.",
                          stacklevel=3)
            return self._load()

    def _move_aside(self):
        stem = f"{self.path.stem}.corrupt-{datetime.now().strftime('%Y%m%dT%H%M%S')}"
        aside = self.path.with_name(f"{stem}.json")
        counter = 1
        while aside.exists():
            aside = self.path.with_name(f"{stem}-{counter}.json")
            counter += 1
        self.path.rename(aside)
        return aside

    def record(self, answers, *, lang, mode):
        """Persist ``answers``, a list of ``(item_id, "O"|"X", correct)``, with one atomic write."""
        data = self._load()
        stamp = now()
        for item_id, answer, correct in answers:
            entry = data["items"].setdefault(item_id, {"answer": answer, "correct": False, "at": stamp,
                                                       "box": 1, "history": []})
            event = {"answer": answer, "correct": bool(correct), "at": stamp,
                     "lang": lang, "mode": mode, "session": self.session}
            entry["history"].append(event)
            entry.update(answer=answer, correct=bool(correct), at=stamp,
                         box=min(BOXES, entry["box"] + 1) if correct else 1)
        data["updated"] = stamp
        atomic_write_text(self.path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        self.data = data

    def box(self, item_id):
        """Leitner box 1..5 of an answered item, None if never answered."""
        entry = self.data["items"].get(item_id)
        return entry["box"] if entry else None

    def missed(self):
        """Ids answered wrong at least once and not yet mastered (box < 5): lowest box first,
        then the one seen longest ago."""
        entries = [(entry["box"], entry["at"], item_id) for item_id, entry in self.data["items"].items()
                   if entry["box"] < BOXES and any(not e.get("correct") for e in entry["history"])]
        return [item_id for _, _, item_id in sorted(entries)]
