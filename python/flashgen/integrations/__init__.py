"""Integrations of flashgen with other libraries (imported on demand)."""
