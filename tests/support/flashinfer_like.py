"""Source text for FlashInfer-like modules written by tests: the start every such module shares.

FlashInfer's declaring modules decorate their ops with ``register_custom_op`` and ``register_fake_op``, which
are no-ops when its custom ops are off (as the shim finds them); the tests' modules define them that way, so
that the scan reads the decorators as it reads FlashInfer's and executing the module leaves plain functions.
"""

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
