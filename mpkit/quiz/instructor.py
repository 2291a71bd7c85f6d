"""Instructor tools: assignment notebooks, grading saved answers, class statistics.

Grading never executes student code and never trusts a score or ``correct`` flag written into a
results file: it reads the recorded answers and recomputes every mark from the bank's key.

Grades layout (``GradeReport.write(out)``):

* ``out`` (e.g. ``grades.csv``), one row per student x item::

      student,item_id,topic,pitfall,answer_given,correct_answer,correct

  ``answer_given`` is ``O``, ``X`` or empty (not answered); ``correct`` is 1 or 0.
* ``<out stem>.summary.csv`` (e.g. ``grades.summary.csv``), one row per student::

      student,file,answered,correct,total,percent

The items graded are the ones selected (``--items``/``--topic``), else each student's answered items.
"""
import csv
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from mpkit.quiz.bank import load_bank
from mpkit.quiz.store import ResultsFileError, read_results, results_path
from mpkit.i18n import t

GRADE_COLUMNS = ("student", "item_id", "topic", "pitfall", "answer_given", "correct_answer", "correct")
SUMMARY_COLUMNS = ("student", "file", "answered", "correct", "total", "percent")


def mark(data, items):
    """Grade rows (dicts with GRADE_COLUMNS) for ``items`` from a parsed results file."""
    rows = []
    for item in items:
        given = data["items"].get(item.id, {}).get("answer", "")
        rows.append({"student": data["student"], "item_id": item.id, "topic": item.topic,
                     "pitfall": item.pitfall, "answer_given": given, "correct_answer": item.answer,
                     "correct": int(given == item.answer)})
    return rows


def points(item_ids, student=None, results_dir=None, bank_dir=None):
    """How many of ``item_ids`` the student's saved answers get right (0 without a results file).

    An assignment notebook's graded cell returns this number, which nbgrader takes as partial credit.
    """
    items = load_bank(bank_dir).select(list(item_ids))
    path = results_path(student, results_dir)
    if not path.exists():
        return 0
    return sum(row["correct"] for row in mark(read_results(path), items))


@dataclass
class GradeReport:
    rows: list = field(default_factory=list)      # dicts with GRADE_COLUMNS
    summary: list = field(default_factory=list)   # dicts with SUMMARY_COLUMNS
    bad: list = field(default_factory=list)       # one message per file that could not be graded

    def write(self, out):
        """Write the grades CSV and its ``.summary.csv`` sibling; return both paths."""
        out = Path(out)
        summary_path = out.with_name(f"{out.stem}.summary.csv")
        for path, columns, rows in ((out, GRADE_COLUMNS, self.rows),
                                    (summary_path, SUMMARY_COLUMNS, self.summary)):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
        return out, summary_path


def _submission_files(submissions, bad):
    """Results files named directly or found in folders (moved-aside ``.corrupt-`` files skipped)."""
    files = []
    for entry in map(Path, submissions):
        if entry.is_dir():
            files.extend(sorted(p for p in entry.glob("*.json") if ".corrupt-" not in p.name))
        elif entry.is_file():
            files.append(entry)
        else:
            bad.append(f"{entry}: no such file or folder")
    return files


def grade(submissions, bank, items=None):
    """Grade results files / folders of them against ``bank``'s key; see the module docstring."""
    report = GradeReport()
    first_file = {}
    for path in _submission_files(submissions, report.bad):
        try:
            data = read_results(path)
        except ResultsFileError as exc:
            report.bad.append(str(exc))
            continue
        unknown = sorted(set(data["items"]) - set(bank.items))
        if unknown:
            report.bad.append(f"{path}: item ids not in the bank {bank.dir}: {', '.join(unknown)}")
            continue
        student = data["student"]
        if student in first_file:
            report.bad.append(f"{path}: student {student!r} was already graded from {first_file[student]}")
            continue
        first_file[student] = path
        graded = items if items is not None else [i for i in bank.items.values() if i.id in data["items"]]
        rows = mark(data, graded)
        right = sum(row["correct"] for row in rows)
        report.rows.extend(rows)
        report.summary.append({"student": student, "file": str(path),
                               "answered": sum(bool(row["answer_given"]) for row in rows),
                               "correct": right, "total": len(rows),
                               "percent": f"{100 * right / len(rows):.1f}" if rows else ""})
    return report


def stats(grades_csv):
    """Plain-text class statistics from a grades CSV: items hardest first, pitfalls by error rate.

    Only answered rows count towards difficulty and error rates; blanks are listed per item.
    """
    with open(grades_csv, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = set(GRADE_COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{grades_csv} is not a grades CSV from `mpkit quiz grade` "
                             f"(missing columns: {', '.join(sorted(missing))})")
        rows = list(reader)
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


def _nbgrader(grade_id, *, locked, solution=False, points=None):
    meta = {"grade": points is not None, "solution": solution, "locked": locked, "task": False,
            "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def assignment_notebook(items, bank, lang="ko", mode="exam"):
    """An nbgrader-compatible notebook: intro, setup (STUDENT), one quiz cell per topic, graded score."""
    import nbformat  # here, not at module level: nbformat (+ jsonschema) costs seconds in every quiz.show

    by_topic = {}
    for item in items:
        by_topic.setdefault(item.topic, []).append(item.id)
    new_md, new_code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [
        new_md(f"# {t('title', 'ko')} / {t('title', 'en')}\n\n**한국어**\n\n{t('assign_steps', 'ko')}\n\n"
               f"**English**\n\n{t('assign_steps', 'en')}", metadata=_nbgrader("intro", locked=True)),
        new_code('from mpkit import quiz\n\nSTUDENT = None  # 이름 또는 학번 / your name or id, '
                 'e.g. "kim-2024001" (None: your login name)',
                 metadata=_nbgrader("setup", locked=False, solution=True)),
    ]
    for topic, ids in by_topic.items():
        cells.append(new_md(f"## {bank.titles[topic]['ko']} / {bank.titles[topic]['en']}",
                            metadata=_nbgrader(f"title_{topic}", locked=True)))
        cells.append(new_code(f"quiz.show({_id_list(ids)}, lang={lang!r}, mode={mode!r}, student=STUDENT)",
                              metadata=_nbgrader(f"quiz_{topic}", locked=True)))
    all_ids = [item.id for item in items]
    cells.append(new_md(f"## {t('score', 'ko')} / {t('score', 'en')}\n\n{t('score_cell', 'ko')}: {len(all_ids)}  \n"
                        f"{t('score_cell', 'en')}: {len(all_ids)}", metadata=_nbgrader("score_title", locked=True)))
    cells.append(new_code(f"quiz.points({_id_list(all_ids)}, student=STUDENT)",
                          metadata=_nbgrader("score", locked=True, points=len(all_ids))))
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}})
    nbformat.validate(nb)
    return nb


def _id_list(ids):
    return "[\n" + "".join(f"    {item_id!r},\n" for item_id in ids) + "]"


def write_assignment(items, bank, out, lang="ko", mode="exam"):
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import nbformat

    nbformat.write(assignment_notebook(items, bank, lang, mode), out)
    return out
