"""Drafters: where draft tokens come from (``base``: the interface; ``registry``: names)."""

from recallspec.drafters.base import Drafter
from recallspec.drafters.registry import available_drafters, create_drafter

__all__ = ["Drafter", "available_drafters", "create_drafter"]
