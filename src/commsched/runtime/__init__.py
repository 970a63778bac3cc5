"""commsched.runtime (see docs/ARCHITECTURE.md)."""
