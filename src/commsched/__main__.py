"""``python -m commsched`` (or ``python -m commsched.cli``): the command line."""

from commsched.cli import main

main()
