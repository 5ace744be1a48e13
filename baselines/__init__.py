"""Comparison methods, each a strategy run by the same engine as Stratify."""
