"""Size and shape limits of the package (issue 41), read from the source.

No function radon grades D or worse (cyclomatic complexity above 20), none
longer than 60 lines, no module over 500 lines. Every assertion names its
offenders, so a failure says what to split. (What the rooms may import:
``test_import_graph.py``; the pure core's imports: ``test_purity.py``.)
"""
import ast
from pathlib import Path

from radon.complexity import cc_rank, cc_visit

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "kvldp"
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500
WORST_RANK = "C"           # radon's grades run A (simple) … F; D starts at complexity 21

def sources(under: Path = PKG) -> list[Path]:
    return sorted(under.rglob("*.py"))


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_function_graded_d_or_worse():
    bad = [f"{relative(path)}:{block.lineno} {block.fullname} {cc_rank(block.complexity)} ({block.complexity})"
           for path in sources() for block in cc_visit(path.read_text(encoding="utf-8"))
           if cc_rank(block.complexity) > WORST_RANK]
    assert not bad, "functions radon grades D or worse (extract helpers):\n" + "\n".join(bad)


def test_no_function_over_60_lines():
    bad = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{relative(path)}:{node.lineno} {node.name} {length} lines")
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(bad)


def test_no_file_over_500_lines():
    bad = [f"{relative(path)} {n} lines" for path in sources()
           if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not bad, f"modules over {MAX_FILE_LINES} lines (split them by job):\n" + "\n".join(bad)
