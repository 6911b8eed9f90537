"""One module per framework, each a thin layer over Horovod's own integration.

Import the one you use (for example ``import hvdtrain.adapters.torch as hvt``);
importing this package imports no framework.
"""
