"""infrarsi."""
