"""`python -m trainforge ...` is the same as the `trainforge` command."""
from trainforge.cli import main

main()
