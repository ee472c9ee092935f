"""Entry point: `python main.py [group=option ...] [key=value ...]` (Hydra). See README.md."""

from sepo.run.cli import main

if __name__ == "__main__":
    main()
