"""Helpers the test suites share: fleets, servers, Compose (test modules never import
each other)."""
