"""commsched.passes (see docs/ARCHITECTURE.md)."""
