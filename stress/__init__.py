"""`poolserve stress`: the seven-layer acceptance test, driven over HTTP against a running stack."""
