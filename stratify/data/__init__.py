"""Datasets, partitions and heterogeneity metrics."""
