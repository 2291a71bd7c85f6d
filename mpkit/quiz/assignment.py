"""Assignment notebooks, graded from the notebook alone, with or without nbgrader.

Cells (all locked: nbgrader restores an edited one from its database before grading):

1. how to answer (markdown, Korean and English);
2. ``from mpkit import quiz``: the student types nothing and guesses no name;
3. per topic, a title and ``quiz.show([...], lang=..., mode=..., assignment=NAME)``;
4. the hand-in: ``quiz.hand_in(NAME, [...])`` (see :mod:`mpkit.quiz.handin`), nbgrader's graded
   cell, one point per item. In the instructor's copy it ends with the key::

       ### BEGIN HIDDEN TESTS
       ANSWER_KEY = {"mp-001": "O", ...}
       ### END HIDDEN TESTS

   ``nbgrader generate_assignment`` removes that region from the students' copy and autograde
   restores it, exactly as for hidden tests; :mod:`mpkit.quiz.nbgrader` reads it without running it.

The key goes in only for nbgrader: when the notebook is written to ``<course>/source/<name>/``
(nbgrader's layout), or when asked. A notebook written anywhere else is the students' copy, and
``mpkit quiz grade`` takes the key from the bank.
"""
import os
from pathlib import Path

from mpkit.i18n import t
from mpkit.quiz.handin import HAND_IN_ID, check_assignment
from mpkit.quiz.instructor import check_output_file

KEY_NAME = "ANSWER_KEY"
CONFIG_IMPORT = "from mpkit.quiz.nbgrader import configure"
CONFIG_BLOCK = (f"\n# mpkit: grade quiz answers from each submitted notebook, warn about test cells only when a student "
                f"edited one, wrap feedback lines (added by `mpkit quiz assign` / `mpkit exercise assign`)\n"
                f"{CONFIG_IMPORT}\nconfigure(c)\n")


def nbgrader_course(out):
    """The course folder when ``out`` is ``<course>/source/<assignment>/<notebook>.ipynb``, else None."""
    out = Path(os.path.abspath(out))
    return out.parents[2] if len(out.parents) > 2 and out.parent.parent.name == "source" else None


def _nbgrader(grade_id, *, points=None):
    meta = {"grade": points is not None, "solution": False, "locked": True, "task": False,
            "grade_id": grade_id, "schema_version": 3}
    if points is not None:
        meta["points"] = points
    return {"nbgrader": meta}


def _id_list(ids):
    return "[\n" + "".join(f"    {item_id!r},\n" for item_id in ids) + "]"


def hand_in_source(name, items, lang, key):
    """The graded cell: the hand-in call, and the key as hidden tests when ``key`` is true."""
    ids = [item.id for item in items]
    source = f"quiz.hand_in({name!r}, {_id_list(ids)}, lang={lang!r})"
    if key:
        answers = ", ".join(f"{item.id!r}: {item.answer!r}" for item in items)
        source += ("\n### BEGIN HIDDEN TESTS\n"
                   "# 정답: 학생용 노트북에서는 지워지고 채점할 때 복원됩니다.\n"
                   "# The key: removed from the students' copy, restored by nbgrader autograde.\n"
                   f"{KEY_NAME} = {{{answers}}}\n### END HIDDEN TESTS")
    return source


def assignment_notebook(items, bank, name, lang="ko", mode="exam", key=True):
    """The assignment as an nbformat notebook (see the module docstring for its cells)."""
    import nbformat  # here, not at module level: nbformat (+ jsonschema) costs seconds in every quiz.show

    check_assignment(name)
    by_topic = {}
    for item in items:
        by_topic.setdefault(item.topic, []).append(item.id)
    new_md, new_code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [
        new_md(f"# {t('title', 'ko')} / {t('title', 'en')} · {name}\n\n**한국어**\n\n{t('assign_steps', 'ko')}"
               f"\n\n**English**\n\n{t('assign_steps', 'en')}", metadata=_nbgrader("intro")),
        new_code("from mpkit import quiz", metadata=_nbgrader("setup")),
    ]
    for topic, ids in by_topic.items():
        cells.append(new_md(f"## {bank.titles[topic]['ko']} / {bank.titles[topic]['en']}",
                            metadata=_nbgrader(f"title_{topic}")))
        cells.append(new_code(f"quiz.show({_id_list(ids)}, lang={lang!r}, mode={mode!r}, assignment={name!r})",
                              metadata=_nbgrader(f"quiz_{topic}")))
    cells.append(new_md(f"## {t('hand_in', 'ko')} / {t('hand_in', 'en')}\n\n{t('hand_in_steps', 'ko')} {len(items)}  \n"
                        f"{t('hand_in_steps', 'en')} {len(items)}", metadata=_nbgrader("hand_in_title")))
    cells.append(new_code(hand_in_source(name, items, lang, key),
                          metadata=_nbgrader(HAND_IN_ID, points=len(items))))
    nb = nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}})
    nbformat.validate(nb)
    return nb


def register_nbgrader(course):
    """Make sure ``<course>/nbgrader_config.py`` runs :func:`mpkit.quiz.nbgrader.configure`;
    return ``(path, changed)``."""
    path = Path(course) / "nbgrader_config.py"
    text = path.read_text(encoding="utf-8") if path.exists() else "c = get_config()  # noqa\n"
    if CONFIG_IMPORT in text:
        return path, False
    path.write_text(text.rstrip("\n") + "\n" + CONFIG_BLOCK, encoding="utf-8")
    return path, True


def write_assignment(items, bank, out, name=None, lang="ko", mode="exam", key=None):
    """Write the notebook; for nbgrader's layout also register the grading preprocessors.

    Returns ``(name, key_included, nbgrader_config_path or None)``.
    """
    import nbformat

    out = Path(out)
    check_output_file(out, "hw1.ipynb")
    if out.suffix != ".ipynb":
        raise ValueError(f"--out must be a notebook file ending in .ipynb, got {out.name!r}")
    course = nbgrader_course(out)
    name = name or (out.parent.name if course else out.stem)
    try:
        check_assignment(name)
    except ValueError as exc:
        raise ValueError(f"{exc}; pass --name") from None
    key = course is not None if key is None else key
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(assignment_notebook(items, bank, name, lang, mode, key), out)
    config = register_nbgrader(course)[0] if course is not None else None
    return name, key, config
