"""`python -m sepo ...`: the `sepo` console script, for an environment whose scripts directory is not
on PATH or to name the interpreter explicitly (`/path/to/venv/bin/python -m sepo ...`)."""

from sepo.run.cli import main

if __name__ == "__main__":
    main()
