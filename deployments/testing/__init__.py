"""Fakes of the backends and tiny random models, for the tests and the benchmarks."""
