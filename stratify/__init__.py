"""Stratify: stratified label schedules and fine-grained model passing for non-IID FL."""

__version__ = "0.1.0"
