"""Instructor tools: grading collected answers, class statistics (``mpkit quiz grade|stats``).

Grading never executes anything and trusts nothing a student can edit:

* who: the collected file's name (``kim-2024001.json`` or ``kim-2024001.ipynb`` is student
  ``kim-2024001``); a ``"student"`` field inside that disagrees is reported, never believed;
* what: a results file's recorded answers (:mod:`mpkit.quiz.store`) or a notebook's answer sheet
  (:mod:`mpkit.quiz.handin`), marked with the bank's key by :mod:`mpkit.quiz.marking`: the first
  answer counts, retakes after the key was shown are counted and reported;
* anything unreadable in a folder (a FIFO, a folder named ``x.json``, a link, non-UTF-8, too large,
  nested too deeply, not ours) is skipped with its name and reason, and the rest is graded.

Grades layout (``GradeReport.write(out)``):

* ``out`` (e.g. ``grades.csv``), one row per student x item::

      student,item_id,topic,pitfall,answer_given,correct_answer,correct,attempts,last_answer

  ``answer_given`` is the graded (first) answer, ``O``, ``X`` or empty; ``correct`` is 1 or 0;
  ``attempts`` counts every recorded answer; ``last_answer`` is set when the item was retaken.
* ``<out stem>.summary.csv`` (e.g. ``grades.summary.csv``), one row per student::

      student,file,answered,correct,total,percent,retaken,note

Cells that a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, tab or
CR) are written with a leading ``'``. The items graded are the ones selected (``--items``/
``--topic``), else each student's answered items (results files only: a notebook's item list is
the student's to edit, so grading notebooks needs a selection).
"""
import csv
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from mpkit.quiz.handin import AnswerSheetError, hand_in_cell, sheet_in_cell
from mpkit.quiz.marking import mark
from mpkit.quiz.safeio import UnreadableFile, read_json
from mpkit.quiz.store import ResultsFileError, answers, read_results, student_of
from mpkit.i18n import t

GRADE_COLUMNS = ("student", "item_id", "topic", "pitfall", "answer_given", "correct_answer", "correct",
                 "attempts", "last_answer")
SUMMARY_COLUMNS = ("student", "file", "answered", "correct", "total", "percent", "retaken", "note")
SUBMISSION_SUFFIXES = (".json", ".ipynb")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def check_output_file(path, example):
    """ValueError unless ``path`` can be written as a file (checked before any work starts): a new
    name or a regular file. A link is refused (writing through it would replace the file it points
    to, e.g. one a student put among the collected files), and so is a FIFO (writing would wait forever)."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; give the name of a new or regular file "
                         "(writing would replace the file the link points to)")
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give a file name like {path / example}")
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a regular file (a FIFO or a device); give the name of a new or regular file")


def neutralise(value):
    """A CSV cell a spreadsheet shows as text, never runs as a formula."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_START) else value


@dataclass
class GradeReport:
    rows: list = field(default_factory=list)      # dicts with GRADE_COLUMNS
    summary: list = field(default_factory=list)   # dicts with SUMMARY_COLUMNS
    bad: list = field(default_factory=list)       # "<file>: <reason>" per file that could not be graded
    notes: list = field(default_factory=list)     # "<file>: <note>" per file graded with a remark

    def write(self, out):
        """Write the grades CSV and its ``.summary.csv`` sibling; return both paths."""
        out = Path(out)
        summary_path = out.with_name(f"{out.stem}.summary.csv")
        for path in (out, summary_path):
            check_output_file(path, "grades.csv")
        for path, columns, rows in ((out, GRADE_COLUMNS, self.rows),
                                    (summary_path, SUMMARY_COLUMNS, self.summary)):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows({k: neutralise(v) for k, v in row.items()} for row in rows)
        return out, summary_path


def _submission_files(submissions, bad):
    """Files named directly, and the ``.json``/``.ipynb`` entries of folders (not dot-files such as
    the store's locks and temp files). Entries are not opened here: :func:`read_json` judges them."""
    files = []
    for entry in map(Path, submissions):
        if entry.is_dir():
            files.extend(sorted(p for p in entry.iterdir()
                                if p.suffix in SUBMISSION_SUFFIXES and not p.name.startswith(".")))
        elif os.path.lexists(entry):
            files.append(entry)
        else:
            bad.append(f"{entry}: no such file or folder")
    return files


def _recorded(path, student, assignment, selected):
    """``(answers by item, note)`` from one collected file; raises for a file that cannot be graded."""
    if path.suffix != ".ipynb":
        data = read_results(path)
        note = (f"the file says student {data['student']!r}; graded as {student!r} from the file name"
                if data["student"] != student else "")
        return answers(data, assignment), note
    if not selected:
        raise AnswerSheetError(f"{path}: grading notebooks needs --items or --topic "
                               "(the item list must come from you, not from the student's file)")
    try:
        notebook = read_json(path)
    except UnreadableFile as exc:
        raise AnswerSheetError(str(exc)) from None
    cell = hand_in_cell(notebook, path)
    if cell is None:
        raise AnswerSheetError(f"{path}: no hand-in cell (not an assignment from `mpkit quiz assign`)")
    sheet = sheet_in_cell(cell, path)
    if sheet is None:
        return {}, t("no_sheet", "en")
    if assignment is not None and sheet["assignment"] != assignment:
        raise AnswerSheetError(f"{path}: the answer sheet is for assignment {sheet['assignment']!r}, "
                               f"not {assignment!r}")
    return sheet["answers"], ""


def grade(submissions, bank, items=None, assignment=None):
    """Grade collected results files and notebooks (or folders of them) against ``bank``'s key;
    ``assignment`` keeps only answers given in that assignment. See the module docstring."""
    report = GradeReport()
    graded_from = {}
    for path in _submission_files(submissions, report.bad):
        student = student_of(path.stem)
        if student in graded_from:
            report.bad.append(f"{path}: student {student!r} was already graded from {graded_from[student]}")
            continue
        try:
            recorded, note = _recorded(path, student, assignment, items is not None)
        except (ResultsFileError, AnswerSheetError) as exc:
            report.bad.append(str(exc))
            continue
        unknown = sorted(set(recorded) - set(bank.items))
        if unknown:
            report.bad.append(f"{path}: item ids not in the bank {bank.dir}: {', '.join(unknown)}")
            continue
        graded_from[student] = path
        graded = items if items is not None else [i for i in bank.items.values() if recorded.get(i.id)]
        marks = mark({item.id: item.answer for item in graded}, recorded)
        for item, m in zip(graded, marks):
            report.rows.append({"student": student, "item_id": item.id, "topic": item.topic,
                                "pitfall": item.pitfall, "answer_given": m.given, "correct_answer": item.answer,
                                "correct": int(m.correct), "attempts": m.attempts,
                                "last_answer": m.last if m.retaken else ""})
        right = sum(m.correct for m in marks)
        if note:
            report.notes.append(f"{path}: {note}")
        report.summary.append({"student": student, "file": str(path),
                               "answered": sum(bool(m.given) for m in marks), "correct": right,
                               "total": len(marks), "percent": f"{100 * right / len(marks):.1f}" if marks else "",
                               "retaken": sum(m.retaken for m in marks), "note": note})
    return report


def stats(grades_csv):
    """Plain-text class statistics from a grades CSV: items hardest first, pitfalls by error rate.

    Only answered rows count towards difficulty and error rates; blanks are listed per item.
    """
    if Path(grades_csv).is_dir():
        raise ValueError(f"{grades_csv} is a folder; give the grades CSV that `mpkit quiz grade` wrote")
    with open(grades_csv, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            missing = set(GRADE_COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise ValueError(f"{grades_csv} is not a grades CSV from `mpkit quiz grade` "
                                 f"(missing columns: {', '.join(sorted(missing))})")
            rows = []
            for row in reader:  # a short row reads None, a long one keeps its extra values under None
                if None in row or None in row.values() or row["correct"] not in ("0", "1"):
                    raise ValueError(f"{grades_csv}, line {reader.line_num}: not a row of `mpkit quiz grade` "
                                     f"({len(GRADE_COLUMNS)} values, correct 0 or 1); grade the submissions again")
                rows.append(row)
        except csv.Error as exc:
            raise ValueError(f"{grades_csv}, near line {reader.line_num + 1}: not a grades CSV from "
                             f"`mpkit quiz grade` ({exc})") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{grades_csv}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    per_item, per_pitfall = defaultdict(lambda: [0, 0, 0]), defaultdict(lambda: [0, 0])
    meta = {}
    for row in rows:
        meta[row["item_id"]] = (row["topic"], row["pitfall"])
        tally = per_item[row["item_id"]]
        if not row["answer_given"]:
            tally[2] += 1
            continue
        right = row["correct"] == "1"
        tally[0] += 1
        tally[1] += right
        per_pitfall[row["pitfall"]][0] += 1
        per_pitfall[row["pitfall"]][1] += not right
    items = sorted(per_item.items(), key=lambda kv: (kv[1][1] / kv[1][0] if kv[1][0] else 2, kv[0]))
    pitfalls = sorted(per_pitfall.items(), key=lambda kv: (-kv[1][1] / kv[1][0], kv[0]))
    item_table = _table(("item", "topic", "pitfall", "n", "correct", "blank"),
                        [(item_id, *meta[item_id], n, _share(right, n), blank)
                         for item_id, (n, right, blank) in items])
    pitfall_table = _table(("pitfall", "answers", "wrong", "error rate"),
                           [(tag, n, wrong, _share(wrong, n)) for tag, (n, wrong) in pitfalls])
    students = len({row["student"] for row in rows})
    return (f"{students} students, {len(rows)} graded answers\n\n"
            f"Items, hardest first (share correct among answers):\n{item_table}\n\n"
            f"Pitfalls, most errors first:\n{pitfall_table}")


def _share(part, whole):
    return f"{part / whole:.0%}" if whole else "-"


def _table(headers, rows):
    """Left-aligned text columns, two spaces apart."""
    cells = [list(map(str, headers))] + [list(map(str, row)) for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)
