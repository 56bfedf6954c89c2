"""The implementation of fp4_dynamo_shim. Importing any of it applies nothing: ``import fp4_dynamo_shim`` (the
front), the start-up hook, the SGLang plugin and the command line each call ``lifecycle.apply(route=...)``."""

__version__ = "0.1.0"
