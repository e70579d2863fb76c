"""The documents speak of the project to its users: no issue numbers, no words of how the work
was organised ("session", "lease"), no paths of a developer's machine, in any Markdown file of
the repository or in a docstring of the code and tests."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DOC_WORDS = re.compile(r"\bissues? ?#?\d+|\bsessions?\b|\bleases?\b|/work/|/home/\w|/root/|"
                       r"/Users/\w|\.\./shared\b", re.IGNORECASE)
# In code, only the project's own issue numbers ("(issue 14)", "see issue 30"): another
# project's issue cited by name stays ("tensor2tensor issue 317")
CODE_WORDS = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
OTHER_PROJECT = re.compile(r"(tensor2tensor|fairseq|pytorch|torch|transformers|sacrebleu|"
                           r"ctranslate2|sentencepiece|uvicorn|starlette|github)\S* $",
                           re.IGNORECASE)


def tracked(*patterns: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=ROOT, text=True,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def test_documents_name_no_issue_session_lease_or_machine_path():
    found = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
             for p in tracked("*.md")
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in DOC_WORDS.finditer(line)]
    assert not found, "\n".join(found)


def test_code_and_tests_cite_no_issue_of_this_project():
    found = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
             for p in tracked("nmt/*.py", "tests/*.py", "benchmarks/*.py", "examples/*.py")
             if p.name != "test_docs_words.py"
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in CODE_WORDS.finditer(line)
             if not OTHER_PROJECT.search(line[:m.start()])]
    assert not found, "\n".join(found)
