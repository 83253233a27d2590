"""A module the Python scripts of this folder import, not a command: they
answer -h and --help with their own docstring before they import what may
be missing (NumPy, gguf-py, llama-cpp-python), so that a user without
those still learns what a script does and what it needs."""
import sys


def answer_help(doc):
    """Print DOC and exit 0 when the command line asks for help."""
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(doc.strip())
        sys.exit(0)
