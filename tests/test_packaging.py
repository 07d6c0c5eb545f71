"""Generated files stay out of git; the compiled core is the one built from ext/."""

import glob
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
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
