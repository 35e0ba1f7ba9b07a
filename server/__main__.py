"""`python -m server`: see `server.entrypoints.cli`."""

from server.entrypoints.cli import main

if __name__ == "__main__":
    main()
