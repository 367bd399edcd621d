"""What every layer shares: the one Registry, the error types, the run folder's contract
(rundir.py), atomic files and bounded reads, provenance, the variant axes and probe names
declared once, the ceilings on counts, and the cache folder. Most of it is standard library
only, so that analysis/ reads run folders without torch."""
