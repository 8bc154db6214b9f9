"""Generated gRPC stubs of the inferix.v1 API (`make proto`); do not edit."""
