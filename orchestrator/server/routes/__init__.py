"""The service's routes, one module per resource of the Agent Protocol."""
