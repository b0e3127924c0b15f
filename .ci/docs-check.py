"""Checks the built documentation site (`make docs`), pytest-free.

    python .ci/docs-check.py out/site

1. Every name `multigpu` exports (`__all__` of python/multigpu/__init__.py)
   has an entry in the Python API page, and every function the R package
   exports (NAMESPACE) is in the R reference index.
2. Every internal link and image of every page, MkDocs' and pkgdown's,
   resolves: Debian's `linkchecker` over the final folder, from the home
   page and from each R page (a pkgdown page no link reaches is checked too).
   External links are not followed (the build machine has no web).

Exits non-zero, saying what is missing, when anything fails.
"""

import ast
import html
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_exports():
    tree = ast.parse((ROOT / "python" / "multigpu" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("docs-check: python/multigpu/__init__.py has no __all__")


def r_exports():
    namespace = (ROOT / "NAMESPACE").read_text()
    names = re.findall(r'^export\("?([^")]+)"?\)', namespace, flags=re.M)
    methods = re.findall(r"^S3method\(([^,]+),([^)]+)\)", namespace, flags=re.M)
    return names, [f"{generic}.{cls}" for generic, cls in methods]


def missing_reference_entries(site):
    problems = []
    python_page = (site / "reference" / "python.html").read_text()
    for name in python_exports():
        if f'id="multigpu.{name}"' not in python_page:
            problems.append(f"Python API page has no entry for multigpu.{name}")
    r_index = html.unescape((site / "r" / "reference" / "index.html").read_text())
    names, methods = r_exports()
    for name in names:
        if f"{name}(" not in r_index and f">{name}<" not in r_index:
            problems.append(f"R reference index does not list {name}()")
    pages = {p.stem for p in (site / "r" / "reference").glob("*.html")}
    for method in methods:
        # A method is documented on its own page or on its generic's topic.
        if not any(method in (site / "r" / "reference" / f"{p}.html").read_text()
                   for p in pages):
            problems.append(f"R reference documents no S3 method {method}")
    return problems


def broken_links(site):
    starts = [site / "index.html"] + sorted((site / "r").rglob("*.html"))
    result = subprocess.run(
        ["linkchecker", "--no-status", "--no-warnings", "--threads=4",
         "--ignore-url=^https?://", "--ignore-url=^mailto:",
         *[start.as_uri() for start in starts]],
        capture_output=True, text=True,
    )
    if result.returncode == 0:
        return []
    return [f"linkchecker (exit {result.returncode}):\n{result.stdout}{result.stderr}"]


def main(argv):
    site = pathlib.Path(argv[1] if len(argv) > 1 else ROOT / "out" / "site").resolve()
    for page in (site / "index.html", site / "reference" / "python.html",
                 site / "r" / "reference" / "index.html"):
        if not page.is_file():
            raise SystemExit(f"docs-check: {page} was not built")
    problems = missing_reference_entries(site) + broken_links(site)
    for problem in problems:
        print(f"docs-check: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"docs-check: {site}: reference complete, every internal link and image resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
