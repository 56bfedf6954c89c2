import fp4_dynamo_shim_hook; fp4_dynamo_shim_hook.install()
