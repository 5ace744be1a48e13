"""Stratify: stratified label schedules and fine-grained model passing for non-IID federated learning."""

__version__ = "0.1.0"
