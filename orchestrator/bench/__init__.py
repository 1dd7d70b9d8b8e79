"""The harness behind ``toolfleet bench``: one module per scenario, run by :mod:`.run`."""
