"""Each benchmark script owns a section of docs/benchmarks.md between its own markers and
rewrites only that, so that one benchmark can be rerun alone (`./x bench NAME`) without
losing the others' figures."""

from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def replace(begin, end, text):
    """Puts `text` (which starts with `begin` and ends with `end`) in place of the
    section between those markers, or after the rest of the file where it has none."""
    current = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if begin in current and end in current:
        current = current[:current.index(begin)] + text + current[current.index(end) + len(end):]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(current)
