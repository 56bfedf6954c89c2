"""Who is importing the front package: the project's own command line, or a program.

``python -m fp4_dynamo_shim`` and ``python -m fp4_dynamo_shim.verify`` import the front package on the way to
their module, and the front applies on import. The command line must not (``--version``, ``status`` and the
hook commands apply nothing; ``verify`` applies as its own check), so the front asks here first.
"""

import sys

#: The modules ``python -m`` runs as the command line (their package is imported on the way).
COMMAND_LINE_MODULES = ("fp4_dynamo_shim", "fp4_dynamo_shim.__main__", "fp4_dynamo_shim.verify")
#: The interpreter's long options that take the next argument as their value (the others take none).
LONG_OPTIONS_WITH_A_VALUE = ("--check-hash-based-pycs",)


def running_the_command_line():
    """Whether this import is ``python -m`` locating one of :data:`COMMAND_LINE_MODULES`: while it does,
    ``sys.argv[0]`` is "-m", and the module itself is only in the interpreter's original command line."""
    return sys.argv[:1] == ["-m"] and module_after_m(getattr(sys, "orig_argv", ())[1:]) in COMMAND_LINE_MODULES


def module_after_m(arguments):
    """The module name ``python -m`` was given in ``arguments`` (the interpreter's options onwards), or None."""
    arguments = list(arguments)
    while arguments:
        argument = arguments.pop(0)
        if argument == "--" or not argument.startswith("-") or argument == "-":
            return None
        if argument.startswith("--"):
            if argument in LONG_OPTIONS_WITH_A_VALUE and arguments:
                arguments.pop(0)
            continue
        for position, flag in enumerate(argument[1:], 1):
            rest = argument[position + 1:]
            if flag == "m":
                return rest or (arguments[0] if arguments else None)
            if flag == "c":
                return None
            if flag in "XW":  # an option with a value: the rest of this argument or the next one
                if not rest and arguments:
                    arguments.pop(0)
                break
    return None
