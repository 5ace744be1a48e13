"""Comparison methods, each a strategy of the Stratify router."""
