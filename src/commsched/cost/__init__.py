"""Cost model: per-node seconds from hardware profiles (compute roofline, NCCL-like collectives, calibration)."""

from commsched.cost.model import CostEstimate, LinkClass

__all__ = ["CostEstimate", "LinkClass"]
