"""Side-by-side benchmarks of xla_compat (issue 8); run with ``make bench``."""
