"""Drafters: where draft tokens come from."""

from recallspec.drafters.base import (
    Drafter,
    available_drafters,
    create_drafter,
    register_drafter,
)

__all__ = ["Drafter", "available_drafters", "create_drafter", "register_drafter"]
