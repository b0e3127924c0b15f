"""Checks the built documentation site (`make docs`), pytest-free.

    python .ci/docs-check.py out/site

1. Every name `multigpu` exports (`__all__` of python/multigpu/__init__.py)
   has an entry in the Python API page; every help topic of man/ has an R
   reference page, linked from the index unless internal, and every
   function the R package exports (NAMESPACE) has a help topic.
2. No R example or article printed an error.
3. Every internal link and image of every page, MkDocs' and pkgdown's,
   resolves: Debian's `linkchecker` over the final folder, from the home
   page and from each R page (a pkgdown page no link reaches is checked too).
   External links are not followed (the build machine has no web).

Exits non-zero, saying what is missing, when anything fails.
"""

import ast
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


def r_topics():
    """`{Rd file stem: (aliases, internal)}` of man/."""
    topics = {}
    for rd in sorted((ROOT / "man").glob("*.Rd")):
        text = rd.read_text()
        aliases = {alias.replace("\\%", "%")
                   for alias in re.findall(r"\\alias\{(.+?)\}\n", text)}
        topics[rd.stem] = (aliases, "\\keyword{internal}" in text)
    return topics


def missing_reference_entries(site):
    problems = []
    python_page = (site / "reference" / "python.html").read_text()
    for name in python_exports():
        if not re.search(rf'id="multigpu\.{re.escape(name)}"', python_page):
            problems.append(f"Python API page has no entry for multigpu.{name}")
    reference = site / "r" / "reference"
    index = (reference / "index.html").read_text()
    topics = r_topics()
    for stem, (_, internal) in topics.items():
        if not (reference / f"{stem}.html").is_file():
            problems.append(f"R reference has no page for man/{stem}.Rd")
        elif not internal and f'href="{stem}.html"' not in index:
            problems.append(f"R reference index does not link man/{stem}.Rd")
    documented = set().union(*(aliases for aliases, _ in topics.values()))
    exports = re.findall(r'^export\("?([^")]+)"?\)', (ROOT / "NAMESPACE").read_text(),
                         flags=re.M)
    for name in exports:
        if name not in documented:
            problems.append(f"R export {name}() has no help topic in man/")
    return problems


def failed_r_examples(site):
    """Errors in R examples and articles: pkgdown shows an example's error in
    the page (`r-err` output) instead of failing, as MkDocs' strict mode and
    rmarkdown do."""
    problems = []
    for page in sorted((site / "r").rglob("*.html")):
        for error in re.findall(r'<span class="r-err[^"]*">(.*?)</span>\n',
                                page.read_text()):
            text = re.sub(r"<[^>]+>", "", error).replace("&gt;", ">")
            problems.append(f"{page.relative_to(site)}: an example failed: {text}")
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
    problems = (missing_reference_entries(site) + failed_r_examples(site)
                + broken_links(site))
    for problem in problems:
        print(f"docs-check: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"docs-check: {site}: reference complete, R examples without errors, "
          "every internal link and image resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
