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
