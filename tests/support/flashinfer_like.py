"""Source text for FlashInfer-like modules written by tests: the start every such module shares.

FlashInfer's declaring modules decorate their ops with ``register_custom_op`` and ``register_fake_op``, which
are no-ops when its custom ops are off (as the shim finds them); the tests' modules define them that way, so
that the scan reads the decorators as it reads FlashInfer's and executing the module leaves plain functions.
"""

import itertools
import types

_numbers = itertools.count()

NO_OP_DECORATORS = '''
import functools
import typing
import torch
from types import SimpleNamespace

def register_custom_op(name, mutates_args):
    return lambda function: function

def register_fake_op(name):
    return lambda function: function
'''


def load(template: str, stem: str):
    """(module, its declarations, its getters' namespace facts, the name suffix) of ``template`` executed as a
    fresh flashinfer module whose names carry a suffix of their own (ops are process-wide): each ``PREFIX`` in
    the template becomes ``<stem>_<n>``."""
    from _fp4_dynamo_shim.declared import scan

    prefix = f"{stem}_{next(_numbers)}"
    source = template.replace("PREFIX", prefix)
    module = types.ModuleType(f"flashinfer.{prefix}")
    module.__file__ = f"/site-packages/flashinfer/{prefix}.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    declarations, namespaces = scan.scan_source(source, module.__name__)
    return module, declarations, namespaces, prefix
