"""Guards every surface of the HTTP service goes through, one module each."""
