"""The `stratify` command line."""
