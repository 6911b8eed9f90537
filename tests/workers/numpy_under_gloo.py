"""Calls hvn.init() under whatever launcher started it; prints the error it raises."""

import hvdtrain.adapters.numpy as hvn

try:
    hvn.init()
    print("initialised: size", hvn.size())
except RuntimeError as error:
    print("REPORT-ERROR", error)
    raise SystemExit(3) from None
