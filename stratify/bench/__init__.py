"""Benchmarks as library functions: each takes its settings and returns a result object
that the command line prints and writes as JSON (docs/architecture.md, "Benchmarks")."""
