#!/usr/bin/env python3
"""The maps of the tree stay true:
  (a) docs/architecture.md's "The map of the tree" has a table for every folder of host/, kernels/,
      lua/ and experiments/ that holds files, naming each of its files (or matching it with a `*`
      name), and tables for tests/, scripts/, cmake/ and the top level naming their entries; it names
      nothing that is not there;
  (b) every path that docs/architecture.md and docs/building.md write in backticks exists;
  (c) docs/building.md's tests table has a row for every C and command-line test file and names every
      test CMakeLists.txt adds, and names no test or file that is not there.
A failure says which name to add to (or remove from) which table.

    python3 tests/cli/test_tree_map.py [path/to/tfhost]   (the binary is not needed)
"""
import fnmatch
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARCH = "docs/architecture.md"
BUILDING = "docs/building.md"
MAP_SECTION = "The map of the tree"
# Folders whose every file, at every depth, the map names.
WHOLE = ["host", "kernels", "lua", "experiments"]
# Folders whose entries (files and folders, one level) the map names; "" is the top level.
SHALLOW = ["", "tests", "scripts", "cmake"]
TOP_LEVEL = "the top level"
TICKED = re.compile(r"`([^`]+)`")


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def ignored(name):
    """Entries of the tree that are not the project's: hidden ones and build folders."""
    return name.startswith(".") or name == "build" or name.startswith("build-") or name == "__pycache__"


_FILES = {}


def tree_files():
    """Every file of the tree, relative to ROOT: what git tracks and what it would add (so a stray
    empty folder or a build output is not the project's), or, outside a git checkout, every file
    below ROOT but hidden ones and build folders."""
    if ROOT not in _FILES:
        try:
            out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                                 capture_output=True, check=True).stdout.decode()
            files = {f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))}
        except (OSError, subprocess.CalledProcessError):
            files = set()
            for dirpath, dirnames, filenames in os.walk(ROOT):
                dirnames[:] = [d for d in dirnames if not ignored(d)]
                rel = os.path.relpath(dirpath, ROOT)
                files.update(os.path.normpath(os.path.join(rel, f)) for f in filenames if not ignored(f))
        _FILES[ROOT] = files
    return _FILES[ROOT]


def entries(folder):
    """(files, subfolders) of a folder of the tree, names only, sorted."""
    prefix = folder + "/" if folder else ""
    files, dirs = set(), set()
    for path in tree_files():
        if not path.startswith(prefix):
            continue
        head, sep, _ = path[len(prefix):].partition("/")
        if not ignored(head):
            (dirs if sep else files).add(head)
    return sorted(files), sorted(dirs)


def folders_below(root):
    """root and every folder under it that holds a file of the tree."""
    out = {root}
    for path in tree_files():
        if path.startswith(root + "/"):
            parts = path.split("/")[:-1]
            out.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def section(text, title, level="##"):
    """The text of the section with this title, up to the next heading of its level."""
    m = re.search(r"^%s %s\n(.*?)(?=^%s [^#]|\Z)" % (level, re.escape(title), level), text, re.S | re.M)
    return m.group(1) if m else None


def table_rows(text):
    """The first cell and the line number (within text) of every row of the tables in text."""
    rows = []
    for i, line in enumerate(text.split("\n")):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells or re.fullmatch(r":?-+:?", cells[0]) or not TICKED.search(cells[0]):
            continue  # the separator, or a header without names
        rows.append((cells[0], i))
    return rows


def parse_map():
    """{folder: [names]} of docs/architecture.md's map, and the problems of its shape."""
    text = section(read(ARCH), MAP_SECTION)
    if text is None:
        return None, ["%s has no section '## %s'" % (ARCH, MAP_SECTION)]
    tables, problems = {}, []
    for m in re.finditer(r"^### (.+?)\n(.*?)(?=^### |\Z)", text, re.S | re.M):
        heading, body = m.group(1).strip(), m.group(2)
        if heading == TOP_LEVEL:
            folder = ""
        else:
            t = TICKED.fullmatch(heading)
            if not t or not t.group(1).endswith("/"):
                problems.append("%s, map: the heading '### %s' should name a folder as `path/`" % (ARCH, heading))
                continue
            folder = t.group(1).rstrip("/")
        names = []
        for cell, _ in table_rows(body):
            names.extend(TICKED.findall(cell))
        if folder in tables:
            problems.append("%s, map: two tables for %s/" % (ARCH, folder))
        tables[folder] = names
    return tables, problems


def where(folder):
    return "the table under '### %s'" % (TOP_LEVEL if folder == "" else "`%s/`" % folder)


def map_problems():
    tables, problems = parse_map()
    if tables is None:
        return problems
    required = {}  # folder -> True: its subfolders too must be accounted for
    for root in WHOLE:
        for folder in folders_below(root):
            required[folder] = True
    for folder in SHALLOW:
        required[folder] = True
    for folder in sorted(required):
        files, dirs = entries(folder)
        names = tables.get(folder)
        if names is None:
            if files or folder in SHALLOW:
                listed = ", ".join(files + [d + "/" for d in dirs])
                problems.append("%s/ has no table in %s's map: add a section '### `%s/`' with a row for each of: %s"
                                % (folder, ARCH, folder, listed))
            continue
        seen = set()
        for n in names:
            if n in seen:
                problems.append("%s, map: %s names `%s` twice" % (ARCH, where(folder), n))
            seen.add(n)
        file_names = [n for n in names if not n.endswith("/")]
        dir_names = [n.rstrip("/") for n in names if n.endswith("/")]
        for f in files:
            if not any(fnmatch.fnmatchcase(f, n) for n in file_names):
                path = os.path.join(folder, f)
                problems.append("%s is not in %s's map: add a row | `%s` | what it is | to %s" % (path, ARCH, f, where(folder)))
        for d in dirs:
            sub = os.path.join(folder, d)
            needs_table = sub in required and entries(sub)[0]  # said below, as its own problem
            if d not in dir_names and sub not in tables and not needs_table:
                problems.append("%s/ is not in %s's map: add a row | `%s/` | what it holds | to %s (or a table of its own)"
                                % (sub, ARCH, d, where(folder)))
        for n in file_names:
            if not any(fnmatch.fnmatchcase(f, n) for f in files):
                problems.append("%s, map: %s names `%s`, which is not a file of %s/: remove it (or mend the name)"
                                % (ARCH, where(folder), n, folder or "."))
        for d in dir_names:
            if d not in dirs:
                problems.append("%s, map: %s names `%s/`, which is not a folder of %s/: remove it"
                                % (ARCH, where(folder), d, folder or "."))
    for folder in sorted(tables):
        if folder not in required:
            if not os.path.isdir(os.path.join(ROOT, folder)):
                problems.append("%s, map: the table of %s/ is for a folder that is not in the tree: remove it"
                                % (ARCH, folder))
            else:
                problems.append("%s, map: %s/ is not a folder the map covers (%s, their subfolders, %s)"
                                % (ARCH, folder, ", ".join(WHOLE), ", ".join(f or "the top level" for f in SHALLOW)))
    return problems


PATH_ROOTS = ("host/", "kernels/", "lua/", "experiments/", "tests/", "scripts/", "cmake/", "docs/")


def exists(path):
    """Whether a path (or a * pattern) names something in the tree."""
    if "*" not in path:
        return os.path.exists(os.path.join(ROOT, path))
    folder, pattern = os.path.split(path.rstrip("/"))
    full = os.path.join(ROOT, folder)
    return os.path.isdir(full) and any(fnmatch.fnmatchcase(n, pattern) for n in os.listdir(full))


def doc_path_problems():
    problems = []
    for doc in (ARCH, BUILDING):
        for lineno, line in enumerate(read(doc).split("\n"), 1):
            for token in TICKED.findall(line):
                token = token.strip()
                if not token.startswith(PATH_ROOTS) or re.search(r"[<>\s$]", token):
                    continue  # not a path of the tree, or a placeholder (kernels/cpu/<family>.c)
                if not exists(token):
                    problems.append("%s:%d names `%s`, which is not in the tree: mend or remove it" % (doc, lineno, token))
    return problems


def cmake_tests():
    """(literal names, patterns) of CMakeLists.txt's add_test(NAME ...): a name with ${...} becomes
    a regular expression; c_, lua_ and cli_ names made from tests/c, tests/lua, tests/cli files are
    left to the files."""
    literal, patterns = set(), []
    for name in re.findall(r"add_test\(NAME\s+(\S+)", read("CMakeLists.txt")):
        if "${" not in name:
            literal.add(name)
        elif not re.fullmatch(r"(c|lua|cli)_\$\{name\}", name):
            patterns.append(name)
    return literal, patterns


def pattern_regex(name):
    return re.compile("".join(".+" if p.startswith("${") else re.escape(p) for p in re.split(r"(\$\{[^}]*\})", name)))


def test_table():
    """docs/building.md's tests table: [(paths, test names, line)]."""
    text = read(BUILDING)
    body = section(text, "Tests")
    if body is None:
        return None
    start = text.index(body)
    rows = []
    for cell, i in table_rows(body.split("\n\n| harness |")[0]):
        paths, names, folder = [], [], None
        for token in TICKED.findall(cell):
            if "/" in token:
                paths.append(token)
                folder = os.path.dirname(token)
            elif "." in token and folder is not None:
                paths.append(os.path.join(folder, token))  # `tests/c/test_model.c`, `test_model_kernels.c`
            else:
                names.append(token)
        rows.append((paths, names, text[:start].count("\n") + i + 1))
    return rows


def test_table_problems():
    rows = test_table()
    if rows is None:
        return ["%s has no section '## Tests'" % BUILDING]
    problems = []
    explicit = {p for paths, _, _ in rows for p in paths if "*" not in p}
    globs = [p for paths, _, _ in rows for p in paths if "*" in p]
    table_names = [n for _, names, _ in rows for n in names]
    add = "add a row | `%s` | what it checks | to the tests table of %s (section 'Tests')"
    files = {}
    for folder, prefix, glob in (("tests/c", "c_", "test_*.c"), ("tests/cli", "cli_", "test_*.py"),
                                 ("tests/lua", "lua_", "test_*.lua")):
        for f in sorted(fnmatch.filter(os.listdir(os.path.join(ROOT, folder)), glob)):
            path = folder + "/" + f
            files[prefix + os.path.splitext(f)[0]] = path
            # every C and command-line test has its own row; Lua tests may share tests/lua/test_*.lua's
            shared = folder == "tests/lua" and any(fnmatch.fnmatchcase(path, g) for g in globs)
            if path not in explicit and not shared:
                problems.append("%s has no row: %s" % (path, add % (path, BUILDING)))
    literal, patterns = cmake_tests()
    for name in sorted(literal):
        if name not in table_names:
            problems.append("the test %s (CMakeLists.txt) is not named in %s's tests table: add `%s` to the first "
                            "cell of the row of what it runs" % (name, BUILDING, name))
    regexes = [(p, pattern_regex(p)) for p in patterns]
    for p, rx in regexes:
        if not any(rx.fullmatch(n) for n in table_names):
            problems.append("the tests %s (CMakeLists.txt) are not named in %s's tests table: add their names to "
                            "the first cell of the row of what they run" % (p, BUILDING))
    for paths, names, line in rows:
        for p in paths:
            if not exists(p):
                problems.append("%s:%d names `%s`, which is not in the tree: remove it from the row" % (BUILDING, line, p))
        for n in names:
            known = n in literal or n in files or any(rx.fullmatch(n) for _, rx in regexes)
            if not known:
                problems.append("%s:%d names the test `%s`, which CMakeLists.txt does not add: remove it" % (BUILDING, line, n))
    return problems


def report(problems):
    return "\n" + "\n".join("  " + p for p in problems)


class TreeMap(unittest.TestCase):
    def test_map_names_every_file_and_only_those(self):
        problems = map_problems()
        if problems:
            self.fail(report(problems))

    def test_paths_in_the_docs_exist(self):
        problems = doc_path_problems()
        if problems:
            self.fail(report(problems))

    def test_tests_table_names_every_test(self):
        problems = test_table_problems()
        if problems:
            self.fail(report(problems))

    def test_the_checks_see_what_they_check(self):
        # the parsers read real tables: a map of every layer's folder and a tests table with the C tests
        tables, _ = parse_map()
        self.assertIsNotNone(tables)
        for folder in ("host/bind", "kernels/cuda/flash", "lua/tf", "experiments", "tests", ""):
            self.assertIn(folder, tables)
            self.assertTrue(tables[folder], folder)
        rows = test_table()
        self.assertTrue(rows and any("tests/c/test_alloc.c" in paths for paths, _, _ in rows))
        literal, patterns = cmake_tests()
        self.assertIn("layering_check", literal)
        self.assertTrue(any(pattern_regex(p).fullmatch("dist_2_ranks") for p in patterns))
        self.assertTrue(exists("host/bind/l_*.c") and not exists("host/bind/l_nothing_*.c"))


class CatchesWhatIsMissing(unittest.TestCase):
    """The checks against a tree they were not written for: a file added, a name left over."""

    def setUp(self):
        import tempfile
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_a_new_file_and_a_stale_name_are_named(self):
        global ROOT
        saved = ROOT
        root = self.tmp.name
        for folder in WHOLE + ["tests/c", "tests/cli", "tests/lua", "scripts", "cmake", "docs", "host/app"]:
            os.makedirs(os.path.join(root, folder), exist_ok=True)
        files = {
            "host/app/main.c": "",
            "host/app/new_part.c": "",
            "docs/architecture.md": "## The map of the tree\n\n### `host/app/`\n\n| name | what |\n|---|---|\n"
                                    "| `main.c` | the program |\n| `gone.c` | removed long ago |\n",
        }
        for rel, text in files.items():
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        ROOT = root
        try:
            problems = map_problems()
        finally:
            ROOT = saved
        text = "\n".join(problems)
        self.assertIn("host/app/new_part.c is not in docs/architecture.md's map: add a row | `new_part.c` |", text)
        self.assertIn("names `gone.c`, which is not a file of host/app/", text)
        self.assertIn("scripts/ has no table", text)
        self.assertNotIn("main.c is not", text)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]] + [a for a in sys.argv[1:] if a.startswith("-")])
