"""Printable O/X sheets for paper exams: the question sheet carries no answers, the key is a
separate file (``sheet.html`` -> ``sheet.key.html``) so the sheet can be handed out as is.

HTML declares UTF-8 and a Korean-capable font stack, so Hangul prints without tofu boxes.
"""
import html
from pathlib import Path

from mpkit.i18n import t
from mpkit.quiz.instructor import check_output_file

FONTS = '"Nanum Gothic", "NanumGothic", "Noto Sans CJK KR", "Noto Sans KR", "Malgun Gothic", sans-serif'
FORMATS = (".html", ".md")
CSS = (f"body {{ font-family: {FONTS}; max-width: 48em; margin: 2em auto; line-height: 1.5; }}\n"
       "li { margin: 0.6em 0; } .marks { white-space: nowrap; margin-left: 1em; }\n"
       ".id { color: #666; font-size: 0.8em; } table { border-collapse: collapse; }\n"
       "td, th { border: 1px solid #999; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }")


def key_path(out):
    out = Path(out)
    return out.with_name(f"{out.stem}.key{out.suffix}")


def write_sheet(items, bank, out, lang="ko"):
    """Write the question sheet to ``out`` (.html or .md) and the key beside it; return both paths."""
    out = Path(out)
    check_output_file(out, "sheet.html")
    check_output_file(key_path(out), "sheet.key.html")
    if out.suffix not in FORMATS:
        raise ValueError(f"--out must end in .html or .md, got {out.name!r}")
    topics = {item.topic for item in items}
    title = bank.titles[topics.pop()][lang] if len(topics) == 1 else t("title", lang)
    render = _html if out.suffix == ".html" else _markdown
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(items, lang, title, key=False), encoding="utf-8")
    key_path(out).write_text(render(items, lang, f"{title} · {t('key_title', lang)}", key=True),
                             encoding="utf-8")
    return out, key_path(out)


def _explain(item, lang):
    """Explanation and (for X) corrected statement lines: key only, like the answer itself."""
    parts = [f"{t('explanation', lang)}: {item.explanation[lang]}"]
    if item.corrected:
        parts.append(f"{t('corrected', lang)}: {item.corrected[lang]}")
    return parts


def _html(items, lang, title, key):
    esc = html.escape
    if key:
        rows = "".join(f"<tr><td>{n}</td><td class=\"id\">{esc(item.id)}</td><td><b>{item.answer}</b></td>"
                       f"<td>{'<br>'.join(map(esc, _explain(item, lang)))}</td></tr>\n"
                       for n, item in enumerate(items, start=1))
        body = (f"<table><tr><th>#</th><th>id</th><th>{t('right_answer', lang)}</th>"
                f"<th>{t('explanation', lang)}</th></tr>\n{rows}</table>")
    else:
        entries = "".join(f"<li>{esc(item.statement[lang])}<span class=\"marks\">☐ O &nbsp; ☐ X</span> "
                          f"<span class=\"id\">{esc(item.id)}</span></li>\n" for item in items)
        body = (f"<p>{t('sheet_name', lang)}: ________________ &nbsp; {t('sheet_date', lang)}: __________</p>\n"
                f"<p>{t('sheet_instructions', lang)}</p>\n<ol>\n{entries}</ol>")
    return (f"<!DOCTYPE html>\n<html lang=\"{lang}\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{esc(title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n"
            f"<h1>{esc(title)}</h1>\n{body}\n</body>\n</html>\n")


def _markdown(items, lang, title, key):
    lines = [f"# {title}", ""]
    if key:
        for n, item in enumerate(items, start=1):
            answer = f"**{t('right_answer', lang)}: {item.answer}**"
            lines.append(f"{n}. `{item.id}` " + "  \n   ".join([answer, *_explain(item, lang)]))
    else:
        lines += [f"{t('sheet_name', lang)}: ________  {t('sheet_date', lang)}: ________", "",
                  t("sheet_instructions", lang), ""]
        lines += [f"{n}. {item.statement[lang]} — ☐ O ☐ X `{item.id}`" for n, item in enumerate(items, start=1)]
    return "\n".join(lines) + "\n"
