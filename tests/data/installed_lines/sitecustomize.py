# >>> fp4-dynamo-shim import hook >>>
# Applies fp4_dynamo_shim whenever flashinfer is imported. Written by `fp4-dynamo-shim install-hook`;
# remove with `fp4-dynamo-shim uninstall-hook` (before `pip uninstall fp4-dynamo-shim`; once the package is
# gone this block does nothing). FP4_DYNAMO_SHIM_DISABLE=1 turns it off.
try:
    import fp4_dynamo_shim_hook
    fp4_dynamo_shim_hook.install()
except Exception as _fp4_dynamo_shim_error:
    if getattr(_fp4_dynamo_shim_error, "name", None) != "fp4_dynamo_shim_hook":
        import sys
        sys.stderr.write("fp4_dynamo_shim import hook in %s: %r\n" % (__file__, _fp4_dynamo_shim_error))
# <<< fp4-dynamo-shim import hook <<<
