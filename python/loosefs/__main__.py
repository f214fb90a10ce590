"""`python -m loosefs ARGS`: the loosefs command line."""
import os
import sys

from . import binary


def main() -> None:
    exe = binary()
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
