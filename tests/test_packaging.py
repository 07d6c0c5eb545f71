"""Generated files stay out of git; the compiled core is the one built from ext/; the source
release carries what building and the quick start need; every imported library is declared."""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None or not os.path.exists(os.path.join(ROOT, ".git")),
                    reason="not a git checkout")
def test_generated_c_html_and_shared_objects_are_ignored():
    sources = sorted(glob.glob(os.path.join(ROOT, "ext", "*.pyx")))
    assert sources
    generated = []
    for pyx in sources:
        stem = os.path.splitext(os.path.relpath(pyx, ROOT))[0]
        generated += [stem + ".c", stem + ".html", f"aisim/_core/{os.path.basename(stem)}.cpython-311-x86_64-linux-gnu.so"]
    ignored = _git("check-ignore", *generated).stdout.split()
    assert sorted(ignored) == sorted(generated)
    tracked = _git("ls-files").stdout.split()
    assert not [f for f in tracked if f.endswith((".so", ".c", ".html")) and not f.startswith("tests/data/")]


def test_every_extension_module_is_built():
    import importlib

    for pyx in glob.glob(os.path.join(ROOT, "ext", "*.pyx")):
        name = os.path.splitext(os.path.basename(pyx))[0]
        assert importlib.import_module(f"aisim._core.{name}").__name__ == f"aisim._core.{name}"


def test_every_package_is_installed():
    """Every package under aisim/ is in pyproject's package list (and nothing that is not one)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        listed = tomllib.load(fh)["tool"]["setuptools"]["packages"]
    found = {"aisim"} | {"aisim." + os.path.basename(os.path.dirname(p))
                         for p in glob.glob(os.path.join(ROOT, "aisim", "*", "__init__.py"))}
    assert sorted(set(listed) - {"aisim.sql"}) == sorted(found)  # aisim.sql is sql/ (package-dir)


def _sql_files():
    root = os.path.join(ROOT, "sql")
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "**", "*.sql"), recursive=True))


def test_sql_library_ships_in_the_wheel_and_the_sdist(tmp_path):
    """The top-level sql/ installs as aisim.sql with every .sql file, in the wheel and the sdist.

    The wheel's pure-Python part is what ``build_py`` lays out (compiling the
    core is left out to keep this fast); the sdist is built whole.
    """
    import sys
    import tarfile

    files = _sql_files()
    assert "schema.sql" in files and "sweep/goodput.sql" in files and len(files) >= 18
    env = dict(os.environ, AISIM_CYTHON_DEBUG="")
    lib, dist = tmp_path / "lib", tmp_path / "dist"
    for args in (["build_py", "--build-lib", str(lib)], ["sdist", "--dist-dir", str(dist)]):
        res = subprocess.run([sys.executable, "setup.py", "-q", *args], cwd=ROOT, capture_output=True, text=True,
                             env=env)
        assert res.returncode == 0, res.stderr[-2000:]
    wheel = sorted(os.path.relpath(p, lib / "aisim" / "sql")
                   for p in glob.glob(str(lib / "aisim" / "sql" / "**" / "*.sql"), recursive=True))
    assert wheel == files and (lib / "aisim" / "sql" / "__init__.py").is_file()
    (sdist,) = dist.glob("aisim-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    top = names[0].split("/")[0]
    assert sorted(n[len(top) + 5:] for n in names if n.startswith(f"{top}/sql/") and n.endswith(".sql")) == files
    assert f"{top}/sql/__init__.py" in names
    inside = {n[len(top) + 1:] for n in names if n.startswith(f"{top}/")}
    # The core's sources, never the C generated from them (the install cythonizes again).
    ext = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "ext", "*.p*"))}
    assert {".pyx", ".pxd", ".pxi"} == {os.path.splitext(p)[1] for p in ext}
    assert {n for n in inside if n.startswith("ext/") and not n.endswith("/")} == ext
    # What the quick start and a bundled replay need.
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "examples/engine.json",
                 "examples/trace.jsonl", "pipelines/demo.toml", "pipelines/README.md"):
        assert name in inside, name
    assert not [n for n in inside if n.endswith((".c", ".so", ".duckdb", ".pyc", "-best.toml",
                                                 "-best-deployment.toml"))]


def _imported_top_level_modules(root):
    """Top-level names of every module imported anywhere under ``root`` (also inside functions)."""
    import ast

    found = set()
    for path in glob.glob(os.path.join(root, "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def _canonical(name):
    """A distribution's name as PEP 503 compares names."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(reqs):
    import re

    return {_canonical(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def test_every_imported_library_is_declared():
    """The package's third-party imports are exactly its declared dependencies."""
    import sys
    import tomllib
    from importlib.metadata import packages_distributions

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        doc = tomllib.load(fh)
    project = doc["project"]
    modules = set()
    for root in ("aisim", "sql"):
        modules |= _imported_top_level_modules(os.path.join(ROOT, root))
    third_party = sorted(m for m in modules if m not in sys.stdlib_module_names and m not in ("aisim", "__future__"))
    dists = packages_distributions()
    imported = {_canonical(d) for m in third_party for d in dists[m]}
    assert imported == _requirement_names(project["dependencies"])
    assert third_party == ["click", "dask", "distributed", "duckdb", "fsspec", "numpy", "pyarrow", "rich", "tomli_w",
                           "yaml"]
    test_modules = _imported_top_level_modules(os.path.join(ROOT, "tests"))
    assert {"pytest", "hypothesis"} <= test_modules
    # The packaging tests run setup.py themselves, so the test extras carry the build's own requirements.
    # The same requirement strings, so the two cannot drift apart.
    build = doc["build-system"]["requires"]
    assert _requirement_names(build) == {"setuptools", "cython"}
    test = project["optional-dependencies"]["test"]
    assert set(build) <= set(test)
    assert _requirement_names(test) == {"pytest", "hypothesis"} | _requirement_names(build)


def test_license_is_an_spdx_expression():
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        doc = tomllib.load(fh)
    assert doc["project"]["license"] == "Apache-2.0"
