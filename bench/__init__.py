"""Side-by-side benchmarks (``make bench``); never part of CI."""
