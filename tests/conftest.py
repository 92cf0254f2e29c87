import os

# Tests share 2 cores with whatever else runs; keep torch from oversubscribing them.
os.environ.setdefault("OMP_NUM_THREADS", "2")
