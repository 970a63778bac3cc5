"""commsched.sim (see docs/ARCHITECTURE.md)."""
