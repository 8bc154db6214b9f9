"""Public API: generated stubs of proto/inferix/v1."""
