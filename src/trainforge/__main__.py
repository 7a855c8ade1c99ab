"""`python -m trainforge ...` is the same as the `trainforge` command."""
from trainforge.cli import main

if __name__ == "__main__":  # multiprocessing's forkserver re-imports the main module: it must not run the CLI
    main()
