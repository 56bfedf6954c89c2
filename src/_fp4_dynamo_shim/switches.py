"""The project's environment variables, and the one way to read them: a leaf that imports only ``os`` and
``sys``, so that start-up code (every interpreter with the hook installed pays for its imports) can use it.

Every variable is one row of :data:`VARIABLES`, read by :func:`read` with the same rules for all of them:
surrounding whitespace and case do not matter; unset or empty means the default; any other value outside the
row's words is the default, with a problem naming the variable and the words it takes. :func:`warn` is the one
warn-once: one line per message and process.
"""

import os
import sys

#: Words that switch an on/off variable on or off.
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")

#: Set to 1 to have the import hook apply the shim in every process that imports flashinfer.
HOOK = "FP4_DYNAMO_SHIM"
#: Set to 1 to switch the shim off on every route (import, hook, sitecustomize, plugin).
DISABLE = "FP4_DYNAMO_SHIM_DISABLE"
#: Set to 1 to turn every refusal (unsupported FlashInfer, failed apply, unknown values) into an exception.
STRICT = "FP4_DYNAMO_SHIM_STRICT"
#: ``torch`` (default), ``nvcc`` or an explicit ``X.Y``: the CUDA version FlashInfer's JIT sees.
CUDA_VERSION = "FP4_DYNAMO_SHIM_CUDA_VERSION"
#: What to do on a GPU without the FP4 kernel (SM < 100): ``error`` (default), ``reference``, or
#: ``launch`` (launch FlashInfer's empty kernel anyway; outputs are uninitialized: benchmarks only).
FALLBACK = "FP4_DYNAMO_SHIM_FALLBACK"
#: Which of FlashInfer's own declared ops become real ops: ``proven`` (default: what SGLang's traced paths call raw and
#: what a GPU run proved for the installed release), ``sglang`` (only the former), ``all``, or ``off``.
FLASHINFER_OPS = "FP4_DYNAMO_SHIM_FLASHINFER_OPS"


class Variable:
    """One environment variable: the setting it holds, its words, its default, and how a value outside the words
    is described."""

    def __init__(self, name, setting, words, default, accepted, pattern=None):
        self.name, self.setting, self.words, self.default = name, setting, words, default
        self.accepted, self.pattern = accepted, pattern

    def parse(self, raw):
        """(value, problem) for the raw text of the variable (None when unset)."""
        value = (raw or "").strip().lower()
        if not value:
            return self.default, None
        if value in self.words:
            return self.words[value], None
        if self.pattern is not None and __import__("re").fullmatch(self.pattern, value):
            return value, None
        return self.default, (f"{self.name}={raw!r} is not understood; use {self.accepted} "
                              f"(treated as {_spoken(self.default)})")


def _spoken(value):
    return {True: "on", False: "off"}.get(value, value)


def _switch(name, setting):
    words = {**{word: True for word in TRUE}, **{word: False for word in FALSE}}
    return Variable(name, setting, words, False,
                    "1, true, yes or on to switch it on, or 0, false, no, off or unset for off")


def _choice(name, setting, choices, pattern=None, accepted=None):
    return Variable(name, setting, {choice: choice for choice in choices}, choices[0],
                    accepted or f"one of {', '.join(choices)}", pattern)


#: Every variable, with the name of the setting (``settings.Settings`` field) it holds.
VARIABLES = {variable.name: variable for variable in (
    _switch(HOOK, "hook"),
    _switch(DISABLE, "disabled"),
    _switch(STRICT, "strict"),
    _choice(FALLBACK, "fallback", ("error", "reference", "launch")),
    _choice(CUDA_VERSION, "cuda_version", ("torch", "nvcc"), pattern=r"\d+\.\d+(\.\d+)?",
            accepted="torch, nvcc or a version like 12.8"),
    _choice(FLASHINFER_OPS, "flashinfer_ops", ("proven", "sglang", "all", "off")),
)}


def read(name, environ=None):
    """(value, problem) of the variable ``name`` in ``environ`` (``os.environ`` by default)."""
    return VARIABLES[name].parse((os.environ if environ is None else environ).get(name))


#: The warnings printed in this process (one warning per message).
warned = set()


def warn(message):
    """One warning per message and process (see :func:`say`). Returns whether it was printed now."""
    if message in warned:
        return False
    warned.add(message)
    say(message)
    return True


def say(message, level="warning"):
    """To the ``fp4_dynamo_shim`` logger when logging is configured, else on stderr with the project's name in
    front: a line said at start-up, or before SGLang sets up its logging in a scheduler, is never lost."""
    import logging

    logger = logging.getLogger("fp4_dynamo_shim")
    if logger.hasHandlers():
        logger.log(logging.getLevelName(level.upper()), message)
    else:
        sys.stderr.write(f"{message}\n" if message.startswith("fp4_dynamo_shim") else f"fp4_dynamo_shim: {message}\n")
