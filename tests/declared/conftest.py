"""What the declared layer's tests share."""

from __future__ import annotations

import pytest

from _fp4_dynamo_shim import lifecycle
from _fp4_dynamo_shim.declared import declared_layer


@pytest.fixture
def own_layers(unpatched):
    """``apply(gate, **keywords)``: the layer alone, through its own ``apply`` (the shim reverted, so that no op
    name is taken), every layer it made reverted when the test ends."""
    layers = []

    def apply(gate, **keywords):
        layer = declared_layer.start(gate, lifecycle.flashinfer_version(), **keywords)
        layers.append(layer)
        return layer

    yield apply
    for layer in reversed(layers):
        declared_layer.revert(layer)
