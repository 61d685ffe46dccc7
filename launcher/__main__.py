"""``python -m launcher``: the one-machine demo (same as ``fl-demo``)."""

from launcher.demo import main

main()
