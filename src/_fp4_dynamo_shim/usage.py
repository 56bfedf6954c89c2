"""The command line's argument parser, apart from the exceptions: importing an error class should not load argparse."""

import argparse
import sys

from .errors import EXIT_USAGE


class UsageParser(argparse.ArgumentParser):
    """argparse with the project's exit code for usage errors (3; argparse's own 2 means "not applied" here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")
