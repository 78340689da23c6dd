"""``python -m pantheon.cli``: what the ``pantheon`` script runs, for a child process that
must use this interpreter."""

from pantheon.cli import main

main()
