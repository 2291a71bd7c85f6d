"""Per-student quiz results on the student's own machine: one JSON file per student.

Where: ``results_dir`` argument, else ``$MPKIT_RESULTS_DIR``, else the user data directory
(``$XDG_DATA_HOME/mpkit/quiz_results``, by default ``~/.local/share/mpkit/quiz_results``), so
answers never land in the folder a student browses and commits. The first save of a kernel into
that default folder prints where it is, in Korean and English. mpkit's first version kept answers
in ``./quiz_results`` (beside the notebook); a store opened on the default folder for the
student of this login copies that student's old answers in (each answer once; the old file is
never changed).

Safety, each for a reason seen in practice:

* several writers for one student (two browser tabs, a re-run kernel) take turns under an
  exclusive lock on ``.<file>.lock`` and re-read the file before appending, so none loses
  another's answers;
* every write goes to a temp file in the same folder, then fsync + ``os.replace``: a killed kernel
  leaves the old file or the new one, never half of one; a temp file left by a killed writer is
  removed by the next writer (it holds the lock, so no live writer owns one);
* a file we cannot read is moved aside to ``<file>.corrupt-<time>`` with a warning, never
  overwritten;
* a name maps to its file reversibly (:func:`file_stem`), so ``lee@1`` and ``lee#1`` stay two files,
  and a file that belongs to another name (two names differing only in case on a
  case-insensitive disk) is refused, not merged.

File layout (``FORMAT``/``VERSION`` tag it; readers refuse anything else)::

    {"format": "mpkit-quiz-results", "version": 2, "student": "kim",
     "created": "2025-01-01T09:00:00.000+00:00", "updated": "...",
     "items": {"pp-001": {"answer": "X", "correct": false, "at": "...", "box": 1,
                          "history": [{"answer": "X", "correct": false, "at": "...", "lang": "ko",
                                       "mode": "exam", "session": "3f2a...", "assignment": "hw1"}]}}}

``history`` holds every recorded answer in order; ``answer`` is ``null`` for an item left blank in
a submitted exam (its key was shown all the same). ``answer``/``correct``/``at`` repeat the latest
entry. ``correct`` is what the widget showed the student; graders recompute it from the key.
Version 1 files (no blanks, no ``assignment``) are read as they are.
"""
import contextlib
import getpass
import heapq
import json
import os
import re
import sys
import tempfile
import unicodedata
import uuid
import warnings
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote

from mpkit.i18n import t
from mpkit.quiz.safeio import UnreadableFile, read_json

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

FORMAT = "mpkit-quiz-results"
VERSION = 2
READABLE_VERSIONS = (1, 2)
BOXES = 5
ANSWERS = ("O", "X")
MAX_NAME = 64
_announced = False  # the first save of this kernel into the default folder says where it is
LEGACY_DIR = "quiz_results"  # where mpkit's first version saved, relative to the kernel's folder


class ResultsFileError(ValueError):
    """A results file that is not valid JSON, not ours, or not in the expected shape."""


def default_results_dir():
    """``$XDG_DATA_HOME/mpkit/quiz_results`` (an absolute XDG_DATA_HOME only, as the spec says),
    else ``~/.local/share/mpkit/quiz_results``."""
    base = os.environ.get("XDG_DATA_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share") / "mpkit" / "quiz_results"


def resolve_results_dir(results_dir=None):
    """``results_dir`` argument, else ``$MPKIT_RESULTS_DIR``, else :func:`default_results_dir`."""
    if results_dir is not None:
        return Path(results_dir)
    return Path(os.environ["MPKIT_RESULTS_DIR"]) if os.environ.get("MPKIT_RESULTS_DIR") else default_results_dir()


def resolve_student(student=None):
    """``student`` argument, else ``$MPKIT_STUDENT``, else the login name; NFC-normalised, stripped."""
    if student is None:
        student = os.environ.get("MPKIT_STUDENT") or getpass.getuser()
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty name like 'kim-2024001', got {student!r}")
    student = unicodedata.normalize("NFC", student.strip())
    if len(student) > MAX_NAME:
        raise ValueError(f"student name is {len(student)} characters long; use at most {MAX_NAME} "
                         f"(a name or student id like 'kim-2024001')")
    return student


def file_stem(student):
    """The file stem for ``student``: letters and digits of any script, '_', '-' and inner '.' as
    they are, every other character as ``%XX`` (UTF-8). Reversible (:func:`student_of`), so two
    different names never share a file, and safe as a path component (no '/', no leading '.')."""
    return "".join(ch if ch.isalnum() or ch in "_-" or (ch == "." and i) else
                   "".join(f"%{byte:02X}" for byte in ch.encode("utf-8")) for i, ch in enumerate(student))


def student_of(stem):
    """The name a file stem stands for (inverse of :func:`file_stem`)."""
    return unquote(stem, errors="replace")


def results_path(student=None, results_dir=None):
    """Where ``student``'s results file lives (same resolution rules as :class:`ResultStore`)."""
    return resolve_results_dir(results_dir) / f"{file_stem(resolve_student(student))}.json"


def legacy_path(student, folder=None):
    """Where mpkit's first version kept ``student``'s answers: ``<folder or cwd>/quiz_results/<stem>.json``
    with the stem it made (other characters as '_', so two names could share it)."""
    stem = re.sub(r"[^\w.-]+", "_", student).strip("._")[:64] or "student"
    return Path(folder if folder is not None else Path.cwd()) / LEGACY_DIR / f"{stem}.json"


def now():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def check_results(data, where):
    """``data`` if it is a results file's content; :class:`ResultsFileError` names ``where`` and the defect."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ResultsFileError(f"{where}: not an mpkit quiz results file (no \"format\": \"{FORMAT}\")")
    if data.get("version") not in READABLE_VERSIONS:
        raise ResultsFileError(f"{where}: results format version {data.get('version')!r}; "
                               f"this mpkit reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    if not isinstance(data.get("student"), str) or not isinstance(data.get("items"), dict):
        raise ResultsFileError(f"{where}: needs a \"student\" name and an \"items\" mapping")
    for item_id, entry in data["items"].items():
        if (not isinstance(entry, dict) or entry.get("answer") not in (*ANSWERS, None)
                or entry.get("box") not in range(1, BOXES + 1) or not isinstance(entry.get("at"), str)
                or not isinstance(entry.get("history"), list)
                or not all(isinstance(e, dict) and e.get("answer") in (*ANSWERS, None)
                           and isinstance(e.get("at", ""), str) for e in entry["history"])):
            raise ResultsFileError(f"{where}: item {item_id!r} needs answer O/X, box 1-{BOXES}, "
                                   "an \"at\" time and a history list of answers, each with its \"at\" time as text")
    exercises = data.get("exercises", {})
    if not isinstance(exercises, dict) or not all(
            isinstance(e, dict) and isinstance(e.get("passed"), bool) and isinstance(e.get("history"), list)
            and all(isinstance(h, dict) and isinstance(h.get("passed"), bool) and isinstance(h.get("at"), str)
                    for h in e["history"]) for e in exercises.values()):
        raise ResultsFileError(f"{where}: \"exercises\" must map each exercise to passed (true/false) and a "
                               "history of checks, each with passed and its \"at\" time")
    return data


def read_results(path):
    """The checked results file at ``path`` (a regular file only, never followed through a link,
    a FIFO or a device); :class:`ResultsFileError` names the file and the defect."""
    try:
        data = read_json(path)
    except UnreadableFile as exc:
        raise ResultsFileError(str(exc)) from None
    return check_results(data, path)


def answers(data, assignment=None):
    """Item id -> that item's recorded answers in order (``"O"``, ``"X"`` or None for blank),
    only those given for ``assignment`` when one is named."""
    return {item_id: [e["answer"] for e in entry["history"]
                      if assignment is None or e.get("assignment") == assignment]
            for item_id, entry in data["items"].items()}


def next_box(box, correct):
    """The Leitner rule: a right answer moves the item up one box (to ``BOXES`` at most), a wrong
    or blank one back to box 1."""
    return min(BOXES, box + 1) if correct else 1


def _replay(entry):
    """Set an item's latest answer and Leitner box from its history."""
    box = 1
    for event in entry["history"]:
        box = next_box(box, event.get("correct"))
    last = entry["history"][-1]
    entry.update(answer=last["answer"], correct=bool(last.get("correct")), at=last.get("at", entry["at"]), box=box)


def _when(event):
    return event.get("at", "")


def merge_answers(data, other):
    """Add the answers recorded in ``other`` to ``data``: each history entry once (an entry equal in
    every field is the same answer), put in by time among the existing ones, the box replayed.
    Returns how many answers were new."""
    added = 0
    for item_id, entry in other["items"].items():
        mine = data["items"].setdefault(item_id, {"answer": None, "correct": False, "at": entry["at"],
                                                  "box": 1, "history": []})
        seen = {json.dumps(e, sort_keys=True) for e in mine["history"]}
        new = [e for e in entry["history"] if json.dumps(e, sort_keys=True) not in seen]
        if new:
            added += len(new)
            # existing entries stay as they are (and in their order); new ones go in by time
            mine["history"] = list(heapq.merge(mine["history"], sorted(new, key=_when), key=_when))
            _replay(mine)
    return added


@contextlib.contextmanager
def locked(path):
    """Hold an exclusive lock on ``.<name>.lock`` beside ``path`` (blocks until it is free)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
        yield
    finally:
        os.close(fd)  # releases the lock


def _temp_prefix(path):
    return f".{path.name}.tmp-"


def remove_stale_temps(path):
    """Delete temp files a killed writer left for ``path``; call with the lock held."""
    pattern = re.compile(re.escape(_temp_prefix(path)) + r"[a-z0-9_]{8}")
    for entry in path.parent.iterdir():
        if pattern.fullmatch(entry.name):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()


def atomic_write_text(path, text):
    """Replace ``path`` with ``text`` all at once: readers see the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix="")
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
    """One student's results file. Every :meth:`record` takes the lock, re-reads the file, appends
    and rewrites it, so any number of quizzes, tabs or processes answering for the same student
    keep each other's answers."""

    def __init__(self, student=None, results_dir=None):
        self.student = resolve_student(student)
        self.announce = results_dir is None and not os.environ.get("MPKIT_RESULTS_DIR")
        self.path = results_path(self.student, results_dir)
        self.session = uuid.uuid4().hex[:12]  # groups the answers given in one quiz widget
        if self.announce and student is None:  # not for a name given (an instructor reviewing kim)
            self._copy_in_legacy_answers()
        self.data = self._load()

    def _load(self, have_lock=False):
        """The file's content (a fresh one if there is none); moves an unreadable file aside, under
        the lock (taken here unless the caller holds it: a second flock in one process would wait
        for itself)."""
        if not os.path.lexists(self.path):
            stamp = now()
            return {"format": FORMAT, "version": VERSION, "student": self.student,
                    "created": stamp, "updated": stamp, "items": {}}
        try:
            data = read_results(self.path)
        except ResultsFileError as exc:
            if not have_lock:
                with locked(self.path):
                    return self._load(have_lock=True)   # another process may have fixed it meanwhile
            aside = self._move_aside()
            warnings.warn(f"{exc}. Moved it to {aside} (nothing deleted) and started a new results file.",
                          stacklevel=2)
            return self._load(have_lock=True)
        if data["student"] != self.student:
            raise ValueError(f"{self.path} holds the answers of {data['student']!r}, not {self.student!r} "
                             "(names that differ only in upper/lower case share a file on this disk); "
                             "choose a different student name")
        return data

    def _copy_in_legacy_answers(self):
        """Copy this student's answers from mpkit's first version (:func:`legacy_path`) into this
        file, under its lock, each once (so opening again adds only what that version wrote since),
        and say so in Korean and English when there were new ones. The old file is only read. Left
        alone: a file holding another name (the first version's stems could collide), one owned by
        another user, this very file (a folder linked to the data folder), one we cannot read (a
        warning: the quiz works on)."""
        try:
            old = legacy_path(self.student)
            if not old.is_file() or (self.path.exists() and os.path.samefile(old, self.path)):
                return
            if hasattr(os, "getuid") and old.stat().st_uid != os.getuid():
                return

            def copy_in(data):
                legacy = read_results(old)  # under the lock: what that version wrote until now
                if unicodedata.normalize("NFC", legacy["student"].strip()) != self.student:
                    return 0
                added = merge_answers(data, legacy)
                if added:
                    data.update(version=VERSION, updated=now())
                return added

            count = self._rewrite(copy_in)[1]
        except (OSError, ResultsFileError) as exc:
            warnings.warn(f"answers of an earlier mpkit were not copied to {self.path}: {exc}", stacklevel=3)
            return
        if count:
            values = dict(count=count, old=old, new=self.path)
            print(f"{t('copied_in', 'ko', **values)}\n{t('copied_in', 'en', **values)}", file=sys.stdout)

    def _move_aside(self):
        stem = f"{self.path.name}.corrupt-{datetime.now().strftime('%Y%m%dT%H%M%S')}"
        aside, counter = self.path.with_name(stem), 1
        while os.path.lexists(aside):
            aside, counter = self.path.with_name(f"{stem}-{counter}"), counter + 1
        self.path.rename(aside)
        return aside

    def record(self, answers, *, lang, mode, assignment=None):
        """Persist ``answers``, a list of ``(item_id, "O"|"X"|None, correct)``, with one atomic write.

        Returns the bilingual notice of where answers go when this was the kernel's first save into
        the default folder (also printed), else None."""
        def append(data):
            self._append(data, answers, lang=lang, mode=mode, assignment=assignment)
            return True

        self.data = self._rewrite(append)[0]
        return self._announce()

    def _rewrite(self, change):
        """Under the lock, re-read the file and ``change(data)``; write it back at once (atomically)
        when that returns something true. Returns (data, what ``change`` returned): every writer
        goes through here, so none loses another's answers."""
        with locked(self.path):
            remove_stale_temps(self.path)
            data = self._load(have_lock=True)
            changed = change(data)
            if changed:
                atomic_write_text(self.path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")
        return data, changed

    def _append(self, data, answers, *, lang, mode, assignment):
        stamp = now()
        for item_id, answer, correct in answers:
            entry = data["items"].setdefault(item_id, {"answer": answer, "correct": False, "at": stamp,
                                                       "box": 1, "history": []})
            event = {"answer": answer, "correct": bool(correct), "at": stamp,
                     "lang": lang, "mode": mode, "session": self.session}
            if assignment is not None:
                event["assignment"] = assignment
            entry["history"].append(event)
            entry.update(answer=answer, correct=bool(correct), at=stamp,
                         box=next_box(entry["box"], correct))
        data.update(version=VERSION, updated=stamp)

    def record_exercise(self, name, *, passed, score, at):
        """Append one exercise check (``passed``, ``score`` = [cases passed, cases]) under ``"exercises"``,
        through the same locked, atomic rewrite as the answers."""
        def append(data):
            entry = data.setdefault("exercises", {}).setdefault(name, {"passed": False, "history": []})
            entry["history"].append({"passed": bool(passed), "score": list(score), "at": at})
            entry["passed"] = entry["passed"] or bool(passed)
            data["updated"] = at
            return True

        self.data = self._rewrite(append)[0]
        return self._announce()

    def _announce(self):
        global _announced
        if self.announce and not _announced:
            _announced = True
            notice = f"{t('saved_in', 'ko', path=self.path)}\n{t('saved_in', 'en', path=self.path)}"
            print(notice, file=sys.stdout)
            return notice
        return None

    def box(self, item_id):
        """Leitner box 1..5 of an answered item, None if never answered."""
        entry = self.data["items"].get(item_id)
        return entry["box"] if entry else None

    def missed(self):
        """Ids answered wrong (or left blank in a submitted exam) at least once and not yet
        mastered (box < 5): lowest box first, then the one seen longest ago."""
        entries = [(entry["box"], entry["at"], item_id) for item_id, entry in self.data["items"].items()
                   if entry["box"] < BOXES and any(not e.get("correct") for e in entry["history"])]
        return [item_id for _, _, item_id in sorted(entries)]


class MemoryStore(ResultStore):
    """Keeps answers in memory only: what a quiz uses while nbgrader autogrades a notebook, so the
    grader's own files are never read or written from a student's notebook."""

    def __init__(self, student="autograde"):
        self.student, self.announce, self.path = student, False, None
        self.session = uuid.uuid4().hex[:12]
        self.data = {"format": FORMAT, "version": VERSION, "student": student, "items": {}}

    def record(self, answers, *, lang, mode, assignment=None):
        self._append(self.data, answers, lang=lang, mode=mode, assignment=assignment)
